"""``torch tensors``: census of live tensors and who holds them; ``--diff`` shows growth.

args: top (int), by ("holder"|"shape"|"site"), label, path / default_dir, previous (a census
document the CLI read from --diff, plain JSON), seconds / max_objects (budgets), target (a
method: the census is taken right after its next call returns, torch_tensors_after.py) and
timeout (seconds to wait for that call; then the census is taken at a safe point, and says so).
With ``previous`` taken by this same process, each holder also says what it still holds of
what it held then and whether its graph is chained to the one it held (census_history.py).
The full census goes to a JSON file (flight_profiler.census v1); the result carries the file's
path and size, the totals, the top rows and, with ``previous``, the diff.
"""

from __future__ import annotations

from typing import Any

from .. import census_diff, tensor_census
from ..protocol import ERR_FAILED, ERR_USAGE
from ..registry import CommandError, Context
from ..safepoint import at_safe_point
from ..torch_support import check_writable, file_result, get_torch, output_path, write_json
from .torch_tensors_after import census_after_call

_BY = ("holder", "shape", "site")


def handle_tensors(ctx: Context) -> dict[str, Any]:
    torch = get_torch()
    top = int(ctx.arg("top", 10) or 10)
    by = str(ctx.arg("by", "holder") or "holder")
    if by not in _BY or top < 1:
        raise CommandError(f"bad arguments: by={by!r}, top={top}", "by is one of holder, shape, site; top >= 1", ERR_USAGE)
    path = output_path(ctx.args, "census", "json")
    check_writable(path)
    previous = ctx.arg("previous")
    previous_id = previous.get("census_id") if isinstance(previous, dict) else None
    seconds = float(ctx.arg("seconds", 5.0) or 5.0)

    def take(roots: list[tuple[str, Any]], moment: str) -> dict[str, Any]:
        return tensor_census.take(
            torch,
            label=str(ctx.arg("label", "") or ""),
            seconds=seconds,
            max_objects=int(ctx.arg("max_objects", 20_000_000) or 20_000_000),
            walk_objects=int(ctx.arg("walk_objects", 2_000_000) or 2_000_000),
            previous_id=previous_id if isinstance(previous_id, str) else None,
            extra_roots=roots, moment=moment,
        )

    census: dict[str, Any] | None = None
    fallback = ""
    spec = ctx.arg("target")
    if spec:
        census, why = census_after_call(ctx, spec, take, float(ctx.arg("timeout", 30.0) or 30.0), seconds)
        if census is None and ctx.cancelled:
            raise CommandError("cancelled before the census", "", ERR_FAILED)
        fallback = f"at a safe point ({why})"
    if census is None:
        # In the main thread, between bytecodes: see safepoint.py for the crash this avoids.
        census = at_safe_point(ctx, lambda: take([], fallback), "tensor census")
    # The file holds exactly the flight_profiler.census v1 keys (the report's loader is strict).
    walked = census.pop("walked_objects", None)
    size = write_json(path, census)
    result: dict[str, Any] = {
        **file_result(path, size),
        "pid": census["pid"],
        "by": by,
        "totals": census["totals"],
        "groups": census["groups"][:top],
        "holders": census["holders"][:top],
        "sites": census["sites"][:top],
        "skipped": census["skipped"],
        "elapsed_s": census["elapsed_s"],
        "walked_objects": walked,
        "moment": census["moment"],
    }
    if isinstance(previous, dict):
        result["diff"] = census_diff.diff(previous, census, top)
    if by == "site":
        result["note"] = ("allocation sites are not recorded for tensors that already exist; "
                          "`torch memory -r module [class] method` records them for new allocations")
    return result
