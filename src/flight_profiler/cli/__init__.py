"""Click commands only: parse, call a service, render. Heavy imports stay inside commands."""
