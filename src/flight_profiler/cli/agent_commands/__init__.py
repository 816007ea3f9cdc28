"""How the CLI shows the answers of the commands that run inside the agent.

What to send is built outside cli/ (flight_profiler.requests: builders and the command
grammar); here each handler name maps to its renderers. Modules are imported on first use.
"""

from __future__ import annotations

import importlib

from flight_profiler.cli.agent_commands.base import Rendering

# handler name -> (module of this package, result renderer, event renderer or None)
RENDERERS: dict[str, tuple[str, str, str | None]] = {
    "status": ("basic", "render_status", None),
    "stack": ("basic", "render_stack", None),
    "detach": ("basic", "render_detach", None),
    "torch memory": ("torch", "render_memory", "render_progress"),
    "torch tensors": ("torch", "render_tensors", "render_progress"),
    "torch profile": ("torch", "render_profile", "render_progress"),
    "torch dataloader": ("torch", "render_dataloader", None),
    "torch fr": ("distributed", "render_fr", None),
    "torch grads": ("torch_health", "render_grads", "render_progress"),
    "torch anomaly": ("torch_health", "render_anomaly", "render_progress"),
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
    module_name, result, event = RENDERERS[cmd]
    module = importlib.import_module(f"{__name__}.{module_name}")
    return Rendering(getattr(module, result), getattr(module, event) if event else None)
