"""How a holder's growth is judged across a series of censuses of one process (memory-leak,
graph-retention and graph-chain read it from here, so that they agree).

Growth is not a leak by itself. A holder *accumulates* when:

- it is seen at three censuses or more (two points cannot tell a leak from a cache filling up,
  or from a step caught at two different moments: a pair is only worth an info finding), and
  its figure grows at **every** interval (a list whose length stops growing is not a leak);
- it is not capped: a ``deque(maxlen=N)``, or an LBFGS history (``history_size``), holds at
  most N entries however long the job runs (the census records the cap and the length);
- it is not the value the named method had just returned (the census's ``return`` root: this
  call's own output), nor ``<unreached>`` in a census whose holder walk stopped at its budget
  (what a longer walk would have named is in there);
- what it held before is still held (``kept``: the census remembers a few of each holder's
  tensors weakly and says how many are still alive at the same path), or its graph is chained
  to the graph it held before (``chained``). A list that lives inside a running ``forward()``
  is rebuilt at every call: more entries, none of those seen before. (A single tensor replaced
  by a bigger one keeps its count: that is still growth.) A holder that is a running
  function's local must show that it survived (kept or chained) at least once, since the
  function may have returned and been called again between two censuses; censuses written
  before these fields existed are judged by the trend alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from flight_profiler.report.models import InputResult

_SUM = ("count", "bytes", "numel", "with_grad_fn", "graph_bytes", "kept", "sampled", "cap", "length")
# Keys that hold digits are per-request/per-step keys: censuses written before the census folded
# them are folded here, so growth is judged per container.
_KEYED = re.compile(r"\['[^'\]]*\d[^'\]]*'\]|\[\d+\]")
MIN_POINTS = 3


def fold_holders(holders: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Holders with per-key paths (``cache['req-886']``) merged into their container's row."""
    out: dict[str, dict[str, Any]] = {}
    for h in holders:
        path = _KEYED.sub("[*]", str(h.get("path", "")))
        row = out.get(path)
        if row is None:
            out[path] = {**h, "path": path}
            continue
        for k in _SUM:
            if k in row or k in h:
                row[k] = int(row.get(k, 0) or 0) + int(h.get(k, 0) or 0)
        if h.get("chained") is True or row.get("chained") is True:
            row["chained"] = True
        elif h.get("chained") is False:
            row["chained"] = False
    return list(out.values())


def root_of(h: dict[str, Any]) -> str:
    """global | local | return | unreached, read from the row or (older censuses) the path."""
    root = h.get("root")
    if isinstance(root, str):
        return root
    path = str(h.get("path", ""))
    if path.startswith("<"):
        return "unreached"
    return "local" if " local " in f"{path} " and "()" in path else "global"


def kept_alive(h: dict[str, Any]) -> bool | None:
    """Whether a holder still held, at this census, what it held at the previous one."""
    if h.get("chained") is True:
        return True
    if "kept" not in h or not h.get("sampled"):
        return None
    return int(h["kept"]) > 0


@dataclass
class History:
    """One holder path across a series: its row at each census (None where absent)."""

    path: str
    rows: list[dict[str, Any] | None]
    tracked: bool  # the censuses recorded survival (census_id / previous_id)
    complete: bool = True  # every census's holder walk finished within its budget
    last: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.last = next(r for r in reversed(self.rows) if r is not None)

    def series(self, key: str) -> list[int]:
        return [int(r.get(key, 0) or 0) if r is not None else 0 for r in self.rows]

    def kept(self) -> list[int]:
        """Bytes a holder keeps alive: its tensors and the graphs hanging off them."""
        return [b + g for b, g in zip(self.series("bytes"), self.series("graph_bytes"))]

    @property
    def root(self) -> str:
        return root_of(self.last)

    def survival(self) -> list[bool | None]:
        """Per interval: kept what it held (True), lost it (False), unknown (None)."""
        out: list[bool | None] = []
        for before, now in zip(self.rows, self.rows[1:]):
            out.append(kept_alive(now) if before is not None and now is not None else None)
        return out

    def chained(self) -> list[bool | None]:
        out: list[bool | None] = []
        for before, now in zip(self.rows, self.rows[1:]):
            value = now.get("chained") if before is not None and now is not None else None
            out.append(value if isinstance(value, bool) else None)
        return out

    def capped(self) -> tuple[int, int] | None:
        """(limit, length) when every tensor of the holder sits in capped containers."""
        if "cap" in self.last:
            return int(self.last["cap"]), int(self.last.get("length", 0) or 0)
        return None


def histories(series: list[InputResult]) -> list[History]:
    """Every holder path of a series (folded per container), in the last census's order first."""
    tracked = all(s.data.get("census_id") for s in series)
    complete = all(s.data.get("holders_complete", True) for s in series)
    folded = [fold_holders(s.data["holders"]) for s in series]
    rows: dict[str, list[dict[str, Any] | None]] = {}
    for k, census in enumerate(folded):
        for h in census:
            rows.setdefault(h["path"], [None] * len(series))[k] = h
    return [History(path, r, tracked, complete) for path, r in rows.items()]


def growing(values: list[int]) -> bool:
    """Up at every interval."""
    return len(values) >= 2 and all(b > a for a, b in zip(values, values[1:]))


def why_not_accumulating(h: History) -> str | None:
    """None when nothing says the holder's growth is not an accumulation (the trend itself is
    judged by the rule), else why not."""
    if h.root == "return":
        return "the value the method had just returned (this call's own)"
    if h.root == "unreached" and not h.complete:
        return ("the holder walk of a census stopped at its budget, so who holds these tensors is "
                "unknown (retry with a larger `--budget`)")
    cap = h.capped()
    if cap is not None and cap[1] <= cap[0]:
        return f"capped at {cap[0]} entries (now {cap[1]}): it fills up, then stays"
    survival = h.survival()
    # More entries, none of them the ones seen before: a container rebuilt at every call or
    # step, caught at different lengths. (One tensor replaced by a bigger one keeps its count
    # and is still growth.)
    if growing(h.series("count")) and any(s is False for s in survival):
        return "what it held at one census was gone at the next (rebuilt, not accumulated)"
    if h.root == "local" and h.tracked and not any(s is True for s in survival):
        return "a running function's local not seen to outlive its call"
    return None
