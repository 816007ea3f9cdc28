"""Synthetic CPU training-loop traces with the marks the agent writes (report/steps.py): its
marked calls of a method, each optimizer's steps and the backward passes, as
``torch profile METHOD --window`` records them; or per-call ProfilerStep sessions, as
``torch profile METHOD --schedule`` records them. Forward operators carry autograd sequence
numbers and backward functions the numbers they run for, as torch.profiler writes them.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PID, TID = 200, 200
CALL = "flight_profiler.call#__main__.Net.forward"


@dataclass
class Loop:
    steps: int = 6
    forwards: int = 1  # calls of the named method per step (gradient accumulation, LBFGS)
    optimizers: int = 1  # each steps once per step (a GAN: 2)
    optimizer_marks: bool = True  # the agent's marks (else torch's annotations only)
    backward: bool = True
    dataloader_us: float = 0.0  # next() per step
    cut_dataloader_us: float = 0.0  # a next() still waiting when the profiler stopped
    eval_forward: bool = False  # a forward with grad on after the step, used by no backward
    eval_every: int = 1  # ... after every N-th step only (a validation pass once an epoch)
    eval_nodes: int = 8  # graph nodes that forward builds
    leak_per_step: int = 0  # bytes kept per step ([memory] events)
    forward_memory: int = 0  # bytes a forward allocates and its backward frees
    per_call: bool = False  # ProfilerStep sessions around each forward only (method mode)
    python_tiny_ops: int = 0  # outermost tiny ops per step, issued from Python ...
    tiny_ops_frame: str = "train.py(30): smooth"  # ... by this frame (the program's loop)
    tiny_ops_in_loader: bool = False  # ... inside a DataLoader next() (a Dataset's __getitem__)
    nested_tiny_ops: int = 0  # tiny ops per forward inside one library operator
    step_us: float = 10_000.0  # at least this long (idle padding)
    events: list[dict[str, Any]] = field(default_factory=list)


def _x(loop: Loop, cat: str, name: str, ts: float, dur: float, args: dict[str, Any] | None = None) -> None:
    loop.events.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": ts,
                        "dur": dur, "args": args or {}})


def _mem(loop: Loop, ts: float, total: int, nbytes: int, addr: int) -> None:
    loop.events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": PID,
                        "tid": TID, "ts": ts, "s": "t",
                        "args": {"Device Type": 0, "Device Id": -1, "Total Allocated": total,
                                 "Total Reserved": total, "Bytes": nbytes, "Addr": addr}})


def write(loop: Loop, path: Path) -> Path:
    t = 1_000_000.0
    seq = 100
    allocated = 50 << 20
    addr = 1 << 30
    first = t
    for s in range(loop.steps):
        if loop.dataloader_us:
            _x(loop, "user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
               t, loop.dataloader_us)
            t += loop.dataloader_us + 5
        for f in range(loop.forwards):
            start = t
            fwd_us = 2000.0 + 6.0 * loop.nested_tiny_ops
            if loop.per_call:
                _x(loop, "user_annotation", f"ProfilerStep#{s * loop.forwards + f}", t, fwd_us + 10)
            _x(loop, "user_annotation", CALL, t + 1, fwd_us)
            _x(loop, "python_function", "train.py(20): forward", t + 2, fwd_us - 2)
            forward_seqs = []
            for k in range(3):
                seq += 1
                forward_seqs.append(seq)
                _x(loop, "cpu_op", "aten::linear", t + 5 + 600 * k, 500,
                   {"Sequence number": seq, "Fwd thread id": 0})
            if loop.nested_tiny_ops:
                seq += 1
                forward_seqs.append(seq)
                base = t + 1900
                _x(loop, "cpu_op", "aten::lstm_cell", base, 6.0 * loop.nested_tiny_ops + 2,
                   {"Sequence number": seq, "Fwd thread id": 0})
                for j in range(loop.nested_tiny_ops):
                    _x(loop, "cpu_op", "aten::sigmoid", base + 1 + 6 * j, 5.0)
            if loop.forward_memory:
                addr += 1
                allocated += loop.forward_memory
                _mem(loop, t + 50, allocated, loop.forward_memory, addr)
            t += fwd_us + 20
            if loop.backward and not loop.per_call:
                bwd = 1500.0
                _x(loop, "user_annotation", "flight_profiler.backward", t, bwd)
                for k, sq in enumerate(forward_seqs[:3]):
                    _x(loop, "cpu_op", "autograd::engine::evaluate_function: AddmmBackward0",
                       t + 10 + 400 * k, 300, {"Sequence number": sq, "Fwd thread id": 1})
                if loop.forward_memory:
                    allocated -= loop.forward_memory
                    _mem(loop, t + bwd - 5, allocated, -loop.forward_memory, addr)
                t += bwd + 20
            elif loop.per_call and loop.backward:
                # The backward runs between the calls, outside the sessions: c10's CPU memory
                # reporter only counts a free while memory profiling is on, so the total the
                # next session reports still holds the freed forward outputs.
                t += 1520
            del start
        if loop.python_tiny_ops and loop.tiny_ops_in_loader:
            _x(loop, "user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
               t - 1, 10.0 * loop.python_tiny_ops + 3)
        if loop.python_tiny_ops:
            _x(loop, "python_function", loop.tiny_ops_frame, t, 10.0 * loop.python_tiny_ops)
        for j in range(loop.python_tiny_ops):
            _x(loop, "cpu_op", "aten::mul", t + 1 + 10 * j, 4.0)
        t += 10 * loop.python_tiny_ops + 5
        if not loop.per_call:
            for o in range(loop.optimizers):
                _x(loop, "user_annotation", "Optimizer.step#SGD.step", t, 400)
                if loop.optimizer_marks:
                    _x(loop, "user_annotation", f"flight_profiler.optimizer_step#{o} SGD", t + 380, 10)
                t += 420
        if loop.leak_per_step:
            addr += 1
            allocated += loop.leak_per_step
            _mem(loop, t, allocated, loop.leak_per_step, addr)
        if loop.eval_forward and not loop.per_call and (s + 1) % loop.eval_every == 0:
            for k in range(loop.eval_nodes):
                seq += 1
                _x(loop, "cpu_op", "aten::linear", t + 5 + 60 * k, 50,
                   {"Sequence number": seq, "Fwd thread id": 0})
            t += 60 * loop.eval_nodes + 20
        t = max(t, first + (s + 1) * loop.step_us)
    if loop.cut_dataloader_us:
        _x(loop, "user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
           t + 10, loop.cut_dataloader_us)
        t += loop.cut_dataloader_us + 10
    loop.events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler", "pid": "Spans",
                        "tid": "PyTorch Profiler", "ts": first - 100, "dur": t - first + 100})
    doc = {"schemaVersion": 1, "traceEvents": loop.events, "traceName": "synthetic",
           "distributedInfo": {"rank": 0}}
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    return path
