"""`arm`, `disarm`, and the armed triggers `status` lists."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flight_profiler.cli.agent_commands.base import fmt, txt

if TYPE_CHECKING:
    from rich.console import Console


def _params(trigger: dict[str, Any]) -> str:
    params = trigger.get("params") or {}
    return ", ".join(f"{txt(k, 40)}={txt(v, 80)}" for k, v in params.items() if v is not None)


def trigger_line(trigger: dict[str, Any]) -> str:
    text = (f"{txt(trigger.get('kind'), 20)} \\[{txt(trigger.get('state'), 20)}]"
            + (f" ({_params(trigger)})" if _params(trigger) else "")
            + f", fired {fmt(trigger.get('fires'), 'd')}/{fmt(trigger.get('max_fires'), 'd')}")
    if trigger.get("dropped"):
        text += f", {fmt(trigger['dropped'], 'd')} dropped (disk cap)"
    if trigger.get("expires_in_s") is not None:
        text += f", expires in {fmt(trigger['expires_in_s'], '.0f')} s"
    return text


def render_trigger_list(arm: dict[str, Any], console: Console) -> None:
    armed = arm.get("armed") or []
    console.print(f"[bold]armed triggers[/bold]: {len(armed) or 'none'}", highlight=False)
    for trigger in armed:
        console.print(f"  {trigger_line(trigger)}", highlight=False)
        for event in trigger.get("events") or []:
            console.print(f"    evidence: {txt(event)}", highlight=False)
    for trigger in (arm.get("disarmed") or [])[-5:]:
        console.print(f"  [dim]was {trigger_line(trigger)}[/dim]", highlight=False)
        for event in trigger.get("events") or []:
            console.print(f"    evidence: {txt(event)}", highlight=False)
    if arm.get("hooks_pending_removal"):
        console.print("  hooks still being removed (a thread is inside optimizer.step())",
                      highlight=False)


def render_arm(data: dict[str, Any], console: Console) -> None:
    trigger = data.get("armed") or {}
    console.print(f"armed in pid {fmt(data.get('pid'), 'd')}: {trigger_line(trigger)}", highlight=False)
    console.print(f"  evidence goes to {txt(data.get('out'))} (cap "
                  f"{fmt((data.get('cap_bytes') or 0) / 2**20, '.0f')} MiB; over it, newer events "
                  "are dropped and the oldest kept)", highlight=False)
    for note in data.get("notes") or []:
        console.print(f"  {txt(note)}", highlight=False)
    console.print("  it stays after this command exits: `status` lists it, `disarm` removes it; "
                  "`flight_profiler report DIR` reads the evidence", highlight=False)


def render_disarm(data: dict[str, Any], console: Console) -> None:
    removed = data.get("disarmed") or []
    console.print(f"disarmed {len(removed)} trigger(s)", highlight=False)
    for trigger in removed:
        console.print(f"  {trigger_line(trigger)}", highlight=False)
        for left in trigger.get("left_behind") or []:
            console.print(f"    left behind: {txt(left)}", highlight=False)
    still = (data.get("still_armed") or {}).get("armed") or []
    if still:
        console.print(f"{len(still)} still armed", highlight=False)
