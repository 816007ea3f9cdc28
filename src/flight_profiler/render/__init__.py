"""Views of results (rich, Markdown, HTML); no analysis happens here."""
