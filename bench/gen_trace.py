"""Write a synthetic GPU Chrome trace shaped like torch.profiler's export (for benchmarks).

    python bench/gen_trace.py OUT.json[.gz] [--events 1000000] [--seed 0] [--leak]
    python bench/gen_trace.py OUT.json --from REAL.json.gz --copies 10
    python bench/gen_trace.py OUT.json.gz --shape nested --events 250000

The second form tiles a real trace: N copies one after the other in time, with their
correlation, flow and step ids shifted so that each copy stays a distinct set of steps (the
GPU figures of the result are those of the original, give or take the seams).

Each training step has what a real GPU trace has (torch-formats.md): a ProfilerStep#N and a
DataLoader ``__next__`` user annotation, python_function frames (with_stack), cpu_op
operators launching kernels through cudaLaunchKernel (correlation ids, ac2g flows), a pageable
host-to-device copy of the batch, an ``.item()`` that synchronises (aten::item ->
aten::_local_scalar_dense -> cudaMemcpyAsync + cudaStreamSynchronize, a DtoH memcpy) and
``[memory]`` instant events. ``--leak`` makes Total Allocated grow by 4 MB a step.
Deterministic for a given seed; streams to disk, so it needs no memory to speak of.

The third form writes a hostile shape (``SHAPES``), the files issue 19 measured the report's
cost on: what a trace costs to read must depend on its events, not on how they nest or name.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from typing import IO, Any

PID, TID, DEV, STREAM = 4242, 4242, 0, 7
LAYERS = ["conv1", "bn1", "relu", "conv2", "bn2", "fc1", "fc2", "dropout"]
KERNELS = {
    "conv1": "void cudnn::cnn::conv2d_grouped_direct_kernel<float>(float const*, float*)",
    "conv2": "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_kernel",
    "bn1": "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(float*)",
    "bn2": "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(float*)",
    "relu": "void at::native::vectorized_elementwise_kernel<4, at::native::ReluFunctor<float>>()",
    "fc1": "ampere_sgemm_128x64_tn",
    "fc2": "ampere_sgemm_32x32_sliced1x4_tn",
    "dropout": "void at::native::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4>()",
}
OPS = {"conv1": "aten::conv2d", "conv2": "aten::conv2d", "bn1": "aten::batch_norm",
       "bn2": "aten::batch_norm", "relu": "aten::relu", "fc1": "aten::addmm",
       "fc2": "aten::addmm", "dropout": "aten::dropout"}


class _Writer:
    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.count = 0
        self.first = True

    def ev(self, e: dict[str, Any]) -> None:
        self.out.write(("" if self.first else ",\n") + json.dumps(e, separators=(", ", ": ")))
        self.first = False
        self.count += 1


def generate(path: str, events: int = 1_000_000, seed: int = 0, leak: bool = False) -> int:
    rng = random.Random(seed)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as out:  # type: ignore[operator]
        out.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": '
                  '"Synthetic A100", "totalGlobalMem": 42505273344, "computeMajor": 8}],\n'
                  '  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},\n'
                  '  "traceEvents": [\n')
        w = _Writer(out)
        t = 1_700_000_000_000.0  # us
        gpu_t = t
        corr = 1000
        ext = 1
        step = 0
        allocated = 500 << 20
        while w.count < events:
            step_start = t
            step_events_start = w.count
            # DataLoader
            dl = rng.uniform(300, 900)
            w.ev({"ph": "X", "cat": "user_annotation", "name":
                  "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                  "pid": PID, "tid": TID, "ts": t + 1, "dur": dl, "args": {"External id": ext}})
            ext += 1
            t += dl + 2
            # pageable HtoD copy of the batch
            corr += 1
            w.ev({"ph": "X", "cat": "python_function", "name": "train.py(41): train_step",
                  "pid": PID, "tid": TID, "ts": t, "dur": 60.0, "args": {}})
            w.ev({"ph": "X", "cat": "cpu_op", "name": "aten::to", "pid": PID, "tid": TID,
                  "ts": t + 1, "dur": 55.0, "args": {"External id": ext}})
            w.ev({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": PID,
                  "tid": TID, "ts": t + 3, "dur": 50.0, "args": {"correlation": corr,
                                                                 "External id": ext}})
            gpu_t = max(gpu_t, t + 5)
            w.ev({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)",
                  "pid": DEV, "tid": STREAM, "ts": gpu_t, "dur": 45.0,
                  "args": {"device": DEV, "stream": STREAM, "correlation": corr,
                           "bytes": 12582912, "memory bandwidth (GB/s)": 11.2}})
            gpu_t += 45.0
            ext += 1
            t += 62
            while w.count - step_events_start < 2000 and w.count < events:
                for layer in LAYERS:
                    corr += 1
                    dur_cpu = rng.uniform(8, 20)
                    w.ev({"ph": "X", "cat": "python_function",
                          "name": f"model.py({100 + LAYERS.index(layer)}): forward",
                          "pid": PID, "tid": TID, "ts": t, "dur": dur_cpu + 4, "args": {}})
                    w.ev({"ph": "X", "cat": "cpu_op", "name": OPS[layer], "pid": PID,
                          "tid": TID, "ts": t + 1, "dur": dur_cpu,
                          "args": {"External id": ext, "Sequence number": ext}})
                    w.ev({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                          "pid": PID, "tid": TID, "ts": t + 2, "dur": 5.0,
                          "args": {"correlation": corr, "External id": ext, "cbid": 211}})
                    w.ev({"ph": "s", "id": corr, "pid": PID, "tid": TID, "ts": t + 2,
                          "cat": "ac2g", "name": "ac2g"})
                    kd = rng.uniform(3, 40)
                    gpu_t = max(gpu_t + rng.uniform(0, 2), t + 8)
                    w.ev({"ph": "X", "cat": "kernel", "name": KERNELS[layer], "pid": DEV,
                          "tid": STREAM, "ts": gpu_t, "dur": kd,
                          "args": {"device": DEV, "stream": STREAM, "correlation": corr,
                                   "External id": ext, "grid": [80, 1, 1],
                                   "block": [256, 1, 1], "est. achieved occupancy %": 50}})
                    w.ev({"ph": "f", "id": corr, "pid": DEV, "tid": STREAM, "ts": gpu_t,
                          "cat": "ac2g", "name": "ac2g", "bp": "e"})
                    gpu_t += kd
                    ext += 1
                    delta = rng.choice((1, -1)) * (1 << 20)
                    allocated += delta
                    w.ev({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]",
                          "pid": PID, "tid": TID, "ts": t + 1.5, "s": "t",
                          "args": {"Total Reserved": 2 << 30, "Total Allocated": allocated,
                                   "Bytes": delta, "Addr": 139_000_000_000 + corr,
                                   "Device Id": DEV, "Device Type": 1}})
                    t += dur_cpu + 6
            # loss.item(): a sync that waits for the GPU queue to drain
            corr += 1
            wait = max(0.0, gpu_t - t) + 4
            w.ev({"ph": "X", "cat": "python_function", "name": "train.py(57): train_step",
                  "pid": PID, "tid": TID, "ts": t, "dur": wait + 20, "args": {}})
            w.ev({"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": PID, "tid": TID,
                  "ts": t + 1, "dur": wait + 16, "args": {"External id": ext}})
            w.ev({"ph": "X", "cat": "cpu_op", "name": "aten::_local_scalar_dense", "pid": PID,
                  "tid": TID, "ts": t + 2, "dur": wait + 14, "args": {"External id": ext + 1}})
            w.ev({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": PID,
                  "tid": TID, "ts": t + 3, "dur": 6.0, "args": {"correlation": corr}})
            w.ev({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize",
                  "pid": PID, "tid": TID, "ts": t + 10, "dur": wait, "args": {"correlation": corr + 1}})
            w.ev({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)",
                  "pid": DEV, "tid": STREAM, "ts": max(gpu_t, t + 5), "dur": 2.0,
                  "args": {"device": DEV, "stream": STREAM, "correlation": corr, "bytes": 4}})
            corr += 1
            ext += 2
            t += wait + 22
            gpu_t = max(gpu_t, t)
            if leak:
                allocated += 4 << 20
            w.ev({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                  "pid": PID, "tid": TID, "ts": step_start, "dur": t - step_start,
                  "args": {"External id": ext}})
            ext += 1
            step += 1
            t += 5
        out.write('\n  ],\n  "traceName": "synthetic.pt.trace.json"\n}\n')
    return w.count


def tile(path: str, source: str, copies: int) -> int:
    """Write ``copies`` time-shifted copies of the real trace ``source`` to ``path``."""
    with gzip.open(source, "rt") if source.endswith(".gz") else open(source) as fh:
        doc = json.load(fh)
    events = doc["traceEvents"]
    ts = [float(e["ts"]) for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(ts)
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in events
               if isinstance(e.get("ts"), (int, float))) - t0
    shift_ids = 1 + max([int(e.get("args", {}).get("correlation", 0) or 0) for e in events]
                        + [int(e["id"]) for e in events if isinstance(e.get("id"), int)])
    steps = 1 + max([int(e["name"].split("#")[1]) for e in events
                     if str(e.get("name", "")).startswith("ProfilerStep#")] or [0])
    opener = gzip.open if path.endswith(".gz") else open
    n = 0
    with opener(path, "wt", encoding="utf-8") as out:  # type: ignore[operator]
        out.write("{\n")
        for k, v in doc.items():
            if k != "traceEvents":
                out.write(f"  {json.dumps(k)}: {json.dumps(v)},\n")
        out.write('  "traceEvents": [\n')
        w = _Writer(out)
        for c in range(copies):
            dt, did = c * (span + 1000.0), c * shift_ids
            for e in events:
                e = dict(e)
                if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M":
                    e["ts"] = e["ts"] + dt
                if isinstance(e.get("id"), int):
                    e["id"] = e["id"] + did
                args = e.get("args")
                if isinstance(args, dict) and isinstance(args.get("correlation"), int):
                    e["args"] = dict(args, correlation=args["correlation"] + did)
                name = e.get("name")
                if isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + c * steps}"
                w.ev(e)
                n += 1
        out.write("\n  ]\n}\n")
    return n


# Hostile shapes: each event is cheap to write and compresses to almost nothing.
SHAPES = {
    "nested": "each cpu_op encloses the next (nesting depth = events)",
    "identical": "the same cpu_op (same name, start and duration) again and again",
    "unique-names": "a distinct 4 KB name per event, over cpu_op, kernel, runtime and memcpy",
    "unique-threads": "each cpu_op on a thread of its own",
    "memory-devices": "[memory] samples, each on a device id of its own",
}


def _hostile_event(shape: str, i: int, n: int) -> dict[str, Any]:
    if shape == "nested":
        return {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1,
                "ts": float(i), "dur": float(2 * (n - i))}
    if shape == "identical":
        return {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1,
                "ts": 0.0, "dur": 10.0}
    if shape == "unique-names":
        name = f"{i:08d}" * 512  # 4 KB
        kind = i % 4
        if kind == 0:
            return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1,
                    "ts": 10.0 * i, "dur": 5.0}
        if kind == 1:
            return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 10.0 * i,
                    "dur": 5.0, "args": {"device": 0, "stream": 7, "correlation": i}}
        if kind == 2:
            return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1,
                    "ts": 10.0 * i, "dur": 5.0, "args": {"correlation": i}}
        return {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy " + name, "pid": 0, "tid": 7,
                "ts": 10.0 * i, "dur": 5.0,
                "args": {"device": 0, "stream": 7, "correlation": i, "bytes": 4}}
    if shape == "unique-threads":
        return {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": i,
                "ts": float(i), "dur": 1.0}
    if shape == "memory-devices":
        return {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": float(i), "s": "t",
                "args": {"Device Type": 1, "Device Id": i % 65536, "Total Allocated": i,
                         "Total Reserved": i, "Bytes": 1, "Addr": i}}
    raise ValueError(f"unknown shape {shape!r} (one of {', '.join(SHAPES)})")


def hostile(path: str, shape: str, events: int) -> int:
    """Write ``events`` events of the hostile ``shape`` (``SHAPES``) to ``path``."""
    if path.endswith(".gz"):  # level 1: these compress ~1000x anyway, and level 9 is slow
        out_cm: IO[str] = gzip.open(path, "wt", encoding="utf-8", compresslevel=1)  # noqa: SIM115
    else:
        out_cm = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by the with below
    with out_cm as out:
        out.write('{"traceEvents": [\n')
        w = _Writer(out)
        for i in range(events):
            w.ev(_hostile_event(shape, i, events))
        out.write("\n]}\n")
    return w.count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--leak", action="store_true")
    p.add_argument("--from", dest="source", help="tile this real trace instead of synthesising")
    p.add_argument("--copies", type=int, default=10)
    p.add_argument("--shape", choices=sorted(SHAPES), help="write this hostile shape instead")
    a = p.parse_args()
    if a.shape:
        n = hostile(a.out, a.shape, a.events)
    else:
        n = tile(a.out, a.source, a.copies) if a.source else generate(a.out, a.events, a.seed, a.leak)
    print(f"wrote {n} events to {a.out}")


if __name__ == "__main__":
    main()
