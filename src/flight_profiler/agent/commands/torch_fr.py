"""`torch fr`: what PyTorch's Flight Recorder holds about this rank's collectives.

Only when the job was started with ``TORCH_FR_BUFFER_SIZE`` (NCCL, and gloo since torch 2.6):
the last collective each process group enqueued (``pg_status``), and the last entries, which
tell who is behind and which collective each rank is in. The dump is torch's own pickle,
produced in this process, so loading it here runs nothing foreign.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

from ..registry import CommandError, Context
from ..torch_support import get_torch

_MAX_ENTRIES = 20


def _entry(e: dict[str, Any]) -> dict[str, Any]:
    return {"pg_id": e.get("pg_id"), "seq": e.get("collective_seq_id"), "p2p_seq": e.get("p2p_seq_id"),
            "op": e.get("profiling_name"), "state": e.get("state"),
            "input_sizes": e.get("input_sizes"), "is_p2p": e.get("is_p2p"),
            "created_ns": e.get("time_created_ns")}


def handle(ctx: Context) -> dict[str, Any]:
    torch = get_torch()
    size = os.environ.get("TORCH_FR_BUFFER_SIZE", "")
    c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    dump = getattr(c10d, "_dump_fr_trace", None)
    if dump is None:
        raise CommandError("this torch has no Flight Recorder (_dump_fr_trace)",
                           "Flight Recorder needs torch >= 2.4 built with distributed support")
    if not size.strip() or size.strip() == "0":
        return {"enabled": False, "reason": "TORCH_FR_BUFFER_SIZE is not set in the job"}
    try:
        raw = dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        data = pickle.loads(raw)
    except Exception as exc:
        raise CommandError(f"the Flight Recorder dump failed: {type(exc).__name__}: {exc}") from None
    entries = [e for e in data.get("entries", []) if isinstance(e, dict)]
    status = data.get("pg_status") or {}
    last = {str(pg): int(s.get("last_enqueued_collective", -1)) for pg, s in status.items()
            if isinstance(s, dict)}
    return {"enabled": True, "version": data.get("version"), "last_enqueued": last,
            "pg_status": status, "entries": [_entry(e) for e in entries[-_MAX_ENTRIES:]]}
