"""Where each rank is, from its Python stacks: in a collective, loading data, or in Python code;
and ranks grouped by identical stacks ("ranks 0,1,3-7: all_reduce at train.py:88").

Input is the ``stack`` command's result (``{"threads": [{"name", "main", "frames": [...]}]}``,
frames outermost first), one per rank; everything here is pure and works on recorded data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from flight_profiler.report.grads import deeper_than
from flight_profiler.report.stacks import where_frame

# torch.distributed's Python entry points of collectives (the wait happens inside them).
_C10D_FILES = ("distributed_c10d.py",)
_DATA_DIR = "torch/utils/data/"
# autograd's entry points: a DDP model's gradient all-reduce runs inside them, in C++ hooks.
_BACKWARD = ("torch/autograd/__init__.py", "torch/autograd/graph.py", "torch/_tensor.py")


@dataclass(frozen=True)
class Position:
    """What a rank's busiest thread is doing, and the program's line that got it there."""

    kind: str  # collective | data | backward | python | idle
    op: str | None  # the collective (all_reduce, barrier...) when kind == "collective"
    where: str  # "train.py:88": the innermost frame of the program's own code
    function: str  # the program's function at ``where``
    path: str = ""  # full file name of ``where``
    # The library frames inside ``where``, innermost last: what the line is blocked in
    # ("Queue.get at queue.py:171", "Condition.wait at threading.py:327").
    context: tuple[str, ...] = ()

    def describe(self) -> str:
        inside = f", in {self.inside()}" if self.context else ""
        if self.kind == "collective":
            return f"{self.op} at {self.where} (in {self.function})"
        if self.kind == "data":
            return f"data loading at {self.where} (in {self.function}{inside})"
        if self.kind == "backward":
            return f"backward at {self.where} (in {self.function})"
        if self.kind == "idle":
            return "no Python frame (idle or in native code)"
        return f"{self.function} at {self.where}{inside}"

    def inside(self, frames: int = 2) -> str:
        """The innermost library frames, innermost first: ``Condition.wait at threading.py:327
        < Queue.get at queue.py:171``."""
        return " < ".join(reversed(self.context[-frames:]))


def _path(frame: dict[str, Any]) -> str:
    return str(frame.get("file", "")).replace("\\", "/")


def _site(frame: dict[str, Any]) -> tuple[str, str, str]:
    path = str(frame.get("file", "?"))
    return f"{os.path.basename(path)}:{frame.get('line', '?')}", str(frame.get("function", "?")), path


def _label(frame: dict[str, Any]) -> str:
    where, function, _ = _site(frame)
    return f"{function} at {where}"


def position(frames: list[dict[str, Any]]) -> Position:
    """Classify one thread's stack (outermost frame first)."""
    if not frames:
        return Position("idle", None, "-", "-")
    paths = [_path(f) for f in frames]
    collective: str | None = None
    data = backward = False
    for frame, path in zip(frames, paths):
        if path.endswith(_C10D_FILES):
            collective = str(frame.get("function", "?"))  # innermost c10d frame wins
        elif _DATA_DIR in path:
            data = True
        elif path.endswith(_BACKWARD) and "backward" in str(frame.get("function", "")):
            backward = True
    at, inside = where_frame(paths)
    where, function, path = _site(frames[at])
    context = tuple(_label(frames[i]) for i in inside)
    if collective is not None:
        return Position("collective", collective.rsplit(".", 1)[-1], where, function, path, context)
    if data:
        return Position("data", None, where, function, path, context)
    if backward:
        return Position("backward", None, where, function, path, context)
    return Position("python", None, where, function, path, context)


def primary_thread(result: dict[str, Any]) -> dict[str, Any] | None:
    """The thread that tells where the rank is: one in a collective (torch work may run in a
    worker thread), else the main thread, else the first one."""
    threads: list[dict[str, Any]] = [t for t in result.get("threads", []) if not t.get("agent")]
    if not threads:
        return None
    for t in threads:
        if position(t.get("frames", [])).kind == "collective":
            return t
    for t in threads:
        if t.get("main"):
            return t
    return threads[0]


