"""Gradient and weight health of the models a target holds (``torch grads``).

Models are found the way the census finds tensors: one pass over the gc-tracked objects
(nn.Module instances are gc-tracked), keeping the roots (modules no other found module holds as
a submodule); they are named by the census's holder walk (holder_paths), by the path to the
module itself. Per parameter, in module order: grad norm, max |grad|, NaN/Inf counts (only
counted where a norm came out non-finite: a finite norm proves there are none), weight norm.

Cost: three reductions per parameter (norm, aminmax, weight norm) and ONE device->host copy for
the whole model (a per-parameter ``.item()`` would synchronise CUDA hundreds of times).
Nothing here is kept after a measurement: results are plain floats and strings.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from . import holder_paths
from .gc_walk import GcWalk

MAX_LAYERS = 2000


def find_models(torch: Any, seconds: float = 5.0) -> list[tuple[Any, list[tuple[str, Any]]]]:
    """[(root module, [(qualified param name, param)] in module order)], biggest model first."""
    module_type = torch.nn.Module
    found = list(GcWalk(module_type, deadline=time.monotonic() + seconds))
    children: set[int] = set()
    for m in found:
        try:
            children.update(id(c) for c in m._modules.values() if c is not None)
        except Exception:  # a half-built module
            continue
    models = []
    for m in found:
        if id(m) in children:
            continue
        try:
            params = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
        except Exception:
            continue
        if params:
            models.append((m, params))
    found.clear()
    models.sort(key=lambda mp: -sum(p.numel() for _, p in mp[1]))
    return models


def name_models(torch: Any, models: list[tuple[Any, list[tuple[str, Any]]]], seconds: float = 3.0) -> list[str]:
    """Each model's holder path (``main() local trainer.model``), or its class name if unreached.

    The walk looks for the root modules themselves: a path to one of their parameters could run
    through anything else holding it (an optimizer's param_groups, a loop's local ``p``) and say
    nothing about where the model lives.
    """
    wanted = {id(module): module for module, _ in models}
    # skip_thread=None: when this runs at the main thread's safe point, the program's own
    # locals are in that thread; the agent's frames are left out by module name.
    w = holder_paths.walk(torch, wanted, 2_000_000, 12, time.monotonic() + seconds, skip_thread=None)
    names = []
    for module, _ in models:
        found = w.path(id(module))
        names.append(found[0] if found is not None else f"<{type(module).__name__} at {id(module):#x}>")
    wanted.clear()
    w.parent.clear()
    w.found.clear()
    return names


def describe(models: list[tuple[Any, list[tuple[str, Any]]]], names: list[str]) -> list[dict[str, Any]]:
    out = []
    for (module, params), name in zip(models, names):
        layers = [{"name": n, "shape": list(p.shape), "numel": p.numel(), "dtype": str(p.dtype).replace("torch.", ""),
                   "device": str(p.device)} for n, p in params[:MAX_LAYERS]]
        out.append({"name": name, "class": f"{type(module).__module__}.{type(module).__qualname__}",
                    "params": len(params), "numel": sum(p.numel() for _, p in params),
                    "layers": layers, "layers_left_out": max(0, len(params) - MAX_LAYERS)})
    return out


def measure(torch: Any, params: list[tuple[str, Any]]) -> dict[str, Any]:
    """One model's figures now. Rows: [grad_norm, grad_max_abs, nan, inf, weight_norm] or None
    (no grad) per parameter; totals computed as torch.nn.utils.clip_grad_norm_ does (L2 of L2s)."""
    started = time.perf_counter()
    scalars: list[Any] = []
    kinds: list[int] = []  # per parameter: 0 unreadable, 1 weight only (no grad), 2 grad and weight
    with torch.no_grad():
        for _, p in params[:MAX_LAYERS]:
            try:
                figures = _scalars(torch, p)
            except Exception:  # meta/fake/odd tensors: left out, said in "unreadable"
                figures = []
            kinds.append({1: 1, 3: 2}.get(len(figures), 0))
            scalars += figures
        values = torch.stack([s.to("cpu") for s in scalars]).tolist() if scalars else []
        del scalars
        rows: list[list[float] | None] = []
        weight_norms: list[float | None] = []
        k = 0
        for (_, p), kind in zip(params, kinds):
            if kind != 2:
                rows.append(None)
                weight_norms.append(values[k] if kind == 1 else None)
                k += kind
                continue
            gn, gmax, wn = values[k:k + 3]
            k += 3
            nan = inf = 0
            if not (math.isfinite(gn) and math.isfinite(gmax)):
                g = p.grad
                if g is not None:  # cleared by another thread meanwhile
                    if g.is_sparse:
                        g = g.coalesce()._values()
                    nan, inf = int(torch.isnan(g).sum()), int(torch.isinf(g).sum())
                del g
            rows.append([gn, gmax, nan, inf, wn])
            weight_norms.append(wn)
    grads = [r[0] for r in rows if r is not None]
    total = math.sqrt(sum(x * x for x in grads)) if grads else None
    bad_weights = [i for i, wn in enumerate(weight_norms) if wn is not None and not math.isfinite(wn)]
    return {
        "grad_norm": _num(total),
        "weight_norm": _num(math.sqrt(sum(x * x for x in weight_norms if x is not None and math.isfinite(x)))),
        "with_grad": len(grads), "without_grad": sum(1 for kind in kinds if kind == 1),
        "unreadable": sum(1 for kind in kinds if kind == 0),
        "nonfinite_grad_layers": sum(1 for r in rows if r is not None and (r[2] or r[3] or not math.isfinite(r[0]))),
        "nonfinite_weight_layers": len(bad_weights),
        "layers": [None if r is None else [_num(r[0]), _num(r[1]), r[2], r[3], _num(r[4])] for r in rows],
        "weight_norms": [_num(x) for x in weight_norms],
        "elapsed_s": round(time.perf_counter() - started, 4),
        "thread": threading.current_thread().name,
    }


def _norm(torch: Any, t: Any) -> Any:
    """The L2 norm of ``t`` as a 0-d float64 tensor: half precision is summed in float32 (its own
    range overflows on a few thousand large values), float32/float64 in their own dtype (torch
    refuses a narrowing ``dtype=``: a float64 model, as `model.double()` makes, was unreadable)."""
    if t.numel() == 0:
        return t.new_zeros((), dtype=torch.float64)
    if t.dtype in (torch.float16, torch.bfloat16):
        return torch.linalg.vector_norm(t, dtype=torch.float32).to(torch.float64)
    return torch.linalg.vector_norm(t).to(torch.float64)


def _scalars(torch: Any, p: Any) -> list[Any]:
    """[weight norm] (no grad) or [grad norm, max |grad|, weight norm], as 0-d float64 tensors.
    Sparse gradients (nn.Embedding(sparse=True)) are measured on their values."""
    w = p.detach()
    if w.is_meta:
        raise ValueError("a meta tensor has no values")
    wn = _norm(torch, w)
    g = p.grad
    if g is None or g.numel() == 0:
        return [wn]
    if g.is_sparse:
        g = g.coalesce()._values()
        if g.numel() == 0:
            return [wn]
    lo, hi = torch.aminmax(g)
    return [_norm(torch, g), torch.maximum(lo.abs(), hi.abs()).to(torch.float64), wn]


def _num(x: float | None) -> float | str | None:
    """JSON has no NaN/Infinity: non-finite values travel as strings."""
    if x is None:
        return None
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(f"{x:.6g}")
