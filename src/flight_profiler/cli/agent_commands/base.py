"""How the CLI shows an agent command's answers: renderers by the request's handler name."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from rich.console import Console

# Renderers get the JSON data the agent sent and a console to print on (human output only;
# with --json the CLI prints the data itself).
Renderer = Callable[[dict[str, Any], "Console"], None]


def render_json(data: dict[str, Any], console: Console) -> None:
    console.print_json(json.dumps(data, default=str))


@dataclass
class Rendering:
    result: Renderer = render_json
    event: Renderer | None = None  # set for streaming commands
