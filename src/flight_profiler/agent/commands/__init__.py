"""One module per command family; each exposes handler functions named in registry.HANDLERS."""
