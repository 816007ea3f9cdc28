"""values.render: torch-aware, bounded, never raising, never importing torch itself."""

from __future__ import annotations

import collections
import subprocess
import sys

import pytest

from flight_profiler.agent import values
from flight_profiler.agent.values import MAX_ITEMS, render

torch = pytest.importorskip("torch")


def test_tensor_shows_metadata_and_stats_not_data() -> None:
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]], requires_grad=True)
    y = x * 2
    text = render(y)
    assert text.startswith("tensor(shape=[2, 2], float32, cpu, requires_grad, grad_fn=MulBackward0")
    assert "min=-4 max=8 mean=3" in text
    assert "[[" not in text  # no data dump


def test_nan_and_inf_are_counted() -> None:
    t = torch.tensor([1.0, float("nan"), float("inf"), float("-inf"), 3.0])
    assert render(t).endswith("min=1 max=3 mean=2 nan=1 inf=2)")
    assert "nan=2 inf=0" in render(torch.tensor([float("nan")] * 2))


def test_integer_bool_parameter_and_empty_tensors() -> None:
    assert render(torch.arange(5)) == "tensor(shape=[5], int64, cpu, min=0 max=4)"
    assert render(torch.ones(2, dtype=torch.bool)) == "tensor(shape=[2], bool, cpu)"
    assert render(torch.nn.Parameter(torch.ones(3))).startswith("Parameter(shape=[3], float32, cpu, requires_grad")
    assert render(torch.empty(0, 3)) == "tensor(shape=[0, 3], float32, cpu, empty)"


def test_huge_and_meta_tensors_skip_stats() -> None:
    big = torch.empty(values.STATS_MAX_ELEMENTS + 1)
    assert "stats skipped (1,048,577 elements)" in render(big)
    assert render(torch.empty(4, device="meta")) == "tensor(shape=[4], float32, meta, meta)"


def test_stats_do_not_record_autograd_history() -> None:
    x = torch.ones(3, requires_grad=True)
    render(x)
    assert x.grad_fn is None and x.grad is None


def test_containers_truncated_with_counts_and_expanded_to_depth() -> None:
    assert render(list(range(30))) == "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, …+20 more]"
    assert render({"a": [1, [2, 3]]}, depth=1) == "{'a': list(len=2)}"
    assert render({"a": [1, [2, 3]]}, depth=3) == "{'a': [1, [2, 3]]}"
    assert render([1, 2], depth=0) == "[1, 2]"  # short and flat: shown as is
    assert render(list(range(MAX_ITEMS + 1)), depth=0) == f"list(len={MAX_ITEMS + 1})"


def test_objects_namedtuples_modules_and_exceptions() -> None:
    class Batch:
        def __init__(self) -> None:
            self.x = torch.zeros(2)
            self.ids = [1, 2]

    point = collections.namedtuple("Point", "x y")(1, 2)
    assert render(Batch()).startswith("Batch(x=tensor(shape=[2], float32, cpu, min=0 max=0 mean=0), ids=[1, 2])")
    assert render(Batch(), depth=0).endswith("Batch object>")
    assert render(point) == "Point(x=1, y=2)"
    assert render(torch.nn.Linear(2, 2)) == "Linear(nn.Module, training=True)"
    assert render(ValueError("bad batch")) == "ValueError: bad batch"


def test_long_repr_is_capped() -> None:
    text = render("x" * 10_000)
    assert len(text) < values.MAX_REPR + 40 and text.endswith("…(+9802 chars)")
    assert len(render([("y" * 150) for _ in range(100)], depth=1)) <= values.MAX_TOTAL + 30


def test_rendering_never_raises() -> None:
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")

        def __len__(self) -> int:
            raise RuntimeError("no")

    assert render(Hostile()) == "<repr failed: RuntimeError>"
    assert render([Hostile()]) == "[<repr failed: RuntimeError>]"


def test_values_module_never_imports_torch() -> None:
    code = (
        "import sys; from flight_profiler.agent.values import render; "
        "print(render([1, {'a': 2}]), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[1, {'a': 2}] False", out.stderr
