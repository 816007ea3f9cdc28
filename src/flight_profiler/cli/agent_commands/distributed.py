"""`torch fr`: the rank's Flight Recorder (collective sequence ids per process group)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flight_profiler.cli.agent_commands.base import fmt, txt

if TYPE_CHECKING:
    from rich.console import Console


def render_fr(data: dict[str, Any], console: Console) -> None:
    if not data.get("enabled"):
        console.print(f"Flight Recorder off: {txt(data.get('reason'))} "
                      "(start the job with TORCH_FR_BUFFER_SIZE=2000)", highlight=False)
        return
    for pg, seq in sorted((data.get("last_enqueued") or {}).items()):
        console.print(f"process group {txt(pg, 200)}: last collective enqueued #{fmt(seq, 'd')}",
                      highlight=False)
    for e in (data.get("entries") or [])[-5:]:
        console.print(f"  #{fmt(e.get('seq'), 'd')} pg {txt(e.get('pg_id'), 200)}: "
                      f"{txt(e.get('op'), 200)} ({txt(e.get('state'), 80)})", highlight=False)
