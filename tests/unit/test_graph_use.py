"""agent/graph_use.py: calls of a method whose graphs no backward reads, seen live (an
evaluation pass without torch.no_grad() between training steps), and the report's finding."""

from __future__ import annotations

import gc
import sys
import types
import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from flight_profiler.agent import graph_cost, graph_use, hooks, targets  # noqa: E402
from flight_profiler.report.live_loop import graph_use_finding  # noqa: E402

MOD = "fp_test_graph_use_prog"


class Net(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x: Any) -> Any:
        return self.fc2(torch.relu(self.fc1(x)))


def _validate(model: Any, batches: int, no_grad: bool) -> None:
    model.eval()
    for _ in range(batches):
        if no_grad:
            with torch.no_grad():
                model(torch.randn(8, 16))
        else:
            model(torch.randn(8, 16))
    model.train()


def _train(model: Any, opt: Any, steps: int) -> None:
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        opt.step()


def _follow(use: Any, *followed: Any) -> list[Any]:
    """The hooks torch dataloader installs: the followed forwards, and the backward passes."""
    from flight_profiler.agent.step_marks import BACKWARD_SPEC

    return [*(hooks.install(t, use.on_enter, use.on_exit) for t in followed),
            hooks.install(targets.resolve(BACKWARD_SPEC), use.on_backward_enter, use.on_backward_exit)]


def _run(no_grad: bool, epochs: int = 3) -> dict[str, Any]:
    mod = types.ModuleType(MOD)
    mod.Net = Net  # type: ignore[attr-defined]
    sys.modules[MOD] = mod
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    use = graph_use.GraphUse(torch)
    removes = _follow(use, targets.resolve({"module": MOD, "class": "Net", "method": "forward",
                                            "nested": None}))
    try:
        for _ in range(epochs):
            _train(model, opt, 10)
            _validate(model, 4, no_grad)
    finally:
        for remove in removes:
            remove()
        use.close()
        del sys.modules[MOD]
    # the hooks' own time, which the DataLoader's timed share takes out of the loop
    assert 0 < use.overhead_s < 5
    return use.summary("Net.forward")


def test_validation_without_no_grad_is_unread_and_training_is_read() -> None:
    s = _run(no_grad=False)
    assert s["calls"] == 42 and s["grad_calls"] == 42
    # the last epoch's validation calls come after the last read graph: not judged
    assert s["judged"] == 30 + 8 - 1 and s["unused"] == 8 and s["used"] == 29
    assert s["longest_unused_run"] == 4 and s["unused_saved_bytes_per_call"] > 0
    (place,) = s["unused_where"]
    assert place["function"] == "_validate" and place["file"] == __file__ and place["calls"] == 8
    f = graph_use_finding(s, ["diagnose.json"])
    assert f is not None and f.rule == "eval-with-grad" and f.severity == "warning"
    assert f.where[0].startswith("_validate at test_graph_use.py:")


def test_healthy_loop_reads_every_graph_and_gets_no_finding() -> None:
    s = _run(no_grad=True)
    assert s["no_grad_calls"] == 12 and s["unused"] == 0 and s["used"] == s["judged"] == 29
    assert graph_use_finding(s, ["diagnose.json"]) is None


def test_no_finding_without_a_training_step_or_from_hostile_data() -> None:
    inference = {"calls": 10, "judged": 0, "used": 0, "unused": 0}
    assert graph_use_finding(inference, []) is None
    assert graph_use_finding({"unused": "9", "used": -1, "judged": None}, []) is None
    assert graph_use_finding(None, []) is None


def _measured(kind: str, f: Any) -> Any:
    """``f()`` inside one measured call, as torch grads (graph_cost) or the live window
    (graph_use) measure it."""
    if kind == "cost":
        cost = graph_cost.CallGraphCost(torch)
        cost.enter()
        try:
            return f()
        finally:
            cost.exit()
    use = graph_use.GraphUse(torch)
    token = use.on_enter((), {})
    try:
        return f()
    finally:
        use.on_exit(token, None, None, 0)