def rank_position(result: dict[str, Any]) -> Position:
    thread = primary_thread(result)
    return position(thread.get("frames", [])) if thread else Position("idle", None, "-", "-")


def stack_key(frames: list[dict[str, Any]]) -> tuple[tuple[str, int, str], ...]:
    return tuple((str(f.get("file")), int(f.get("line") or 0), str(f.get("function")))
                 for f in frames)


@dataclass
class StackGroup:
    """Ranks whose thread ``thread`` has the very same stack."""

    ranks: list[int]
    thread: str
    position: Position
    frames: list[dict[str, Any]]
    primary: bool  # the rank's primary thread (see primary_thread)
    odd: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "thread": self.thread, "primary": self.primary,
                "odd": self.odd, "kind": self.position.kind, "op": self.position.op,
                "where": self.position.where, "function": self.position.function,
                "context": list(self.position.context),
                "summary": self.position.describe(), "frames": self.frames}


@dataclass
class Grouping:
    groups: list[StackGroup] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)

    @property
    def primary(self) -> list[StackGroup]:
        return [g for g in self.groups if g.primary]

    @property
    def odd(self) -> list[StackGroup]:
        return [g for g in self.groups if g.odd]

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "groups": [g.to_dict() for g in self.groups],
                "odd_ranks": sorted({r for g in self.odd for r in g.ranks})}


def group_stacks(per_rank: dict[int, dict[str, Any]], all_threads: bool = True) -> Grouping:
    """Group ranks by identical stacks, primary threads first, biggest groups first.

    A primary-thread group is odd when it is not the (strictly) biggest one: with ranks
    0-6 in all_reduce and rank 7 sleeping, rank 7 is odd. Without a biggest group, the groups
    outside any collective are odd when others are in one; nothing is odd when every rank has
    the same stack.
    """
    buckets: dict[tuple[Any, ...], StackGroup] = {}
    for rank in sorted(per_rank):
        result = per_rank[rank]
        main = primary_thread(result)
        for t in result.get("threads", []):
            if t.get("agent"):
                continue
            is_primary = t is main
            if not is_primary and not all_threads:
                continue
            frames = t.get("frames", [])
            name = "" if is_primary else str(t.get("name", "?"))
            key = (is_primary, name, stack_key(frames))
            g = buckets.get(key)
            if g is None:
                g = buckets[key] = StackGroup([], str(t.get("name", "?")), position(frames),
                                              frames, is_primary)
            g.ranks.append(rank)
    groups = sorted(buckets.values(), key=lambda g: (not g.primary, -len(g.ranks), g.ranks))
    primaries = [g for g in groups if g.primary]
    if len(primaries) >= 2 and len(primaries[0].ranks) > len(primaries[1].ranks):
        for g in primaries[1:]:
            g.odd = True
    elif any(g.position.kind == "collective" for g in primaries):
        # No majority (e.g. 2 ranks): the ones outside every collective are the odd ones.
        for g in primaries:
            g.odd = g.position.kind != "collective"
    return Grouping(groups, sorted(per_rank))


# -- per-rank stack files (written by `diagnose --all-ranks`, read by `report`) -------------

FORMAT = "flight_profiler.rank_stacks"
VERSION = 1


class StacksFormatError(ValueError):
    pass


def stacks_document(rank: int | None, pid: int, world_size: int | None,
                    samples: list[dict[str, Any]],
                    flight_recorder: dict[str, Any] | None = None,
                    node: dict[str, Any] | None = None) -> dict[str, Any]:
    """One rank's stack samples (``stack`` results, oldest first, each with its ``time``);
    ``node``: ``{"node_rank", "hostname"}`` of the node it ran on (its ``time`` and Flight
    Recorder times are that node's wall clock)."""
    return {"format": FORMAT, "version": VERSION, "rank": rank, "pid": pid,
            "world_size": world_size, "samples": samples, "flight_recorder": flight_recorder,
            "node": node}


