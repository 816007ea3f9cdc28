"""What a parsed agent command is: the request to send and how to show its answers."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from rich.console import Console

# Renderers get the JSON data the agent sent and a console to print on (human output only;
# with --json the CLI prints the data itself).
Renderer = Callable[[dict[str, Any], "Console"], None]


def render_json(data: dict[str, Any], console: Console) -> None:
    console.print_json(json.dumps(data, default=str))


@dataclass
class AgentRequest:
    cmd: str  # the agent's handler name (registry.HANDLERS)
    args: dict[str, Any] = field(default_factory=dict)
    render_result: Renderer = render_json
    render_event: Renderer | None = None  # set for streaming commands
    # Optional CLI-side step after the result arrives (e.g. print where a file was written).
    after: Callable[[dict[str, Any]], None] | None = None


def target_args(words: tuple[str, ...] | list[str], nested: str | None = None) -> dict[str, Any]:
    """``module [class] method`` as typed -> the ``target`` argument every hooking command sends.

    Accepted: ``mod func``, ``mod Class meth`` and ``mod Class.meth``; ``nested`` (``-nm``) names a
    function defined inside ``method``.
    """
    from flight_profiler.method_spec import split_method_words

    module, cls, method = split_method_words(words)
    return {"module": module, "class": cls, "method": method, "nested": nested}
