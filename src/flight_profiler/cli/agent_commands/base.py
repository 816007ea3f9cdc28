"""What a parsed agent command is: the request to send and how to show its answers."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from rich.console import Console

# Renderers get the JSON data the agent sent and a console to print on (human output only;
# with --json the CLI prints the data itself).
Renderer = Callable[[dict[str, Any], "Console"], None]


def render_json(data: dict[str, Any], console: "Console") -> None:
    console.print_json(json.dumps(data, default=str))


@dataclass
class AgentRequest:
    cmd: str  # the agent's handler name (registry.HANDLERS)
    args: dict[str, Any] = field(default_factory=dict)
    render_result: Renderer = render_json
    render_event: Optional[Renderer] = None  # set for streaming commands
    # Optional CLI-side step after the result arrives (e.g. print where a file was written).
    after: Optional[Callable[[dict[str, Any]], None]] = None
