"""Seeded mutations of every file kind `flight_profiler report` reads (issue 19), as cases.

A case is a set of files (and links, FIFOs, directories) to lay out in an empty directory and the
`report` arguments to run on them. Case ``i`` of seed ``s`` depends on (s, i) only: any failure
found in a big run is rebuilt alone with ``fuzz_report.py --seed s --only i``.

Kinds, each from real files (tests/fixtures, ../shared/fixtures/traces, the torch grads fixture):
trace (.json), trace-gz (gzip-level damage and bombs), snapshot (pickles), census, census-diff
(`--diff`), grads, stacks, diagnose-dir (a diagnose output directory, one artefact damaged and
links, FIFOs, deep or looping directories added) and profile-export (a TensorBoard log directory).
Mutations: truncation, bit flips, type swaps, deleted keys, deep nesting, huge numbers, NaN and
Infinity literals, duplicated keys, long strings, control characters, invalid UTF-8, a BOM,
repeated elements, gzip truncation and bombs, pickle opcode bombs.
"""

from __future__ import annotations

import gzip
import json
import pickle
import random
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent
FIXTURES = REPO / "tests" / "fixtures"
SHARED_TRACES = REPO.parent / "shared" / "fixtures" / "traces"

KINDS = ("trace", "trace-gz", "snapshot", "census", "census-diff", "grads", "stacks",
         "diagnose-dir", "profile-export")
# Caps the cases run under (the defaults, 4 GB and 20 M events, would make a bomb slow to test).
ENV = {"FP_REPORT_MAX_TRACE_MB": "48", "FP_REPORT_MAX_EVENTS": "300000", "FP_REPORT_JOBS": "1"}
Special = tuple  # ("symlink", target) | ("fifo",) | ("dir",)


@dataclass
class Case:
    index: int
    kind: str
    mutation: str
    files: dict[str, bytes | Special] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)  # "{dir}" stands for the case's directory

    @property
    def name(self) -> str:
        return f"{self.index}:{self.kind}:{self.mutation}"


# ------------------------------------------------------------------------------- sources