@pytest.mark.parametrize("kind", ["cost", "use"])
def test_measured_graphs_are_freed_like_unmeasured_ones(kind: str) -> None:
    # A saved output returned as is by the pack hook holds its own grad_fn: a cycle through C++
    # that gc never frees (every evaluation output measured lived forever).
    w = torch.randn(32, 32, requires_grad=True)
    refs = []
    for _ in range(5):
        out = _measured(kind, lambda: torch.sigmoid(torch.randn(4, 32) @ w))
        refs.append(weakref.ref(out))
        del out
    gc.collect()
    assert [r() for r in refs] == [None] * 5


@pytest.mark.parametrize("kind", ["cost", "use"])
def test_autograd_is_unchanged_by_the_measurement(kind: str) -> None:
    a = torch.randn(10, requires_grad=True)
    # gradients and double backward as without hooks (tanh saves its output)
    y = _measured(kind, lambda: torch.tanh(torch.relu(a * 2)).pow(2).sum())
    (g,) = torch.autograd.grad(y, a, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), a)
    b = a.detach().requires_grad_()
    (g0,) = torch.autograd.grad(torch.tanh(torch.relu(b * 2)).pow(2).sum(), b, create_graph=True)
    (gg0,) = torch.autograd.grad(g0.sum(), b)
    assert torch.allclose(g, g0) and torch.allclose(gg, gg0)
    # a program that modifies a saved tensor in place gets torch's error, not wrong gradients
    s = _measured(kind, lambda: (a * 1).sigmoid())
    s.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        s.sum().backward()
    # in-place ops that torch accepts stay accepted (the DCGAN's ReLU(True), LeakyReLU inplace)
    r = _measured(kind, lambda: torch.nn.ReLU(True)(a * 1) * 3
                  + torch.nn.functional.leaky_relu(a * 2, 0.2, inplace=True).exp())
    r.sum().backward()
    assert a.grad is not None


class Wrapper(torch.nn.Module):  # type: ignore[misc]
    """Shaped like DDP: the model as ``.module``, training through the wrapper."""

    def __init__(self, module: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Any) -> Any:
        return self.module(x)


