"""One streaming pass over a Chrome trace into compact columns (``array``), nothing per event kept.

What is kept: GPU activity intervals (for the HTA-style breakdown), CPU-side intervals of
operators, Python frames and annotations per thread (for self time and for naming the Python
line behind a sync or a copy), the CUDA runtime calls' correlation ids, ``[memory]`` samples,
the steps and the DataLoader spans. A 1 M-event trace keeps a few tens of MB.

Events arrive in batches of typed structs (fastjson, msgspec); a file that path cannot read is
read again with the stdlib streaming decoder, its dicts turned into the same structs.

What a file may cost is bounded by its events, never by how they nest or what they are named:
names are interned once (``RawTrace.intern``: cut to 4 KB; cut to 256 characters once the
distinct names hold 16 M characters; past 131 072 distinct names, the rest share one), every
table keyed by a name holds the interned one, and a trace is refused past ``max_trace_bytes()``
of JSON (decompressed) or ``max_events()`` events, with one line that names the limit.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import compress
from typing import IO, Any, Callable

from flight_profiler.agent.trace_repair import MendingReader
from flight_profiler.report.fastjson import Args, Event, NeedStdlib, iter_batches
from flight_profiler.report.jsonstream import TraceFormatError, iter_trace, open_text_bytes
from flight_profiler.report.readahead import ReadAhead
from flight_profiler.report.trace_limits import (
    MAX_DEVICES,
    Capped,
    TraceTooLarge,
    clean_meta,
    max_events,
    max_trace_bytes,
)

# HTA's kernel classes (hta/utils/utils.py): communication, memory, computation, other.
COMPUTE, MEMORY, COMM, OTHER = 0, 1, 2, 3
_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"})
SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
})
SCALAR_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
CPU_OP, PY_FRAME, ANNOTATION = 0, 1, 2
_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d{1,18})")
# Annotations the step model reads: torch's own per optimizer step, the agent's marks.
_MARK_PREFIXES = ("Optimizer.step#", "flight_profiler.")
_AUTOGRAD_BACKWARD = "torch/autograd/__init__.py("
# Operators of a model's forward (a graph built by them holds activations); others recorded
# with grad mode on (indexing, .mean() for a log line, data preparation) build little or nothing.
MODEL_OPS = ("linear", "addmm", "matmul", "aten::mm", "bmm", "conv", "embedding", "layer_norm",
             "scaled_dot_product", "lstm", "gru", "rnn", "baddbmm", "einsum")


def is_model_op(name: str) -> bool:
    low = name.lower()
    return any(k in low for k in MODEL_OPS)
# Kernel names of heavily templated code reach a few KB; longer is not a name but a payload.
MAX_NAME_CHARS = 4096
# Real traces hold a few hundred distinct names (a few thousand Python frames with_stack, ~100 KB
# of text). Past NAME_BUDGET_CHARS of distinct names new ones are cut shorter, past MAX_NAMES
# they share one name: a file of unique 4 KB names took 667 MB for a 1.6 MB .gz (issue 19).
NAME_BUDGET_CHARS = 16 << 20
SHORT_NAME_CHARS = 256
MAX_NAMES = 1 << 17
OTHER_NAMES = f"(other names: more than {MAX_NAMES} distinct)"
# CPU threads kept per trace (a few tens in real ones, DataLoader workers included); each costs
# ~1 KB of columns, so a file of one event per thread would cost 10x a real one per event.
MAX_THREADS = 4096
_I64 = 1 << 63


def _i64(x: Any) -> int:
    """An id that fits the int64 columns, or -1 (hostile or missing)."""
    return x if type(x) is int and -_I64 <= x < _I64 else -1


def gpu_kind(name: str) -> int:
    if name.startswith("nccl") or "gloo:" in name:
        return COMM
    if _MEMORY_RE.match(name):
        return MEMORY
    if _NOT_COMPUTE_RE.match(name):
        return OTHER
    return COMPUTE


@dataclass
class ThreadIntervals:
    """CPU-side spans of one thread: operators, Python frames, annotations."""

    ts: array[float] = field(default_factory=lambda: array("d"))
    end: array[float] = field(default_factory=lambda: array("d"))
    name: array[int] = field(default_factory=lambda: array("l"))
    kind: array[int] = field(default_factory=lambda: array("b"))
    # Indices of the cpu_op spans (in file order): self times walk only these.
    ops: array[int] = field(default_factory=lambda: array("q"))
    sorted: bool = True
    order: list[int] | None = None


@dataclass
class RawTrace:
    path: str
    meta: dict[str, Any] = field(default_factory=dict)
    events: int = 0
    mended: int = 0  # lines of a broken export mended on reading (agent/trace_repair.py)
    names: list[str] = field(default_factory=list)
    name_ids: dict[str, int] = field(default_factory=dict)
    # GPU activity (kernels, memcpy, memset, cuda_sync)
    g_ts: array[float] = field(default_factory=lambda: array("d"))
    g_end: array[float] = field(default_factory=lambda: array("d"))
    g_kind: array[int] = field(default_factory=lambda: array("b"))
    g_corr: array[int] = field(default_factory=lambda: array("q"))
    g_name: array[int] = field(default_factory=lambda: array("l"))
    gpu_devices: set[int] = field(default_factory=set)
    memcpy: list[tuple[str, float, int, int]] = field(default_factory=list)  # name, dur, bytes, corr
    # CUDA runtime / driver calls
    rt_corr: array[int] = field(default_factory=lambda: array("q"))
    rt_ts: array[float] = field(default_factory=lambda: array("d"))
    rt_tid: array[int] = field(default_factory=lambda: array("q"))
    runtime: dict[str, list[float]] = field(default_factory=dict)  # name -> [count, total_us]
    syncs: list[tuple[int, float, float, str]] = field(default_factory=list)  # tid, ts, dur, name
    scalar_ops: list[tuple[int, float, float, str]] = field(default_factory=list)
    threads: dict[int, ThreadIntervals] = field(default_factory=dict)
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # number, ts, dur
    dataloader: list[tuple[int, float, float]] = field(default_factory=list)  # thread, ts, dur
    # [memory] samples per (device type, device id)
    mem: dict[tuple[int, int], tuple[array[float], array[int], array[int]]] = field(default_factory=dict)
    mem_live: dict[tuple[int, int], dict[int, tuple[float, int, int]]] = field(default_factory=dict)
    span_ts: float = float("inf")
    span_end: float = float("-inf")
    trace_window: tuple[float, float] | None = None
    # stacks.CallerIndex's per-thread nesting, built once per trace for every reader of it
    # (the step's stacks and the training thread's lines: 0.3 s each on a with_stack trace).
    nested: dict[int, Any] = field(default_factory=dict)
    # Autograd: forward ops that recorded a graph node ("Sequence number", "Fwd thread id" 0;
    # backward functions carry the forward thread's id), and backward functions run (autograd::engine::evaluate_function: ...).
    autograd_fwd_ops: int = 0
    backward_ops: int = 0
    autograd_fwd_names: dict[str, int] = field(default_factory=dict)
    # The step model's marks (report/steps.py): annotations of optimizer steps and of the agent's
    # marks (thread, ts, dur, name), and Python calls of torch.autograd.backward (thread, ts, dur).
    marks: list[tuple[int, float, float, str]] = field(default_factory=list)
    backwards: list[tuple[int, float, float]] = field(default_factory=list)
    # Forward model operators that recorded an autograd node (sequence number, ts, thread, name
    # id), and the sequence numbers backward functions ran for: a forward whose number no
    # backward ran built a graph nobody used (rule eval-with-grad).
    fwd_seq: array[int] = field(default_factory=lambda: array("q"))
    fwd_ts: array[float] = field(default_factory=lambda: array("d"))
    fwd_key: array[int] = field(default_factory=lambda: array("q"))
    fwd_name: array[int] = field(default_factory=lambda: array("l"))
    bwd_seqs: set[int] = field(default_factory=set)
    threads_left_out: int = 0  # CPU events of threads past MAX_THREADS, not kept
    # GPU events at ts 0 with dur 0 (kineto lost their timestamps) while the CPU side runs at
    # real ones: left out of g_* and memcpy (drop_untimed_gpu), counted here.
    gpu_untimed: int = 0
    gpu_events: int = 0  # GPU events read, the untimed ones included
    g_untimed: array[int] = field(default_factory=lambda: array("q"))  # their g_* indices
    m_untimed: array[int] = field(default_factory=lambda: array("q"))  # their memcpy indices
    name_chars: int = 0

    def intern(self, name: str) -> int:
        """The id of ``name`` (cut to MAX_NAME_CHARS), added on first sight within the budget."""
        if len(name) > MAX_NAME_CHARS:
            name = name[:MAX_NAME_CHARS] + "..."
        i = self.name_ids.get(name)
        if i is not None:
            return i
        if self.name_chars > NAME_BUDGET_CHARS and len(name) > SHORT_NAME_CHARS:
            name = name[:SHORT_NAME_CHARS] + "..."
            i = self.name_ids.get(name)
            if i is not None:
                return i
        if len(self.names) >= MAX_NAMES:
            name = OTHER_NAMES
            i = self.name_ids.get(name)
            if i is not None:
                return i
        i = self.name_ids[name] = len(self.names)
        self.names.append(name)
        self.name_chars += len(name)
        return i


def _thread_key(pid: Any, tid: Any) -> int:
    # pid/tid are ints in torch traces; strings appear for synthetic rows ("Spans").
    try:
        key = (int(pid) << 32) ^ int(tid)
        if -_I64 <= key < _I64:
            return key
    except (TypeError, ValueError, OverflowError):
        pass
    try:
        return hash((pid, tid))
    except TypeError:  # unhashable ids ("pid": [1]) from a hand-made file
        return hash((repr(pid), repr(tid)))


def load_trace(path: str) -> RawTrace:
    """Stream ``path`` (Chrome trace, plain or gzipped) into a :class:`RawTrace`."""
    raw = RawTrace(path)
    limit = max_trace_bytes()
    with open_text_bytes(path) as stream:
        compressed = not isinstance(stream, io.BufferedReader)
        capped: IO[bytes] = Capped(stream, limit)  # type: ignore[assignment]
        with ReadAhead(capped, chunk=2 << 20, depth=4) if compressed else contextlib.nullcontext(capped) as src:
            try:
                _consume(raw, iter_batches(src, raw.meta.__setitem__))  # type: ignore[arg-type]
                raw.meta = clean_meta(raw.meta)
                return raw
            except NeedStdlib:
                pass  # an unusual layout or a malformed file: the tolerant reader decides
            except (OSError, EOFError, zlib.error) as exc:  # gzip: truncated or corrupt
                raise TraceFormatError(f"cannot decompress: {exc}") from None
    raw = RawTrace(path)
    counts: dict[str, int] = {}
    with open_text_bytes(path) as stream:
        # torch's exporter can write a name unescaped (agent/trace_repair.py): such a line is
        # mended on the way, as the agent mends the traces it writes
        mending = MendingReader(Capped(stream, limit))
        _consume(raw, _stdlib_batches(iter_trace(mending, raw.meta.__setitem__, counts)))  # type: ignore[arg-type]
    raw.mended = mending.mended
    raw.events += counts.get("skipped", 0)
    raw.meta = clean_meta(raw.meta)
    return raw


def _stdlib_batches(events: Iterator[dict[str, Any]], size: int = 4096) -> Iterator[list[Event]]:
    batch: list[Event] = []
    for e in events:
        a = e.get("args")
        args = None
        if isinstance(a, dict):
            args = Args(stream=a.get("stream"), correlation=a.get("correlation"),
                        device=a.get("device"), bytes=a.get("bytes"),
                        device_type=a.get("Device Type"), device_id=a.get("Device Id"),
                        total_allocated=a.get("Total Allocated"),
                        total_reserved=a.get("Total Reserved"), nbytes=a.get("Bytes"),
                        addr=a.get("Addr"), seq=a.get("Sequence number"),
                        fwd_tid=a.get("Fwd thread id"))
        try:
            ts = float(e.get("ts", math.nan))
            dur = float(e.get("dur", 0.0))
        except (TypeError, ValueError, OverflowError):
            ts, dur = math.nan, 0.0
        ph, cat, name = e.get("ph"), e.get("cat"), e.get("name", "")
        batch.append(Event(ph=ph if isinstance(ph, str) else "",
                           cat=cat if isinstance(cat, str) else "",
                           name=name if isinstance(name, str) else str(name),
                           pid=e.get("pid"), tid=e.get("tid"), ts=ts, dur=dur, args=args))
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _consume(raw: RawTrace, batches: Iterator[list[Event]]) -> None:
    """The one pass: each event into the columns it feeds, nothing else kept."""
    intern = raw.intern
    threads = raw.threads
    runtime = raw.runtime
    keys: dict[tuple[Any, Any], int] = {}
    name_ids = raw.name_ids
    names = raw.names
    model_ops: dict[str, bool] = {}
    g_ts, g_end, g_kind, g_corr, g_name = raw.g_ts, raw.g_end, raw.g_kind, raw.g_corr, raw.g_name
    gpu_kinds: dict[int, int] = {}
    cap = max_events()

    def key_of(pid: Any, tid: Any) -> int:
        try:
            return keys[(pid, tid)]
        except KeyError:
            k = keys[(pid, tid)] = _thread_key(pid, tid)
            return k
        except TypeError:  # unhashable ids from a hand-made file
            return _thread_key(pid, tid)

    for batch in batches:
        raw.events += len(batch)
        if raw.events > cap:
            raise TraceTooLarge(f"more than {cap:,} events: not read, to bound time and memory "
                                "(FP_REPORT_MAX_EVENTS=N raises the limit)")
        for e in batch:
            ph = e.ph
            if ph == "X":
                ts = e.ts
                end = ts + e.dur
                d = end - ts
                if d - d != 0.0:
                    continue  # NaN/Infinity in ts or dur would poison every sum (and the JSON)
                cat = e.cat
                name = e.name  # both str: typed in the fast path, coerced in the stdlib one
                args = e.args
                if cat in _GPU_CATS or (args is not None and args.stream is not None
                                        and cat != "gpu_user_annotation"):
                    stream_id = args.stream if args is not None else None
                    if stream_id is None or stream_id == -1:
                        continue
                    i = name_ids.get(name)
                    if i is None:
                        i = intern(name)
                    k = gpu_kinds.get(i)
                    if k is None:
                        k = gpu_kinds[i] = gpu_kind(name)
                    corr = _i64(args.correlation) if args is not None else -1
                    untimed = ts == 0.0 and end == 0.0
                    if untimed:
                        raw.g_untimed.append(len(g_ts))
                    g_ts.append(ts)
                    g_end.append(end)
                    g_kind.append(k)
                    g_corr.append(corr)
                    g_name.append(i)
                    dev = args.device if args is not None else None
                    if dev is None:
                        dev = e.pid
                    if type(dev) is int and len(raw.gpu_devices) < MAX_DEVICES:
                        raw.gpu_devices.add(dev)
                    if cat == "gpu_memcpy" or name.startswith("Memcpy"):
                        nbytes = args.bytes if args is not None else 0
                        if untimed:
                            raw.m_untimed.append(len(raw.memcpy))
                        raw.memcpy.append((names[i], end - ts, max(_i64(nbytes), 0), corr))
                    continue
                if cat == "cuda_runtime" or cat == "cuda_driver":
                    corr = _i64(args.correlation) if args is not None else -1
                    key = key_of(e.pid, e.tid)
                    if corr != -1:
                        raw.rt_corr.append(corr)
                        raw.rt_ts.append(ts)
                        raw.rt_tid.append(key)
                    i = name_ids.get(name)
                    iname = names[intern(name) if i is None else i]  # tables hold interned names
                    agg = runtime.get(iname)
                    if agg is None:
                        runtime[iname] = [1, end - ts]
                    else:
                        agg[0] += 1
                        agg[1] += end - ts
                    if name in SYNC_CALLS:
                        raw.syncs.append((key, ts, end - ts, iname))
                    continue
                if cat == "cpu_op" or cat == "python_function" or cat == "user_annotation":
                    key = key_of(e.pid, e.tid)
                    th = threads.get(key)
                    if th is None:
                        if len(threads) >= MAX_THREADS:
                            raw.threads_left_out += 1
                            continue
                        th = threads[key] = ThreadIntervals()
                    tss = th.ts
                    if tss and ts < tss[-1]:
                        th.sorted = False
                    tss.append(ts)
                    th.end.append(end)
                    i = name_ids.get(name)
                    if i is None:
                        i = intern(name)
                    th.name.append(i)
                    if cat == "cpu_op":
                        th.ops.append(len(th.kind))
                        th.kind.append(CPU_OP)
                        if name.startswith("autograd::engine::evaluate_function"):
                            raw.backward_ops += 1
                            if args is not None and args.seq is not None:
                                raw.bwd_seqs.add(_i64(args.seq))
                        elif args is not None and args.seq is not None and not args.fwd_tid:
                            raw.autograd_fwd_ops += 1
                            iname = names[i]
                            raw.autograd_fwd_names[iname] = raw.autograd_fwd_names.get(iname, 0) + 1
                            model = model_ops.get(iname)
                            if model is None:
                                model = model_ops[iname] = is_model_op(iname)
                            if model:
                                raw.fwd_seq.append(_i64(args.seq))
                                raw.fwd_ts.append(ts)
                                raw.fwd_key.append(key)
                                raw.fwd_name.append(th.name[-1])
                        if name in SCALAR_OPS:
                            raw.scalar_ops.append((key, ts, end - ts, names[i]))
                    elif cat == "python_function":
                        th.kind.append(PY_FRAME)
                        if name.endswith("): backward") and _AUTOGRAD_BACKWARD in name:
                            raw.backwards.append((key, ts, end - ts))
                    else:
                        th.kind.append(ANNOTATION)
                        if name.startswith("ProfilerStep"):
                            m = _STEP_RE.match(name)
                            raw.steps.append((int(m.group(1)) if m else len(raw.steps), ts, end - ts))
                        elif name.startswith("enumerate(DataLoader)"):
                            raw.dataloader.append((key, ts, end - ts))
                        elif name.startswith(_MARK_PREFIXES):
                            raw.marks.append((key, ts, end - ts, names[i]))
                    continue
                if cat == "Trace":
                    raw.trace_window = (ts, end)
            elif (ph == "i" or ph == "I") and e.name == "[memory]":
                _memory_sample(raw, e, key_of)
    # The CPU-side span, from the columns (cheaper than a comparison per event).
    for th in threads.values():
        if th.ts:
            raw.span_ts = min(raw.span_ts, min(th.ts))
            raw.span_end = max(raw.span_end, max(th.end))
    drop_untimed_gpu(raw)


def drop_untimed_gpu(raw: RawTrace) -> None:
    """Leave out the GPU events kineto wrote at ts 0 with dur 0 (it loses kernels', copies' and
    memsets' timestamps when a profiler session is exported after a newer one started, torch
    2.11 on an H100): beside CPU events at real timestamps they stretched the GPU span from 0
    to now (4.67e12 us) and the report said "GPU busy 0.0%". Kept when the CPU side starts at 0
    or has no events: then 0 may be a real time."""
    raw.gpu_events = len(raw.g_ts)
    drop = raw.g_untimed
    cpu_start = min(raw.span_ts, min(raw.rt_ts, default=math.inf))
    if not drop or not 0.0 < cpu_start < math.inf:
        raw.g_untimed = raw.m_untimed = array("q")
        return
    keep = bytearray(b"\x01") * len(raw.g_ts)
    for i in drop:
        keep[i] = 0
    for col in ("g_ts", "g_end", "g_kind", "g_corr", "g_name"):
        old = getattr(raw, col)
        setattr(raw, col, array(old.typecode, compress(old, keep)))
    if raw.m_untimed:
        keep = bytearray(b"\x01") * len(raw.memcpy)
        for i in raw.m_untimed:
            keep[i] = 0
        raw.memcpy = list(compress(raw.memcpy, keep))
    raw.gpu_untimed = len(drop)
    raw.g_untimed = raw.m_untimed = array("q")


def _memory_sample(raw: RawTrace, e: Event, key_of: Callable[[Any, Any], int]) -> None:
    a = e.args
    if a is None:
        return
    try:
        dev = (int(a.device_type or 0), int(a.device_id or 0))
        ts = e.ts
        alloc = int(a.total_allocated or 0)
        reserved = int(a.total_reserved or 0)
        nbytes = int(a.nbytes or 0)
    except (TypeError, ValueError, OverflowError):
        return
    if not (math.isfinite(ts) and -_I64 <= alloc < _I64 and -_I64 <= reserved < _I64
            and abs(dev[0]) < 1 << 16 and abs(dev[1]) < 1 << 16):
        return
    series = raw.mem.get(dev)
    if series is None:
        if len(raw.mem) >= MAX_DEVICES:
            return  # a real job has a few devices per trace; each kept one is a section
        series = raw.mem[dev] = (array("d"), array("q"), array("q"))
        raw.mem_live[dev] = {}
    series[0].append(ts)
    series[1].append(alloc)
    series[2].append(reserved)
    addr = a.addr
    if type(addr) is int:
        live = raw.mem_live[dev]
        if nbytes > 0:
            live[addr] = (ts, nbytes, key_of(e.pid, e.tid))
        elif nbytes < 0:
            live.pop(addr, None)
