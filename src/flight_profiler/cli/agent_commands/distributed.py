"""`torch fr`: the rank's Flight Recorder (collective sequence ids per process group)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def render_fr(data: dict[str, Any], console: Console) -> None:
    from rich.markup import escape

    if not data.get("enabled"):
        console.print(f"Flight Recorder off: {escape(str(data.get('reason')))} "
                      "(start the job with TORCH_FR_BUFFER_SIZE=2000)", highlight=False)
        return
    for pg, seq in sorted(data.get("last_enqueued", {}).items()):
        console.print(f"process group {escape(pg)}: last collective enqueued #{seq}", highlight=False)
    for e in data.get("entries", [])[-5:]:
        console.print(f"  #{e.get('seq')} pg {e.get('pg_id')}: {escape(str(e.get('op')))} "
                      f"({escape(str(e.get('state')))})", highlight=False)
