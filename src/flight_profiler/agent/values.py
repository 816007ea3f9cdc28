"""Render the target's values as short text, inside the target, without keeping them.

A tensor is shown by what matters to an ML engineer (shape, dtype, device, requires_grad,
grad_fn, and a few statistics), never by its data; containers and objects are expanded to a
depth and truncated with counts; every repr is capped. Rendering never raises: whatever fails
is shown as ``<... failed: Error>``, a repr's SystemExit or KeyboardInterrupt included
(shield.py). torch and numpy are found through ``sys.modules`` only
(never imported here).

Statistics (min/max/mean, NaN/Inf counts) are computed under ``torch.no_grad()`` for CPU tensors
of at most ``STATS_MAX_ELEMENTS`` elements; for GPU tensors they would force a device sync in
the middle of the user's step, so they are skipped there, as for huge tensors.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .shield import swallow

MAX_REPR = 200  # characters of one leaf
MAX_ITEMS = 10  # items of one container shown
MAX_TOTAL = 4000  # characters of one rendered value
STATS_MAX_ELEMENTS = 1 << 20

_PRIMITIVES = (type(None), bool, int, float, complex)
_CONTAINERS = (list, tuple, set, frozenset, dict)


def cap(text: str, limit: int = MAX_REPR) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…(+{len(text) - limit} chars)"


def fmt_ms(ms: float) -> str:
    """A duration for humans: ``12.3 ms``, ``0.412 ms``, ``3.1 µs``."""
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 1:
        return f"{ms:.2f} ms"
    if ms >= 0.01:
        return f"{ms:.3f} ms"
    return f"{ms * 1000:.2f} µs"


def safe_repr(value: Any, limit: int = MAX_REPR) -> str:
    try:
        return cap(repr(value), limit)
    except BaseException as exc:
        swallow(exc)
        return f"<repr failed: {type(exc).__name__}>"


def _fmt_number(x: Any) -> str:
    try:
        x = float(x)
    except BaseException as exc:
        swallow(exc)
        return "?"
    if x != x or x in (float("inf"), float("-inf")):
        return str(x)
    return f"{x:.4g}"


def tensor_stats(t: Any, torch: Any) -> str:
    """``min=.. max=.. mean=.. nan=.. inf=..`` for small CPU tensors; a reason otherwise."""
    try:
        if t.layout != torch.strided:
            return "stats skipped (sparse)"
        if t.device.type != "cpu":
            return f"stats skipped ({t.device.type}: would sync)"
        numel = t.numel()
        if numel == 0:
            return "empty"
        if numel > STATS_MAX_ELEMENTS:
            return f"stats skipped ({numel:,} elements)"
        if t.is_complex() or t.dtype == torch.bool:
            return ""
        with torch.no_grad():
            d = t.detach()
            if d.is_floating_point():
                finite = torch.isfinite(d)
                nan = int(torch.isnan(d).sum())
                inf = numel - nan - int(finite.sum())
                ok = d[finite]
                if ok.numel() == 0:
                    return f"nan={nan} inf={inf}"
                text = (
                    f"min={_fmt_number(ok.min())} max={_fmt_number(ok.max())} "
                    f"mean={_fmt_number(ok.float().mean())}"
                )
                if nan or inf:
                    text += f" nan={nan} inf={inf}"
                return text
            return f"min={_fmt_number(d.min())} max={_fmt_number(d.max())}"
    except BaseException as exc:
        swallow(exc)
        return f"stats failed: {type(exc).__name__}"


def render_tensor(t: Any, torch: Any) -> str:
    try:
        kind = type(t).__name__
        label = "tensor" if kind == "Tensor" else kind
        shape = list(t.shape)
        dtype = str(t.dtype).replace("torch.", "")
        parts = [f"shape={shape}", dtype, str(t.device)]
        if t.requires_grad:
            parts.append("requires_grad")
        grad_fn = getattr(t, "grad_fn", None)
        if grad_fn is not None:
            parts.append(f"grad_fn={type(grad_fn).__name__}")
        if getattr(t, "is_meta", False):
            parts.append("meta")
        else:
            stats = tensor_stats(t, torch)
            if stats:
                parts.append(stats)
        return f"{label}({', '.join(parts)})"
    except BaseException as exc:
        swallow(exc)
        return f"<tensor render failed: {type(exc).__name__}>"


def render_ndarray(a: Any) -> str:
    try:
        text = f"ndarray(shape={list(a.shape)}, {a.dtype}"
        if 0 < a.size <= STATS_MAX_ELEMENTS and a.dtype.kind in "fiu":
            text += f", min={_fmt_number(a.min())} max={_fmt_number(a.max())}"
            if a.dtype.kind == "f":
                text += f" mean={_fmt_number(a.mean())}"
        return text + ")"
    except BaseException as exc:
        swallow(exc)
        return f"<ndarray render failed: {type(exc).__name__}>"


def render_exception(exc: BaseException) -> str:
    try:
        message = str(exc)
    except BaseException as failed:
        swallow(failed)
        message = "<str failed>"
    name = type(exc).__qualname__
    return f"{name}: {cap(message)}" if message else name


def _is_module(value: Any, torch: Any) -> bool:
    try:
        return torch is not None and isinstance(value, torch.nn.Module)
    except BaseException as exc:
        swallow(exc)
        return False


# Read off the class's namespace: typed as a plain object, so comparing identities type-checks.
_OBJECT_REPR: object = vars(object)["__repr__"]


def _has_own_repr(value: Any) -> bool:
    return getattr(type(value), "__repr__", _OBJECT_REPR) is not _OBJECT_REPR


_FAST = frozenset({int, float, bool, type(None)})  # exact types whose repr is short and safe


def render(value: Any, depth: int = 1, limit: int = MAX_TOTAL) -> str:
    """``value`` as text: containers/objects expanded ``depth`` levels, capped at ``limit``."""
    kind = type(value)
    if kind in _FAST:  # the common case in a flood of calls: no lookups at all
        return repr(value)
    if (kind is tuple or kind is list) and len(value) <= MAX_ITEMS and all(
            type(v) in _FAST for v in value):  # arguments of plain numbers: shown as Python does
        return cap(repr(value), MAX_REPR if depth <= 0 else limit)
    try:
        return cap(_render(value, depth, sys.modules.get("torch"), sys.modules.get("numpy")), limit)
    except BaseException as exc:  # belt and braces: rendering must never raise
        swallow(exc)
        return f"<render failed: {type(exc).__name__}>"


def _render(value: Any, depth: int, torch: Any, numpy: Any) -> str:
    if isinstance(value, _PRIMITIVES):
        return repr(value)
    if isinstance(value, (str, bytes)):
        return safe_repr(value)
    if torch is not None:
        try:
            if isinstance(value, torch.Tensor):
                return render_tensor(value, torch)
        except BaseException as exc:
            swallow(exc)
            pass
    if numpy is not None:
        try:
            if isinstance(value, numpy.ndarray):
                return render_ndarray(value)
        except BaseException as exc:
            swallow(exc)
            pass
    if isinstance(value, BaseException):
        return render_exception(value)
    if isinstance(value, types.MappingProxyType):  # hooks.py's kwargs of a function without any
        value = dict(value)
    if isinstance(value, _CONTAINERS):
        return _render_container(value, depth, torch, numpy)
    if _is_module(value, torch):
        return f"{type(value).__name__}(nn.Module, training={value.training})"
    if depth > 0 and not _has_own_repr(value):
        attrs = getattr(value, "__dict__", None)
        if isinstance(attrs, dict):
            items = list(attrs.items())
            shown = ", ".join(
                f"{k}={_render(v, depth - 1, torch, numpy)}" for k, v in items[:MAX_ITEMS]
            )
            more = f", …+{len(items) - MAX_ITEMS} more" if len(items) > MAX_ITEMS else ""
            return f"{type(value).__name__}({shown}{more})"
    if _has_own_repr(value):
        return safe_repr(value)
    return f"<{type(value).__module__}.{type(value).__qualname__} object>"


def _render_container(value: Any, depth: int, torch: Any, numpy: Any) -> str:
    n = len(value)
    name = type(value).__name__
    if depth <= 0:
        if n == 0:
            return safe_repr(value)
        if n <= MAX_ITEMS and all(_is_small_leaf(v) for v in _iter_items(value)):
            return safe_repr(value)  # short and flat: as Python shows it
        return f"{name}(len={n})"
    items = []
    for i, item in enumerate(value.items() if isinstance(value, dict) else value):
        if i >= MAX_ITEMS:
            break
        if isinstance(value, dict):
            k, v = item
            items.append(f"{_render(k, 0, torch, numpy)}: {_render(v, depth - 1, torch, numpy)}")
        else:
            items.append(_render(item, depth - 1, torch, numpy))
    more = [f"…+{n - MAX_ITEMS} more"] if n > MAX_ITEMS else []
    body = ", ".join(items + more)
    if isinstance(value, dict):
        return "{" + body + "}" if type(value) is dict else f"{name}({{{body}}})"
    if isinstance(value, list):
        return f"[{body}]" if type(value) is list else f"{name}([{body}])"
    if isinstance(value, tuple):
        if type(value) is not tuple:  # namedtuple and friends: show field names
            fields = getattr(value, "_fields", None)
            if fields and len(fields) == n:
                parts = [f"{f}={_render(v, depth - 1, torch, numpy)}" for f, v in zip(fields[:MAX_ITEMS], value)]
                return f"{name}({', '.join(parts + more)})"
        return f"({body}{',' if n == 1 else ''})"
    return f"{name}({{{body}}})" if n else f"{name}()"


def _is_small_leaf(value: Any) -> bool:
    return isinstance(value, _PRIMITIVES) or (isinstance(value, (str, bytes)) and len(value) <= 40)


def _iter_items(value: Any) -> Any:
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield v
    else:
        yield from value