@cache
def _read(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _traces() -> list[bytes]:
    names = [SHARED_TRACES / "cpu_only_tiny.json.gz", SHARED_TRACES / "gpu_event_sync.json.gz",
             FIXTURES / "traces" / "cpu_dataloader.json.gz"]
    return [_read(p) for p in names if p.exists()] or [_read(FIXTURES / "traces" / "cpu_healthy.json.gz")]


def _census(k: int = 0) -> bytes:
    return _read(FIXTURES / "agent" / f"census_{k}.json")


def _grads() -> bytes:
    return _read(FIXTURES / "agent" / "grads.json")


def _stacks() -> bytes:
    return _read(FIXTURES / "ranks" / "stuck" / "stacks" / "stacks_rank0.json")


@cache
def _snapshots() -> tuple[Any, ...]:
    from report_synth import block, snapshot

    cuda = snapshot(allocated=[(1 << 20, "train.py", 3), (4 << 20, "model.py", 9)], inactive=[2 << 20],
                    oom={"size": 8 << 20, "device_free": 1 << 20})
    cuda["segments"][0]["blocks"].append(block(512, "active_pending_free"))
    cpu = pickle.loads(_read(FIXTURES / "agent" / "snap_0.pickle"))
    return (cuda, cpu)


# ----------------------------------------------------------------------- value mutations

_RAW_NUMBERS = ["1e999", "-1e999", "9" * 5000, str(2 ** 64), str(-(2 ** 63) - 1), "1e-400",
                "-0.0", "123456789012345678901234567890", "0.1e400000", "1" * 300]
_RAW_SPECIAL = ["NaN", "Infinity", "-Infinity"]
_STRINGS = ["", "x", "\x1b]0;owned\x07\x1b[2J", "\u202e\u0000\ud800", "../../etc/passwd", "\n" * 50,
            "nan", "inf", "-inf", "1e999", "ProfilerStep#99999999999999999999", "[memory]",
            "aten::item", "cudaStreamSynchronize", "Memcpy HtoD (Pageable -> Device)"]


def _swap(rng: random.Random, v: Any) -> Any:
    """A value of another type (or an extreme one of the same)."""
    choices: list[Any] = [None, True, False, 0, -1, 1.5, -(2 ** 70), 2 ** 70, 1e308, [], {}, [v], {"k": v},
                          rng.choice(_STRINGS), "x" * rng.choice([100, 5000, 300_000])]
    return rng.choice(choices)


def _nodes(obj: Any, limit: int = 50_000) -> list[tuple[Any, Any]]:
    """(container, key) of the nodes of a JSON-like tree, breadth-first, up to ``limit``."""
    out: list[tuple[Any, Any]] = []
    todo = [obj]
    while todo and len(out) < limit:
        c = todo.pop()
        items = c.items() if isinstance(c, dict) else enumerate(c)
        for k, v in items:
            out.append((c, k))
            if isinstance(v, (dict, list)) and v:
                todo.append(v)
    return out


def _mutate_tree(rng: random.Random, doc: Any, raw: dict[str, str], pickled: bool = False) -> str:
    """Change one node of ``doc`` in place; raw JSON texts go in ``raw`` under a marker string."""
    nodes = _nodes(doc)
    if not nodes:
        return "empty"
    c, k = rng.choice(nodes)
    op = rng.choice(["swap", "swap", "delete", "number", "special", "deep", "dupkey", "long",
                     "repeat", "empty", "negative"])
    v = c[k]
    if op == "delete":
        del c[k]
    elif op == "swap":
        c[k] = _swap(rng, v)
    elif op == "long":
        c[k] = rng.choice(_STRINGS) * rng.choice([1000, 50_000])
    elif op == "repeat" and isinstance(v, list) and v:
        c[k] = v * max(2, rng.choice([2, 50, 2000]) * min(len(v), 100) // len(v))
    elif op == "empty":
        c[k] = type(v)() if isinstance(v, (dict, list, str)) else None
    elif op == "negative":
        c[k] = -abs(v) - 1 if isinstance(v, (int, float)) and not isinstance(v, bool) else -7
    elif pickled:
        c[k] = rng.choice([float("nan"), float("inf"), -float("inf"), 10 ** 400, -(10 ** 30),
                           b"\x00" * 10, complex(1, 2), (1, 2), frozenset({1}), _deep_list(rng)])
        op = "pyvalue"
    else:
        marker = f"@@FUZZ{len(raw)}@@"
        if op == "number":
            raw[marker] = rng.choice(_RAW_NUMBERS)
        elif op == "special":
            raw[marker] = rng.choice(_RAW_SPECIAL)
        elif op == "deep":
            d = rng.choice([50, 900, 5000, 200_000])
            raw[marker] = rng.choice(["[" * d + "]" * d, '{"a": ' * d + "1" + "}" * d])
        elif op == "dupkey" and isinstance(v, dict) and v:
            key = rng.choice(list(v))
            body = ", ".join(f"{json.dumps(a)}: {json.dumps(b)}" for a, b in v.items())
            raw[marker] = "{" + body + f", {json.dumps(key)}: {json.dumps(_swap(rng, v[key]))}" + "}"
        else:
            raw[marker] = rng.choice(_RAW_SPECIAL + _RAW_NUMBERS)
            op = "special"
        c[k] = marker
    return op


def _deep_list(rng: random.Random) -> Any:
    v: Any = []
    for _ in range(rng.choice([10, 100, 400])):
        v = [v]
    return v


def _dump(doc: Any, raw: dict[str, str]) -> bytes:
    text = json.dumps(doc)
    for marker, value in raw.items():
        text = text.replace(json.dumps(marker), value)
    return text.encode("utf-8", "surrogatepass")


# ------------------------------------------------------------------------ byte mutations

def _bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    op = rng.choice(["truncate", "flip", "flip", "bom", "utf8", "utf16", "pad", "insert", "none"])
    if op == "truncate":
        return data[: rng.randrange(len(data) + 1)], op
    if op == "flip":
        b = bytearray(data)
        for _ in range(rng.choice([1, 3, 20])):
            if b:
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b), op
    if op == "bom":
        return b"\xef\xbb\xbf" + data, op
    if op == "utf8":
        i = rng.randrange(len(data) + 1)
        return data[:i] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]) + data[i:], op
    if op == "utf16":
        return data.decode("utf-8", "replace").encode("utf-16"), op
    if op == "pad":
        return data + b" " * rng.choice([1, 10_000]) + rng.choice([b"", b"}", b"garbage", b"\x00"]), op
    if op == "insert":
        i = rng.randrange(len(data) + 1)
        return data[:i] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) + data[i:], op
    return data, op


