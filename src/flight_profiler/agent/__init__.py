"""The agent: runs INSIDE the target process.

Standard library only; torch is imported lazily inside handlers, and only if the target has
already imported it. All imports inside this package are relative, because the bootstrap loads it
under a private module name (``_flight_profiler_agent``) without putting the CLI's environment on
the target's ``sys.path``.
"""
