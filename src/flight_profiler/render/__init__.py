"""Views of results (rich, Markdown, HTML); no analysis happens here.

``formats`` is the one way a report becomes text or a file (md, json, html); report/ never
imports this package, so a report cannot render itself.
"""