def _gzip(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    gz = gzip.compress(data, compresslevel=1)
    op = rng.choice(["plain", "plain", "truncate", "flip", "trailing", "members", "crc"])
    if op == "truncate":
        return gz[: rng.randrange(2, len(gz))], "gz-truncate"
    if op == "flip":
        b = bytearray(gz)
        b[rng.randrange(10, len(b))] ^= 1 << rng.randrange(8)
        return bytes(b), "gz-flip"
    if op == "trailing":
        return gz + rng.choice([b"\x00" * 8, b"garbage", b"\x1f\x8b"]), "gz-trailing"
    if op == "members":
        cut = rng.randrange(len(data) + 1)
        return gzip.compress(data[:cut]) + gzip.compress(data[cut:]), "gz-members"
    if op == "crc":
        return gz[:-8] + bytes(8), "gz-crc"
    return gz, "gz"


def _bomb(rng: random.Random) -> tuple[bytes, str]:
    """gzip bombs: a few KB of .gz, past the caps (ENV) once decompressed."""
    op = rng.choice(["spaces", "events", "string", "zeros", "meta"])
    return _bomb_of(op), f"bomb-{op}"


@cache
def _bomb_of(op: str) -> bytes:
    return _make_bomb(op)[0]


def _make_bomb(op: str) -> tuple[bytes, str]:
    if op == "spaces":
        return gzip.compress(b'{"traceEvents": [' + b" " * (64 << 20) + b"]}", 6), "bomb-spaces"
    if op == "events":
        ev = b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1, "dur": 1},'
        return gzip.compress(b'{"traceEvents": [' + ev * 400_000 + ev[:-1] + b"]}", 6), "bomb-events"
    if op == "string":
        return gzip.compress(b'{"traceEvents": [{"name": "' + b"a" * (40 << 20) + b'"}]}', 6), "bomb-string"
    if op == "meta":
        key = b'"k%d": "' + b"m" * (900 << 10) + b'", '
        return gzip.compress(b"{" + b"".join(key.replace(b"%d", str(i).encode()) for i in range(40))
                             + b'"traceEvents": []}', 6), "bomb-meta"
    return gzip.compress(bytes(64 << 20), 6), "bomb-zeros"


# ---------------------------------------------------------------------------- per kind

def _json_kind(rng: random.Random, source: bytes) -> tuple[bytes, str]:
    doc = json.loads(source)
    raw: dict[str, str] = {}
    ops = [_mutate_tree(rng, doc, raw) for _ in range(rng.choice([1, 1, 2, 3]))]
    data = _dump(doc, raw)
    if rng.random() < 0.3:
        data, op = _bytes(rng, data)
        ops.append(op)
    return data, "+".join(ops)


def _pickle_kind(rng: random.Random) -> tuple[bytes, str]:
    if rng.random() < 0.2:
        return rng.choice([
            (b"\x80\x02cos\nsystem\n(S'true'\ntR.", "op-global"),
            (b"\x80\x04" + b"]" * 5000 + b"a" * 4999 + b".", "op-deep"),
            (b"\x80\x04(" + b"}" * 400_000 + b"l.", "op-dicts"),
            (b"\x80\x04\x8a\xff" + b"\xff" * 200 + b".", "op-long"),
            (b"\x80\x04X\xff\xff\xff\x7f" + b"x" * 16 + b".", "op-length"),
            (b"\x80\x04h\x09.", "op-memo"),
            (b"\x80\x04}q\x00(X\x01\x00\x00\x00aq\x01h\x00u.", "op-self"),
        ])
    import copy

    doc = copy.deepcopy(rng.choice(_snapshots()))
    ops = [_mutate_tree(rng, doc, {}, pickled=True) for _ in range(rng.choice([1, 2, 3]))]
    data = pickle.dumps(doc, protocol=rng.choice([0, 2, 4, 5]))
    if rng.random() < 0.3:
        data, op = _bytes(rng, data)
        ops.append(op)
    if rng.random() < 0.3:
        data, op = _gzip(rng, data)
        ops.append(op)
    return data, "+".join(ops)


def _fs_damage(rng: random.Random, files: dict[str, bytes | Special], base: str) -> str:
    op = rng.choice(["loop", "loop", "fifo", "dir-named-json", "deep-dirs", "many", "dangling",
                     "device", "none"])
    if op == "loop":
        files[f"{base}/self_a"] = ("symlink", ".")
        files[f"{base}/self_b"] = ("symlink", ".")
        files[f"{base}/up"] = ("symlink", "..")
    elif op == "fifo":
        files[f"{base}/rank9.pt.trace.json"] = ("fifo",)
    elif op == "dir-named-json":
        files[f"{base}/census-x.json"] = ("dir",)
    elif op == "deep-dirs":
        files["/".join([base] + ["d"] * 40 + ["t.json"])] = b"{}"
    elif op == "many":
        for i in range(300):
            files[f"{base}/many/e{i}.json"] = b""
    elif op == "dangling":
        files[f"{base}/gone.json"] = ("symlink", "/nonexistent/fp-fuzz")
    elif op == "device":
        files[f"{base}/zero.pickle"] = ("symlink", "/dev/zero")
    return op