def test_a_step_named_follows_the_models_forward_wherever_the_loop_calls_it() -> None:
    # An optimizer step saves nothing for backward, and the evaluation pass runs outside it:
    # following the step's own calls could never see it (issue 18: 0 of 3 on the DDP trainer
    # and the LBFGS program with the step named).
    from flight_profiler.agent.commands import torch_dataloader

    mod = types.ModuleType(MOD)
    mod.Net = Net  # type: ignore[attr-defined]
    sys.modules[MOD] = mod
    model = Wrapper(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = {"module": "torch.optim.sgd", "class": "SGD", "method": "step", "nested": None}
    followed = torch_dataloader._followed(torch, step)
    names = [t.description for t in followed]
    assert f"{__name__}.Wrapper.forward" in names and f"{__name__}.Net.forward" in names
    assert "torch.optim.sgd.SGD.step" not in names
    # a module's own method is followed as named
    named = {"module": MOD, "class": "Net", "method": "forward", "nested": None}
    assert [t.description for t in torch_dataloader._followed(torch, named)] == [f"{MOD}.Net.forward"]
    use = graph_use.GraphUse(torch)
    removes = _follow(use, *followed)
    try:
        for _ in range(3):
            _train(model, opt, 10)
            model.module.eval()
            for _ in range(4):  # validation on the inner model, without no_grad
                model.module(torch.randn(8, 16))
            model.module.train()
    finally:
        for remove in removes:
            remove()
        use.close()
        del sys.modules[MOD]
    s = use.summary(", ".join(names))
    # training calls through the wrapper count once (the inner call nests in it)
    assert s["calls"] == 42 and s["unused"] == 8 and s["used"] == 29, s
    assert graph_use_finding(s, []) is not None


def test_a_summary_taken_during_a_backward_waits_for_it() -> None:
    # An actor-critic episode: 20 forwards, then one backward over all of them, which reads
    # the newest call's graph first. The window closes in the middle of that backward (the
    # agent's thread, while the training thread is inside it): the calls not yet read must not
    # be judged unread (they were, 32 of 2612, an eval-with-grad false alarm on a healthy loop).
    import threading
    import time

    from flight_profiler.agent.step_marks import BACKWARD_SPEC

    mod = types.ModuleType(MOD)
    mod.Net = Net  # type: ignore[attr-defined]
    sys.modules[MOD] = mod
    model = Net()
    use = graph_use.GraphUse(torch)
    removes = [hooks.install(targets.resolve({"module": MOD, "class": "Net", "method": "forward",
                                              "nested": None}), use.on_enter, use.on_exit),
               hooks.install(targets.resolve(BACKWARD_SPEC), use.on_backward_enter,
                             use.on_backward_exit)]
    taken: dict[str, Any] = {}

    def agent_side() -> None:
        use.close()
        taken["settled"] = use.settle(5.0)
        taken["summary"] = use.summary("Net.forward")

    def episode(mid_backward: Any = None) -> None:
        outs = [model(torch.randn(1, 16)) for _ in range(20)]
        if mid_backward is not None:
            outs[10].register_hook(mid_backward)
        torch.stack(outs).sum().backward()

    def close_now(grad: Any) -> Any:
        t = threading.Thread(target=agent_side)
        t.start()
        time.sleep(0.2)  # the rest of the backward, while the agent's thread summarises
        taken["thread"] = t
        return grad

    try:
        episode()
        episode()
        episode(close_now)
    finally:
        for remove in removes:
            remove()
        del sys.modules[MOD]
    taken["thread"].join(5)
    s = taken["summary"]
    assert taken["settled"] is True
    assert s["calls"] == 60 and s["judged"] == 59
    assert s["unused"] == 0 and s["used"] == 59
    assert graph_use_finding(s, ["diagnose.json"]) is None


class Critic(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LeakyReLU(0.2, inplace=True),
                                         torch.nn.Linear(32, 1))

    def forward(self, x: Any) -> Any:
        return self.model(x)


def test_a_window_closing_between_a_penalty_and_its_backward_judges_nothing_of_that_step() -> None:
    # PyTorch-GAN's wgan_gp.py: the critic's step calls the generator, the critic on real and
    # fake images, and the critic again on interpolates whose gradient penalty autograd.grad
    # reads at once; the step's backward reads the other graphs after. A window closing between
    # the two judged the three calls before the penalty unread (a later call's graph was read):
    # an eval-with-grad false alarm on a healthy WGAN (CI of stop 37, "3 of 259 calls").
    mod = types.ModuleType(MOD)
    mod.Net, mod.Critic = Net, Critic  # type: ignore[attr-defined]
    sys.modules[MOD] = mod
    generator, critic = Net(), Critic()
    opt_g = torch.optim.Adam(generator.parameters())
    opt_d = torch.optim.Adam(critic.parameters())
    use = graph_use.GraphUse(torch)
    removes = _follow(use, *(targets.resolve({"module": MOD, "class": c, "method": "forward",
                                              "nested": None}) for c in ("Net", "Critic")))

    def critic_step(close_before_backward: bool) -> None:
        real = torch.randn(8, 16)
        opt_d.zero_grad()
        fake = generator(torch.randn(8, 16)).repeat(1, 4)
        real_validity, fake_validity = critic(real), critic(fake)
        alpha = torch.rand(8, 1)
        inter = (alpha * real + (1 - alpha) * fake.detach()).requires_grad_(True)
        out = critic(inter)
        grads = torch.autograd.grad(out, inter, torch.ones_like(out), create_graph=True,
                                    retain_graph=True)[0]
        penalty = ((grads.norm(2, dim=1) - 1) ** 2).mean()
        if close_before_backward:
            use.close()
            assert use.settle(1.0)
            summaries.append(use.summary("Net.forward, Critic.forward"))
        (-real_validity.mean() + fake_validity.mean() + 10 * penalty).backward()
        opt_d.step()

    def generator_step() -> None:
        opt_g.zero_grad()
        (-critic(generator(torch.randn(8, 16)).repeat(1, 4)).mean()).backward()
        opt_g.step()

    summaries: list[dict[str, Any]] = []
    try:
        for i in range(10):
            critic_step(False)
            if i % 5 == 0:
                generator_step()
        critic_step(True)
    finally:
        for remove in removes:
            remove()
        del sys.modules[MOD]
    (s,) = summaries
    # 10 critic steps of 4 calls, 2 generator steps of 2, and the last step's 4
    assert s["calls"] == 48 and s["grad_calls"] == 48
    # the 44 calls of the finished steps judged and read, none of the last step's
    assert s["judged"] == 44 and s["used"] == 44 and s["unused"] == 0, s
    assert graph_use_finding(s, ["diagnose.json"]) is None
