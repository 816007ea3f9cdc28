"""Agent requests as plain data: typed builders (one per agent command) and the command-line
grammar, shared by the CLI, the shell, diagnose and the Python API.

```python
from flight_profiler import requests
req = requests.hooks.watch(["__main__", "train_step"], expr="cost", count=3)
req.cmd, req.args, req.line   # "watch", {...}, "watch __main__ train_step --expr cost -n 3"
assert requests.parse(req.line) == req
```

Nothing here renders or prints results (that is the CLI's job, by the request's ``cmd``).
"""

from __future__ import annotations

from flight_profiler.requests.base import AgentRequest

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)

if TYPE_CHECKING:
    from typing import Any

    from flight_profiler.requests import basic, hooks, torch
    from flight_profiler.requests.grammar import COMMANDS, HelpShown, help_text, parse, summary

# The grammar needs click: imported on first use, so that `import flight_profiler.api` and the
# builders stay as cheap as they were (click costs ~15 ms).
_GRAMMAR = {"COMMANDS", "HelpShown", "help_text", "parse", "summary"}
# The builders too: a command to a running agent needs one module of them (issue 23).
_BUILDERS = {"basic", "hooks", "torch"}


def __getattr__(name: str) -> Any:
    if name in _BUILDERS:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    if name in _GRAMMAR:
        from flight_profiler.requests import grammar

        return getattr(grammar, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["COMMANDS", "AgentRequest", "HelpShown", "basic", "help_text", "hooks",
           "parse", "summary", "torch"]
