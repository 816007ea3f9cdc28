"""`arm` and `disarm`: triggers that outlive the request (agent/triggers/).

``arm`` validates its arguments, opens the output directory (as the job's user: the agent runs
in the job), installs one trigger and returns at once; the trigger stays until ``disarm``,
``detach``, its ``--for`` expiry or its ``--max-fires``.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from ..protocol import ERR_USAGE
from ..registry import CommandError, Context
from ..triggers import capture
from ..triggers.armory import ARMORY
from ..triggers.base import Trigger
from ..triggers.evidence import EvidenceDir, EvidenceError

KINDS = ("hang", "nan", "oom", "slow")
MAX_SLOW_STEPS = 50
DEFAULT_CAP = 512 * 1024 * 1024
_MAX_TRIGGERS = 16


def _number(args: dict[str, Any], key: str, low: float, default: float | None = None) -> float | None:
    value = args.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < low:
        raise CommandError(f"arm: {key} must be a number >= {low:g}, not {value!r}", "", ERR_USAGE)
    return float(value)


def _trigger(kind: str, args: dict[str, Any], out: EvidenceDir, max_fires: int) -> Trigger:
    rank = capture.rank_info()
    if kind == "hang":
        from ..triggers.hang import HangTrigger

        seconds = _number(args, "seconds", 1.0)
        if seconds is None:
            raise CommandError("arm --on hang needs SECONDS", "e.g. arm --on hang 600 --out DIR",
                               ERR_USAGE)
        threads = args.get("threads", "main")
        if threads not in ("main", "all"):
            raise CommandError(f"arm: threads must be main or all, not {threads!r}", "", ERR_USAGE)
        return HangTrigger(out, max_fires, rank, seconds, str(threads))
    if kind == "slow":
        from ..profile_window import all_threads_config
        from ..triggers.slow import SlowTrigger

        factor = _number(args, "factor", 1.0)
        if factor is None or factor <= 1.0:
            raise CommandError("arm --on slow needs FACTOR above 1", "e.g. arm --on slow 3 --out DIR",
                               ERR_USAGE)
        steps = int(_number(args, "steps", 1.0, 3.0) or 3)
        if steps > MAX_SLOW_STEPS:
            raise CommandError(f"arm: --steps is at most {MAX_SLOW_STEPS}", "", ERR_USAGE)
        if all_threads_config(sys.modules["torch"]) is None:
            raise CommandError("arm --on slow: this torch cannot profile all threads",
                               "a newer torch has profile_all_threads", ERR_USAGE)
        return SlowTrigger(out, max_fires, rank, factor, steps)
    if kind == "nan":
        from ..triggers.nan import NanTrigger

        return NanTrigger(out, max_fires, rank)
    from ..triggers.oom import OomTrigger

    limit = _number(args, "rss_limit", 1.0)
    return OomTrigger(out, max_fires, rank, int(limit) if limit else None)


def handle_arm(ctx: Context) -> dict[str, Any]:
    args = ctx.args
    kind = args.get("on")
    if kind not in KINDS:
        raise CommandError(f"arm: unknown trigger {kind!r}", f"one of: {', '.join(KINDS)}", ERR_USAGE)
    path = args.get("out")
    if not isinstance(path, str) or not path.startswith("/"):
        raise CommandError("arm needs --out DIR (an absolute path)", "", ERR_USAGE)
    max_fires = int(_number(args, "max_fires", 1.0, 1.0) or 1)
    duration = _number(args, "for", 1.0)
    cap = int(_number(args, "max_bytes", 4096.0, DEFAULT_CAP) or DEFAULT_CAP)
    if kind == "nan" and "torch" not in sys.modules:
        raise CommandError("arm --on nan: the job has not imported torch", "", ERR_USAGE)
    if kind == "slow" and "torch.optim.optimizer" not in sys.modules:
        raise CommandError("arm --on slow: the job has not imported torch.optim (no step to time)",
                           "", ERR_USAGE)
    if len(ARMORY.triggers) >= _MAX_TRIGGERS:
        raise CommandError(f"{_MAX_TRIGGERS} triggers are armed already", "disarm some first")
    try:
        out = EvidenceDir(path, cap)
    except EvidenceError as exc:
        raise CommandError(str(exc), "choose a directory the job's user can write") from None
    try:
        trigger = _trigger(str(kind), args, out, max_fires)
        notes = ARMORY.arm(trigger, ctx.agent, duration)
    except RuntimeError as exc:
        out.close()
        raise CommandError(f"arm: {exc}", "retry in a moment") from None
    except BaseException:
        out.close()
        raise
    return {"armed": trigger.describe(), "notes": notes, "out": out.path,
            "for_s": duration, "cap_bytes": cap, "pid": os.getpid()}


def handle_disarm(ctx: Context) -> dict[str, Any]:
    kind = ctx.args.get("on")
    if kind is not None and kind not in KINDS:
        raise CommandError(f"disarm: unknown trigger {kind!r}", f"one of: {', '.join(KINDS)}", ERR_USAGE)
    removed = ARMORY.disarm(kind)
    return {"disarmed": removed, "still_armed": ARMORY.describe()}