def parse_stacks(text: str) -> dict[str, Any]:
    """A rank stacks file, every field the job rules read checked for its shape: anything else
    is StacksFormatError naming the field (``samples[2].threads[0].frames[5].line: ...``)."""
    import json

    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StacksFormatError(f"invalid JSON at character {exc.pos}: {exc.msg}") from None
    except RecursionError:
        raise StacksFormatError("invalid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer over 4300 digits
        raise StacksFormatError(f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise StacksFormatError(f'not a rank stacks file (no "format": "{FORMAT}")')
    if deeper_than(obj, 32):  # real ones nest 7 deep; frames are passed to the report as they are
        raise StacksFormatError("nested more than 32 deep: not a rank stacks file")
    version = obj.get("version")
    if type(version) is not int or version != VERSION:
        raise StacksFormatError(f"unsupported version {str(version)[:20]!r} (this reads {VERSION})")
    samples = obj.get("samples")
    if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
        raise StacksFormatError('"samples" is not a list of stack results')
    for k, sample in enumerate(samples):
        _check_sample(f"samples[{k}]", sample)
    for key in ("rank", "world_size", "pid"):
        v = obj.get(key)
        if v is not None and (type(v) is not int or not 0 <= v < 1 << 32):
            raise StacksFormatError(f'"{key}" is not an integer >= 0')
    fr = obj.get("flight_recorder")
    if isinstance(fr, dict):
        _check_flight_recorder(fr)
    return {"kind": "stacks", "rank": obj.get("rank"), "pid": obj.get("pid"),
            "world_size": obj.get("world_size"), "samples": samples,
            "flight_recorder": fr if isinstance(fr, dict) else None,
            "node": _node(obj.get("node"))}


def _node(node: Any) -> dict[str, Any] | None:
    """The node a stack file was taken on; None when absent (older files) or malformed."""
    if not isinstance(node, dict):
        return None
    n, host = node.get("node_rank"), node.get("hostname")
    return {"node_rank": n if type(n) is int and 0 <= n < 1 << 20 else None,
            "hostname": host[:255] if isinstance(host, str) and host.isprintable() else None}


def _int(v: Any) -> bool:
    return type(v) is int and -(1 << 63) <= v < 1 << 63


def _check_sample(where: str, sample: dict[str, Any]) -> None:
    t = sample.get("time")
    if t is not None and not (isinstance(t, (int, float)) and not isinstance(t, bool)
                              and abs(t) < 1e15):
        raise StacksFormatError(f"{where}.time is not a time in seconds")
    threads = sample.get("threads", [])
    if not isinstance(threads, list):
        raise StacksFormatError(f"{where}.threads is not a list")
    for i, th in enumerate(threads):
        at = f"{where}.threads[{i}]"
        if not isinstance(th, dict):
            raise StacksFormatError(f"{at} is not an object")
        frames = th.get("frames", [])
        if not isinstance(frames, list):
            raise StacksFormatError(f"{at}.frames is not a list")
        for j, f in enumerate(frames):
            if not isinstance(f, dict):
                raise StacksFormatError(f"{at}.frames[{j}] is not an object")
            line = f.get("line")
            if line is not None and not _int(line):
                raise StacksFormatError(f"{at}.frames[{j}].line is not a line number")
            for key in ("file", "function"):
                if not isinstance(f.get(key, ""), (str, type(None))):
                    raise StacksFormatError(f"{at}.frames[{j}].{key} is not a string")
        progress = th.get("progress")
        if progress is not None and not isinstance(progress, dict):
            raise StacksFormatError(f"{at}.progress is not an object")


def _check_flight_recorder(fr: dict[str, Any]) -> None:
    last = fr.get("last_enqueued")
    if last is not None and not isinstance(last, dict):
        raise StacksFormatError("flight_recorder.last_enqueued is not an object")
    entries = fr.get("entries", [])
    if not isinstance(entries, list):
        raise StacksFormatError("flight_recorder.entries is not a list")
    for k, e in enumerate(entries):
        if isinstance(e, dict) and e.get("seq") is not None and not _int(e.get("seq")):
            raise StacksFormatError(f"flight_recorder.entries[{k}].seq is not an integer")