def make_case(seed: int, index: int) -> Case:
    rng = random.Random(f"{seed}/{index}")
    kind = KINDS[index % len(KINDS)]
    case = Case(index, kind, "")
    out = rng.choice([["--json"], ["--json"], [], ["--format", "md"],
                      ["--format", "html", "-o", "{dir}/out.html"], ["--json", "--fail-on", "critical"]])
    if kind == "trace":
        data, case.mutation = _json_kind(rng, rng.choice(_traces()))
        case.files["t.json"] = data
        case.args = ["{dir}/t.json", *out]
    elif kind == "trace-gz":
        if rng.random() < 0.35:
            data, case.mutation = _bomb(rng)
        else:
            data, m = _json_kind(rng, rng.choice(_traces()))
            data, g = _gzip(rng, data)
            case.mutation = f"{m}+{g}"
        case.files["t.json.gz"] = data
        case.args = ["{dir}/t.json.gz", *out]
    elif kind == "snapshot":
        case.files["s.pickle"], case.mutation = _pickle_kind(rng)
        case.args = ["{dir}/s.pickle", *out]
    elif kind in ("census", "census-diff"):
        data, case.mutation = _json_kind(rng, _census(rng.randrange(3)))
        case.files["c.json"] = data
        case.files["before.json"] = _census(0)
        if kind == "census":
            case.args = ["{dir}/before.json", "{dir}/c.json", *out] if rng.random() < 0.4 else ["{dir}/c.json", *out]
        else:
            pair = ["{dir}/before.json", "{dir}/c.json"]
            case.args = ["--diff", *(pair if rng.random() < 0.5 else pair[::-1]),
                         *rng.choice([["--json"], [], ["--format", "md"]])]
    elif kind == "grads":
        case.files["g.json"], case.mutation = _json_kind(rng, _grads())
        case.args = ["{dir}/g.json", *out]
    elif kind == "stacks":
        case.files["stacks_rank0.json"], case.mutation = _json_kind(rng, _stacks())
        case.files["stacks_rank1.json"] = _read(FIXTURES / "ranks" / "stuck" / "stacks" / "stacks_rank1.json")
        case.args = ["{dir}/stacks_rank0.json", "{dir}/stacks_rank1.json", *out]
    elif kind == "diagnose-dir":
        _diagnose_dir(rng, case)
        case.args = ["{dir}/run", *out]
    else:
        _profile_export(rng, case)
        case.args = ["{dir}/log", *out]
    return case


def _diagnose_dir(rng: random.Random, case: Case) -> None:
    sources: dict[str, Callable[[], bytes]] = {
        "profile.json.gz": lambda: gzip.compress(rng.choice(_traces())),
        "census-before.json": lambda: _census(0), "census-after.json": lambda: _census(2),
        "grads.json": _grads, "snapshot-before.pickle": lambda: pickle.dumps(_snapshots()[1]),
        "diagnose.json": lambda: b'{"format": "flight_profiler.diagnose", "version": 1, "phases": []}',
    }
    for name, make in sources.items():
        case.files[f"run/{name}"] = make()
    victim = rng.choice(list(sources))
    if victim.endswith(".pickle"):
        data, m = _pickle_kind(rng)
    elif victim == "profile.json.gz":
        data, m = _json_kind(rng, rng.choice(_traces()))
        data, g = _gzip(rng, data)
        m = f"{m}+{g}"
    else:
        data, m = _json_kind(rng, case.files[f"run/{victim}"])  # type: ignore[arg-type]
    case.files[f"run/{victim}"] = data
    case.mutation = f"{victim}:{m}+{_fs_damage(rng, case.files, 'run')}"


def _profile_export(rng: random.Random, case: Case) -> None:
    run = "log/plugins/profile/2026_11_24_12_00_00"
    good = gzip.compress(rng.choice(_traces()))
    case.files[f"{run}/host_1.1700000000000.pt.trace.json.gz"] = good
    data, m = _json_kind(rng, rng.choice(_traces()))
    data, g = _gzip(rng, data)
    case.files[f"{run}/host_2.1700000000001.pt.trace.json.gz"] = data
    case.mutation = f"{m}+{g}+{_fs_damage(rng, case.files, run)}"
