"""How the CLI shows the answers of the commands that run inside the agent.

What to send is built outside cli/ (flight_profiler.requests: builders and the command
grammar); here each handler name maps to its renderers. Modules are imported on first use.
"""

from __future__ import annotations

import importlib

from flight_profiler.cli.agent_commands.base import Rendering

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from flight_profiler.cli.agent_commands.base import Renderer

_PROGRESS = "torch:render_progress"
# handler name -> ("module:function" of the result renderer, of the event renderer or None)
RENDERERS: dict[str, tuple[str, str | None]] = {
    "status": ("basic:render_status", None),
    "stack": ("basic:render_stack", None),
    "detach": ("basic:render_detach", None),
    "torch memory": ("torch:render_memory", _PROGRESS),
    "torch tensors": ("torch:render_tensors", _PROGRESS),
    "torch profile": ("torch:render_profile", _PROGRESS),
    "torch dataloader": ("torch:render_dataloader", None),
    "torch fr": ("distributed:render_fr", None),
    "torch grads": ("torch_health:render_grads", _PROGRESS),
    "torch anomaly": ("torch_health:render_anomaly", _PROGRESS),
    "arm": ("arm:render_arm", None),
    "disarm": ("arm:render_disarm", None),
}
# Streams whose renderers share state (a spinner between events): made afresh per request.
_STATEFUL = {"watch": "watch", "trace": "trace"}


def rendering(cmd: str) -> Rendering:
    """The renderers for one request of handler ``cmd`` (JSON for a handler without any)."""
    if cmd in _STATEFUL:
        from flight_profiler.cli.agent_commands.watch import Spinner

        module = importlib.import_module(f"{__name__}.{_STATEFUL[cmd]}")
        render_event, render_result = module.make_renderers(Spinner())
        return Rendering(render_result, render_event)
    if cmd not in RENDERERS:
        return Rendering()
    result, event = RENDERERS[cmd]
    return Rendering(_load(result), _load(event) if event else None)


def _load(where: str) -> Renderer:
    module_name, attr = where.split(":")
    renderer: Renderer = getattr(importlib.import_module(f"{__name__}.{module_name}"), attr)
    return renderer
