"""Builders and grammar of `arm` and `disarm`: triggers left in the agent (docs/arm.md).

Sizes and durations are read here, where a typo gets one line naming it: ``--for 2h``,
``--rss-limit 12G``, ``--max-bytes 500M``.
"""

from __future__ import annotations

import os
import re
from typing import Any

import click
from click.core import ParameterSource

from flight_profiler.requests.base import AgentRequest, Line, number

KINDS = ("hang", "nan", "oom", "slow")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TIMES = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_size(text: str) -> int:
    """``12G``, ``500M``, ``4096`` -> bytes (binary units; a trailing B or iB is allowed)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise ValueError(f"{text!r} is not a size (e.g. 500M, 12G)")
    value = int(float(m.group(1)) * _UNITS[m.group(2)])
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive size")
    return value


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1d`` -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text.lower())
    if not m:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 30m, 2h)")
    value = float(m.group(1)) * _TIMES[m.group(2)]
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return value


def parse_factor(text: str) -> float:
    """``3``, ``2.5``, ``3x`` -> a factor above 1."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*x?\s*", text.lower())
    if not m or float(m.group(1)) <= 1.0:
        raise ValueError(f"{text!r} is not a FACTOR above 1 (e.g. 3: a step 3x the median)")
    return float(m.group(1))


def arm(on: str, out: str, seconds: float | None = None, max_fires: int | None = None,
        duration: float | None = None, rss_limit: int | None = None, max_bytes: int | None = None,
        threads: str | None = None, factor: float | None = None,
        steps: int | None = None) -> AgentRequest:
    """Leave a trigger in the agent; ``out`` is made absolute here (the agent's cwd differs)."""
    if on not in KINDS:
        raise ValueError(f"unknown trigger {on!r}: one of {', '.join(KINDS)}")
    if on == "hang" and seconds is None:
        raise ValueError("--on hang needs SECONDS, e.g. --on hang 600")
    if on != "hang" and seconds is not None:
        raise ValueError(f"--on {on} takes no SECONDS")
    if on == "slow" and factor is None:
        raise ValueError("--on slow needs FACTOR, e.g. --on slow 3 (a step 3x the median)")
    if on != "slow" and (factor is not None or steps is not None):
        raise ValueError("FACTOR and --steps go with --on slow")
    if rss_limit is not None and on != "oom":
        raise ValueError("--rss-limit goes with --on oom")
    if threads is not None and on != "hang":
        raise ValueError("--threads goes with --on hang")
    out = os.path.abspath(out)
    args: dict[str, Any] = {"on": on, "out": out}
    line = Line("arm").option("--on", on)
    if seconds is not None:
        args["seconds"] = float(seconds)
        line.extend(number(seconds))
    if factor is not None:
        args["factor"] = float(factor)
        line.extend(number(factor))
    line.option("--out", out)
    for key, flag, value in (("max_fires", "--max-fires", max_fires), ("for", "--for", duration),
                             ("rss_limit", "--rss-limit", rss_limit),
                             ("max_bytes", "--max-bytes", max_bytes), ("threads", "--threads", threads),
                             ("steps", "--steps", steps)):
        if value is not None:
            args[key] = value
            line.option(flag, number(value) if isinstance(value, float) else value)
    return AgentRequest("arm", args, str(line))


def disarm(on: str | None = None) -> AgentRequest:
    if on is not None and on not in KINDS:
        raise ValueError(f"unknown trigger {on!r}: one of {', '.join(KINDS)}")
    return AgentRequest("disarm", {"on": on} if on else {}, str(Line("disarm").option("--on", on)))


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    try:
        return None if value is None else parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    try:
        return None if value is None else parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _given(ctx: click.Context, name: str) -> Any:
    source = ctx.get_parameter_source(name)
    return None if source is ParameterSource.DEFAULT else ctx.params.get(name)


@click.command(name="arm", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--on", "on", type=click.Choice(KINDS), required=True,
              help="What to catch: hang SECONDS (no progress for that long), nan (first "
                   "non-finite gradient after an optimizer step), oom (out of memory), slow FACTOR "
                   "(a step FACTOR x the running median: profile the next --steps).")
@click.argument("value", required=False, metavar="[SECONDS|FACTOR]")
@click.option("--out", "out", required=True, metavar="DIR",
              help="Directory for the evidence (one directory per event), writable by the job's user.")
@click.option("--max-fires", type=click.IntRange(1, 1000), default=1, show_default=True,
              help="Disarm after this many events.")
@click.option("--for", "duration", callback=_duration, metavar="DURATION",
              help="Disarm after this long (e.g. 8h). Default: until disarm or detach.")
@click.option("--rss-limit", callback=_size, metavar="SIZE",
              help="oom: fire when the job's RSS passes SIZE (e.g. 12G).")
@click.option("--max-bytes", callback=_size, metavar="SIZE",
              help="Cap on the evidence in DIR (default 512M): once reached, newer events are "
                   "dropped, the oldest kept.")
@click.option("--threads", type=click.Choice(("main", "all")),
              help="hang: watch the main thread (default) or every thread (fire when none moves).")
@click.option("--steps", type=click.IntRange(1, 50), metavar="N",
              help="slow: profile this many steps after the slow one (default 3).")
@click.pass_context
def arm_command(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """Leave a trigger in the job that writes evidence when it fires.

    \b
    Examples:
      arm --on hang 600 --out /tmp/fp-evidence
      arm --on nan --out /tmp/fp-evidence --for 8h
      arm --on oom --rss-limit 12G --out /tmp/fp-evidence
      arm --on slow 3 --steps 5 --out /tmp/fp-evidence
    The trigger outlives this command: `status` lists it, `disarm` or `detach` removes it.
    `flight_profiler report DIR` diagnoses what it wrote.
    """
    p = ctx.params
    value, seconds, factor = p["value"], None, None
    try:
        if value is not None and p["on"] == "slow":
            factor = parse_factor(value)
        elif value is not None:
            seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param_hint="FACTOR" if p["on"] == "slow"
                                 else "SECONDS") from None
    try:
        return arm(p["on"], p["out"], seconds=seconds, max_fires=_given(ctx, "max_fires"),
                   duration=p["duration"], rss_limit=p["rss_limit"], max_bytes=p["max_bytes"],
                   threads=p["threads"], factor=factor, steps=p["steps"])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@click.command(name="disarm", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--on", "on", type=click.Choice(KINDS), help="Only the triggers of this kind.")
@click.pass_context
def disarm_command(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """Remove armed triggers (all, or those of --on KIND) and their hooks."""
    return disarm(ctx.params["on"])
