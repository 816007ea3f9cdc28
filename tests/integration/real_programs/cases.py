"""The realistic programs of this folder, how a user would point diagnose at them, and what a
right diagnosis says: shared by tests/integration/test_real_programs.py and
bench/bench_real_programs.py.

Each program is written the way the field's tutorials and example repositories write it (not
shaped to the tool) and runs healthy, or with `--mistake` with one classic user mistake planted.
A user names the model's `forward`, the step (the optimizer's step when the program has no step
function of its own), or nothing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SEVERE = ("warning", "critical")


@dataclass(frozen=True)
class Expected:
    """What a right diagnosis of the planted mistake says."""

    rules: tuple[str, ...]                 # one of these rules, at warning or above
    holder: str | None = None              # a substring of the finding's holder/where/summary
    fix: tuple[str, ...] = ()              # each a substring of the finding's fix text
    why: str = ""
    also: tuple[str, ...] = ()             # other rules that may rightly fire beside it


@dataclass(frozen=True)
class Program:
    name: str
    ready: str                             # a regex of its own log output once it trains
    forward: tuple[str, ...]               # `module [class] method` of the model's forward
    step: tuple[str, ...]                  # the step: its own function, else the optimizer's
    mistake: Expected
    args: tuple[str, ...] = ()
    notes: str = ""
    methods: dict[str, tuple[str, ...]] = field(default_factory=dict)
    nproc: int = 0                         # > 0: started by torchrun with this many ranks
    script_name: str = ""                  # another program's script (run with ``args``)
    spawn: bool = False                    # with nproc: ranks started by the script itself
                                           # (torch.multiprocessing.spawn), not by torchrun
    by_chance: str = ""                    # why the mistake is seen only when the diagnosis's
                                           # windows happen to hold it (the test suite skips it)
    reset_every: str = ""                  # why one diagnosis may miss it: the mistake's holder
                                           # is reset periodically (the test suite tries twice)

    @property
    def distributed(self) -> bool:
        return self.nproc > 0

    def targets(self) -> dict[str, tuple[str, ...]]:
        """How users point diagnose at it; a distributed job also as a whole (--all-ranks)."""
        out = {"forward": self.forward, "step": self.step, "none": ()}
        if self.distributed:
            out["all-ranks"] = ()
        return out

    def options(self, method: str) -> tuple[str, ...]:
        return ("--all-ranks",) if method == "all-ranks" else ()

    @property
    def script(self) -> Path:
        return HERE / f"{self.script_name or self.name}.py"


PROGRAMS: dict[str, Program] = {p.name: p for p in (
    Program(
        "word_language_model", r"\| epoch +1 \| +20/",
        forward=("__main__", "RNNModel", "forward"), step=("__main__", "get_batch"),
        mistake=Expected(("graph-chain",), holder="train() local hidden",
                         fix=("detach",), also=("memory-leak",),
                         why="hidden state carried across batches without repackage_hidden"),
        notes="no step function (the loop is inline in train()); get_batch is called once a step"),
    Program(
        "dcgan", r"\[0\]\[20/",
        forward=("__main__", "Generator", "forward"), step=("torch.optim.adam", "Adam", "step"),
        mistake=Expected(("graph-retention", "memory-leak"), holder="_losses[*]",
                         fix=(".item()",), also=("memory-leak", "graph-retention"),
                         why="G_losses.append(errG): tensors, not numbers"),
        notes="module-level script; two Adam optimizers, so Adam.step runs twice a step"),
    Program(
        "time_sequence_prediction", r"STEP:  3\b",
        forward=("__main__", "Sequence", "forward"), step=("torch.optim.lbfgs", "LBFGS", "step"),
        mistake=Expected(("eval-with-grad",), fix=("no_grad",),
                         why="the prediction after each step runs with autograd on"),
        notes="LBFGS: forward runs several times a step inside the closure; its history is capped"),
    Program(
        "transformer_grad_accum", r"\| epoch +1 \| +40/",
        forward=("__main__", "TransformerModel", "forward"),
        step=("torch.optim.adamw", "AdamW", "step"),
        mistake=Expected(("graph-retention", "graph-chain", "memory-leak"),
                         holder="running_loss", fix=(".item()",),
                         also=("memory-leak", "graph-retention", "graph-chain"),
                         why="running_loss += loss keeps every micro-batch's graph"),
        notes="gradient accumulation: 4 forwards and backwards per optimizer step"),
    Program(
        "amp_classifier", r"Epoch: \[0\]\[ +20/",
        forward=("__main__", "Net", "forward"), step=("torch.optim.sgd", "SGD", "step"),
        mistake=Expected(("grad-health",), holder="zero_grad", fix=("zero_grad",),
                         why="optimizer.zero_grad() lost: gradients accumulate"),
        notes="DataLoader with 2 workers; autocast/GradScaler enabled only on CUDA"),
    Program(
        "vae", r"Train Epoch: 1 \[3840/",
        forward=("__main__", "VAE", "forward"), step=("torch.optim.adam", "Adam", "step"),
        mistake=Expected(("graph-chain",), holder="train_loss", fix=(".item()",),
                         why="train_loss += loss: the epoch's running sum chains every step's graph"),
        notes="pytorch/examples' VAE: train(epoch) resets its running sum at each epoch (~6 s); "
              "DataLoader with 2 persistent workers"),
    Program(
        "actor_critic", r"Episode 20\t",
        forward=("__main__", "Policy", "forward"), step=("__main__", "finish_episode"),
        mistake=Expected(("graph-retention", "memory-leak"), holder="episode_losses",
                         fix=(".item()",), also=("memory-leak", "graph-retention"),
                         why="episode_losses.append(loss): each episode's whole graph kept for a plot"),
        notes="pytorch/examples' actor-critic: forward once per environment step, the episode's "
              "graphs held in model.saved_actions until finish_episode() backpropagates and "
              "clears them (a buffer, not a leak); its policy collapses to ~10-step episodes"),
    Program(
        "char_rnn_classification", r"(?m)^1000 ",
        forward=("__main__", "RNN", "forward"), step=("__main__", "train"),
        mistake=Expected(("grad-health",), holder="zero_grad", fix=("zero_grad",),
                         why="rnn.zero_grad() forgotten: every name's gradient adds to the last"),
        notes="the PyTorch tutorial's name classifier: one name a step, forward once per "
              "character, a hand-written SGD update (no optimizer object); with the mistake the "
              "loss is nan within 500 names"),
    Program(
        "dqn", r"Episode 20\t",
        forward=("__main__", "DQN", "forward"), step=("__main__", "optimize_model"),
        mistake=Expected(("grad-health",), holder="target_net", fix=("no_grad",),
                         why="the target network's forward runs with grad: backward fills its "
                             "gradients, which no optimizer zeroes"),
        notes="the PyTorch DQN tutorial: a capped replay memory (deque, 10,000) filling for the "
              "first ~20 s, optimize_model() once per environment step, a soft target update"),
    Program(
        "dqn_ring_buffer", r"Episode 20\t",
        forward=("__main__", "DQN", "forward"), step=("__main__", "optimize_model"),
        mistake=Expected(("grad-health",), holder="target_net", fix=("no_grad",),
                         why="the target network's forward runs with grad"),
        args=("--ring-buffer",), script_name="dqn",
        notes="the DQN tutorial's older replay memory, much copied: a plain list used as a ring "
              "buffer up to `capacity`, which nothing marks as capped; it grows for ~20 s"),
    Program(
        "neural_style", r"run \[100\]",
        forward=("torch.nn.modules.container", "Sequential", "forward"),
        step=("torch.optim.lbfgs", "LBFGS", "step"),
        mistake=Expected(("grad-health",), fix=("requires_grad_(False)",),
                         why="the extractor is not frozen: backward fills its weights' gradients, "
                             "which nothing steps or zeroes"),
        notes="the PyTorch neural-transfer tutorial: LBFGS over the input image, a frozen "
              "feature extractor (an nn.Sequential) whose loss modules store self.loss at each "
              "forward; no trainable model"),
    Program(
        "transfer_learning", r"train Loss",
        forward=("__main__", "ResNet", "forward"), step=("torch.optim.sgd", "SGD", "step"),
        mistake=Expected(("grad-health",), holder="conv1.weight", fix=("requires_grad = False",),
                         why="the backbone's freezing loop left out while the optimizer gets "
                             "model_conv.fc.parameters() only: backward fills and adds up the "
                             "backbone's gradients, which the optimizer neither steps nor zeroes"),
        notes="the PyTorch transfer-learning tutorial's fixed feature extractor: train_model() "
              "with a train and a val phase per epoch under set_grad_enabled, DataLoaders of 2 "
              "workers, a StepLR, the best weights deep-copied"),
    Program(
        "mnist", r"Train Epoch: 1 \[3200/",
        forward=("__main__", "Net", "forward"), step=("torch.optim.adadelta", "Adadelta", "step"),
        mistake=Expected(("dataloader-bottleneck",), fix=("num_workers",),
                         why="augmentation added with the example's CPU num_workers=0: each batch's "
                             "transforms run in the training process, ~35 % of the loop"),
        notes="pytorch/examples' MNIST: workers only on CUDA, so num_workers=0 on a CPU; "
              "synthetic digits read as uint8 arrays, ToTensor and Normalize; test() each epoch"),
    Program(
        "pinn_burgers", r"Iter 200,",
        forward=("__main__", "DNN", "forward"),
        step=("__main__", "PhysicsInformedNN", "loss_func"),
        mistake=Expected(("graph-retention", "memory-leak"), holder="loss_history",
                         fix=(".item()",), also=("memory-leak", "graph-retention"),
                         why="self.loss_history.append(loss): every closure's graph kept for a plot"),
        notes="a PINN as the PyTorch ports of Raissi's write it: the residual by autograd.grad "
              "(create_graph=True), ONE LBFGS step of max_iter=50000 running for minutes, so the "
              "step a user names is the closure (loss_func); no optimizer step ends in a window"),
    Program(
        "char_rnn_generation", r"\(40 ",
        forward=("__main__", "RNN", "forward"), step=("__main__", "train"),
        mistake=Expected(("graph-retention", "memory-leak", "graph-chain"), holder="loss",
                         fix=(".item()",), also=("memory-leak", "graph-retention", "graph-chain"),
                         why="train() returns the loss tensor: loss_avg sums 20 steps' graphs and "
                             "all_losses keeps every sum"),
        notes="practical-pytorch's char-rnn-generation: a GRU's forward once per character of a "
              "200-character chunk, losses summed in Python, Adam, a sample every 20 steps",
        reset_every="loss_avg = 0 every 20 steps (~5 s): a census taken in the step after the "
                    "reset sees no loss_avg tensor, and one straddling it no chain (CI of stop 38: "
                    "loss_avg absent from census-after, no link proven)"),
    Program(
        "wgan_gp", r"\[Epoch 1/",
        forward=("__main__", "Generator", "forward"), step=("torch.optim.adam", "Adam", "step"),
        mistake=Expected(("grad-health",), holder="zero_grad", fix=("zero_grad",),
                         why="optimizer_D.zero_grad() lost: the critic's gradients accumulate"),
        notes="PyTorch-GAN's wgan_gp.py: the gradient penalty by autograd.grad(create_graph=True), "
              "the critic stepped every batch and the generator every 5th (two Adams), "
              "fake images not detached for the critic, num_workers=0"),
    Program(
        "language_model", r"Epoch \[1/1000\], Step\[30/",
        forward=("__main__", "RNNLM", "forward"), step=("torch.optim.adam", "Adam", "step"),
        mistake=Expected(("graph-chain", "graph-retention", "memory-leak"), holder="total_loss",
                         fix=(".item()",), also=("memory-leak", "graph-retention", "graph-chain"),
                         why="total_loss += loss: the epoch's sum for the perplexity print chains "
                             "every step's graph"),
        notes="yunjey/pytorch-tutorial's language model: module-level loop, nn.LSTM(batch_first), "
              "states = detach(states), Adam, clip_grad_norm_; an epoch every ~2 s"),
    Program(
        "lbfgs_regression", r"epoch +10 ",
        forward=("__main__", "MLP", "forward"), step=("torch.optim.lbfgs", "LBFGS", "step"),
        mistake=Expected(("graph-retention", "memory-leak"), holder="history", fix=(".item()",),
                         also=("memory-leak", "graph-retention"),
                         why="history.append(optimizer.step(closure)): the returned loss keeps "
                             "its graph"),
        notes="full-batch LBFGS (strong Wolfe) as forum answers write it: train() holds the "
              "loop, the closure is a local function, the loss step() returns is logged"),
    Program(
        "seq2seq_translation", r"\(400\) ",
        forward=("__main__", "AttnDecoderRNN", "forward"), step=("__main__", "train"),
        mistake=Expected(("eval-with-grad",), fix=("no_grad",),
                         why="evaluate() without torch.no_grad(): every translation builds a graph"),
        notes="the PyTorch seq2seq-with-attention tutorial: encoder and decoder forward one token "
              "at a time, two SGD optimizers, evaluateRandomly() every 200 pairs (~4 s)",
        by_chance="evaluateRandomly() runs every ~5-7 s under the tool; the live look at the "
                  "loop (2-3 s) and the profile's steps hold one in about 1 run of 3"),
    Program(
        "ddp_spawn", r"\[rank 0\] \[1,   100\]",
        forward=("__main__", "ToyModel", "forward"), step=("torch.optim.sgd", "SGD", "step"),
        mistake=Expected(("grad-health",), holder="ddp_model", fix=("ddp_model(inputs)",),
                         why="the loop calls the module DDP wraps (`model(inputs)`): no backward "
                             "all-reduces, each rank trains its own copy"),
        nproc=2, spawn=True,
        notes="the PyTorch DDP tutorial's ToyModel, demo_basic(rank, world_size) started by "
              "torch.multiprocessing.spawn (no torchrun, no RANK in the environment); gloo; "
              "diagnosed on rank 0's pid, the first spawned child"),
    Program(
        "ddp_set_epoch", r"\[rank 0\] \[1,   100\]",
        forward=("__main__", "ToyModel", "forward"), step=("torch.optim.sgd", "SGD", "step"),
        mistake=Expected(("missing-set-epoch",), holder="DataLoader",
                         fix=("set_epoch(epoch)",),
                         why="`sampler.set_epoch(epoch)` left out: every epoch shuffles the same "
                             "way on every rank"),
        args=("--mistake_kind", "set_epoch"), script_name="ddp_spawn", nproc=2, spawn=True,
        notes="ddp_spawn (the DDP tutorial's ToyModel under torch.multiprocessing.spawn) with the "
              "other classic DistributedSampler mistake; epochs of 128 batches, a few a second"),
    Program(
        "ddp_trainer", r"Epoch 1: loss",
        forward=("__main__", "Net", "forward"), step=("torch.optim.sgd", "SGD", "step"),
        mistake=Expected(("eval-with-grad",), fix=("no_grad",), also=("job-straggler",),
                         why="rank 0's validation pass without torch.no_grad()"),
        nproc=2,
        notes="torchrun, 2 ranks on gloo; DDP(model); rank 0 validates after every epoch; "
              "diagnosed on rank 0's pid, or the job with --all-ranks"),
)}


def failed_phases(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(phase, reason) of the phases that failed or timed out: of the diagnosis, or of every
    rank's in a job's document (which names only each phase's status)."""
    if "ranks" in doc:
        return [(f"rank {r}: {name}", status) for r, rank in sorted(doc["ranks"].items())
                for name, status in (rank.get("phases") or {}).items()
                if status in ("failed", "timed_out")] + [
                    (f"rank {r}", str(rank["error"])) for r, rank in sorted(doc["ranks"].items())
                    if rank.get("error")]
    return [(p["name"], p["reason"]) for p in doc.get("phases", [])
            if p["status"] in ("failed", "timed_out")]


def finding_text(finding: dict[str, Any]) -> str:
    return json.dumps(finding)


def severe(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in result.get("findings", []) if f.get("severity") in SEVERE]


# The DataLoader warning line (report/rules/dataloader_bottleneck.py): a loader the program's own
# meters put at or over it, with no tool attached, is a real bottleneck on this machine (2 loaded
# cores starve its workers), and the finding saying so is the truth, not a false alarm.
LOADER_WARNING_PCT = 10.0
# The meters' own noise: three 20-iteration intervals of the DCGAN still differ by ~2-3 points
# from one moment to the next on a busy 2-core machine (9.0 % before the tool attached, 13-17 %
# a few seconds later, with or without the tool), so a finding within that of the line is true.
METER_NOISE_PCT = 2.5
LOADER_REPORT_PCT = 5.0
STEADY_INTERVALS = 3


def judge(program: Program, mistake: bool, result: dict[str, Any],
          own_loader_pct: float | None = None) -> tuple[bool, str]:
    """(right, why) for one diagnosis of ``program``; ``own_loader_pct``: the DataLoader's share
    of the loop as the program measured it itself before the tool attached (own_dataloader_share)."""
    findings = severe(result)
    def true_loader(f: dict[str, Any]) -> bool:
        # A warning for a loader the program's own meters put at the rule's reporting line (5 %)
        # or more: whether it is over 10 % at the moment the tool times it moves with the load
        # (the DCGAN's intervals went 3-17 % within a minute); critical needs the meters near 10 %.
        if own_loader_pct is None or f["rule"] != "dataloader-bottleneck":
            return False
        line = LOADER_WARNING_PCT - METER_NOISE_PCT if f["severity"] == "critical" else LOADER_REPORT_PCT
        return own_loader_pct >= line

    bad = [f for f in findings if not true_loader(f)]
    note = (f" (dataloader-bottleneck taken as true: the program's own meters say {own_loader_pct:.1f} %)"
            if len(bad) < len(findings) and own_loader_pct is not None else "")
    if not mistake:
        if bad:
            return False, "false alarm: " + "; ".join(
                f"{f['severity']} {f['rule']}: {f.get('summary', '')[:160]}" for f in bad) + note
        return True, "quiet" + note
    expected = program.mistake
    # the planted mistake may be the loader itself (mnist): a true loader finding is the hit
    hits = [f for f in findings if f["rule"] in expected.rules]
    if not hits:
        return False, f"missed ({'/'.join(expected.rules)}); got: " + "; ".join(
            f"{f['severity']} {f['rule']}" for f in bad)
    for f in hits:
        text = finding_text(f)
        fixes = json.dumps(f.get("fix", []))
        if expected.holder and expected.holder not in text:
            continue
        if any(want not in fixes for want in expected.fix):
            continue
        others = [g for g in bad if g is not f and g["rule"] not in (*expected.rules, *expected.also)]
        if others:
            return False, f"found {f['severity']} {f['rule']}, but also false alarms: " + "; ".join(
                f"{g['severity']} {g['rule']}: {g.get('summary', '')[:120]}" for g in others)
        return True, f"found {f['severity']} {f['rule']}" + note
    f = hits[0]
    return False, (f"found {f['rule']} but holder/fix wrong: where={f.get('where')} "
                   f"holder={f.get('metrics', {}).get('holder')} fix={f.get('fix')}")


_AMP_LINE = re.compile(r"Epoch: \[(\d+)\]\[\s*(\d+)/\d+\]\s+Time\s+\S+\s+\(\s*([\d.]+)\)\s+"
                       r"Data\s+\S+\s+\(\s*([\d.]+)\)")
_DDP_EPOCH = re.compile(r"Epoch \d+: .*\(time ([\d.]+)s, data ([\d.]+)s\)")
_DCGAN_LINE = re.compile(r"\[(\d+)\]\[(\d+)/\d+\].*\tData ([\d.]+)\tTime ([\d.]+)")
_MNIST_LINE = re.compile(r"Train Epoch: \d+ \[(\d+)/\d+ \([^)]*\)\]\tLoss: [\d.e+-]+\tData ([\d.]+)%")
_VAE_LINE = re.compile(r"Train Epoch: \d+ \[(\d+)/\d+ .*\tData ([\d.]+)\tTime ([\d.]+)")
_SPAWN_LINE = re.compile(r"\[rank 0\] \[\d+, +\d+\] loss: [\d.]+\tData ([\d.]+)\tTime ([\d.]+)")
_TRANSFER_LINE = re.compile(r"\[meter\] (\d+) batches\tData ([\d.]+)\tTime ([\d.]+)")
_WGAN_LINE = re.compile(r"\[Epoch \d+/\d+\] \[Batch \d+/\d+\].*\tData ([\d.]+)\tTime ([\d.]+)")


def own_dataloader_share(name: str, log: str) -> float | None:
    """The DataLoader's share of the loop (%) as the program itself measured it, with no tool
    attached, over its last logged interval in ``log`` (amp_classifier: the ImageNet example's
    cumulative Data/Time meters, differenced; dcgan: its last whole epoch; ddp_trainer:
    rank 0's last epoch, its training and validation loaders' waits over the epoch; mnist: its
    Data % over the last logged intervals; wgan_gp, ddp_spawn, transfer_learning: seconds per
    50 batches)."""
    if name == "amp_classifier":
        rows = [(int(e), int(i) + 1, float(t), float(d)) for e, i, t, d in _AMP_LINE.findall(log)]
        if len(rows) < 2 or rows[-1][0] != rows[-2][0]:
            return None
        (_, n1, t1, d1), (_, n2, t2, d2) = rows[-2], rows[-1]
        batch = t2 * n2 - t1 * n1
        return round(100.0 * (d2 * n2 - d1 * n1) / batch, 2) if batch > 0 else None
    if name == "ddp_trainer":
        # rank 0's last epoch: its train and validation loaders' waits over the epoch's time
        epochs = _DDP_EPOCH.findall(log)
        if not epochs or float(epochs[-1][0]) <= 0:
            return None
        return round(100.0 * float(epochs[-1][1]) / float(epochs[-1][0]), 2)
    if name == "mnist":
        # each line: the loader's share over the 10 batches since the last (not the first line's)
        shares = [float(d) for seen, d in _MNIST_LINE.findall(log) if int(seen) > 0]
        if len(shares) < STEADY_INTERVALS:
            return None
        return round(sum(shares[-STEADY_INTERVALS:]) / STEADY_INTERVALS, 2)
    if name in ("wgan_gp", "ddp_spawn", "ddp_set_epoch"):
        # wgan_gp: 50 batches a line, the first line's interval the first batch alone (Time 0);
        # ddp_spawn: rank 0's 50 batches a line, the first holding the process group's start
        pattern = _WGAN_LINE if name == "wgan_gp" else _SPAWN_LINE
        rows = [(float(d), float(t)) for d, t in pattern.findall(log)][1:]
        if len(rows) < STEADY_INTERVALS:
            return None
        last = rows[-STEADY_INTERVALS:]
        total = sum(t for _, t in last)
        return round(100.0 * sum(d for d, _ in last) / total, 2) if total > 0 else None
    if name == "dcgan":
        # one whole epoch, as its loop lives it: the lines after an epoch's first (20 batches
        # each) and the next epoch's first line, whose interval holds that epoch's last batches
        # and the new epoch's first, the 2 workers' start with it (not the run's first line)
        rows = [(int(e), int(i), float(d), float(t)) for e, i, d, t in _DCGAN_LINE.findall(log)]
        firsts = [k for k, (e, i, _, _) in enumerate(rows) if i == 0 and e >= 1]
        if not firsts or firsts[-1] < 6:
            return None
        epoch = rows[firsts[-1] - 6:firsts[-1] + 1]
        total = sum(t for *_, t in epoch)
        return round(100.0 * sum(d for _, _, d, _ in epoch) / total, 2) if total > 0 else None
    if name in ("vae", "transfer_learning"):
        # the first line's interval holds the workers' start (the first batch's wait): not steady;
        # transfer_learning: 50 batches a line, its train and val loaders' workers started anew
        # every phase (three lines are about an epoch, both phases' starts included)
        pattern, first = {"vae": (_VAE_LINE, 1280),
                          "transfer_learning": (_TRANSFER_LINE, 50)}[name]
        rows = [(int(i), float(d), float(t)) for i, d, t in pattern.findall(log) if int(i) > first]
        if len(rows) < STEADY_INTERVALS:
            return None
        # one 20-iteration interval moves by +-5 points on a busy 2-core machine: the last three
        last = rows[-STEADY_INTERVALS:]
        total = sum(t for _, _, t in last)
        return round(100.0 * sum(d for _, d, _ in last) / total, 2) if total > 0 else None
    return None


def steady_dataloader_share(name: str, log: Path, timeout: float = 20.0) -> float | None:
    """own_dataloader_share once the program has logged a steady interval (None for programs
    without meters, or none logged within ``timeout``)."""
    if name not in ("amp_classifier", "dcgan", "ddp_trainer", "vae", "mnist", "wgan_gp", "ddp_spawn",
                    "ddp_set_epoch", "transfer_learning"):
        return None
    deadline = time.monotonic() + timeout
    while True:
        share = own_dataloader_share(name, log.read_text(errors="replace"))
        if share is not None or time.monotonic() > deadline:
            return share
        time.sleep(0.2)


def start(program: Program, mistake: bool, python: str = sys.executable,
          log: Path | None = None, seconds: float = 600) -> subprocess.Popen[bytes]:
    """Start ``program`` and return once it has logged ``program.ready``; a distributed one is
    started by torchrun in a session of its own (stop() ends launcher and ranks together)."""
    launcher = ([python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                 str(program.nproc)] if program.distributed and not program.spawn else [python])
    cmd = [*launcher, str(program.script), "--seconds", str(seconds), *program.args]
    if mistake:
        cmd.append("--mistake")
    log = log or Path(f"/tmp/{program.name}-{'mistake' if mistake else 'healthy'}.log")
    out = open(log, "wb")  # noqa: SIM115 - the child writes it as long as it lives
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=str(HERE), env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            start_new_session=program.distributed)
    out.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{program.name} exited: {log.read_text(errors='replace')[-2000:]}")
        if re.search(program.ready, log.read_text(errors="replace")) and (
                not program.distributed or len(ranks_of(program, proc.pid)) == program.nproc):
            return proc
        time.sleep(0.05)
    stop(proc)
    raise RuntimeError(f"{program.name} never logged {program.ready!r}")


def rank_pids(launcher: int) -> dict[int, int]:
    """{rank: pid} of the torchrun ``launcher``'s ranks (its children with RANK set)."""
    ranks: dict[int, int] = {}
    try:
        children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    except OSError:
        return ranks
    for child in children:
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for var in env:
            if var.startswith(b"RANK="):
                ranks[int(var[5:])] = int(child)
    return ranks


def spawned_pids(parent: int) -> dict[int, int]:
    """{rank: pid} of the ranks torch.multiprocessing.spawn started from ``parent``: its
    children running ``spawn_main``, in the order they were started (their pids), which is the
    order of their ranks (the resource tracker is another child, left out)."""
    try:
        children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    except OSError:
        return {}
    spawned = []
    for child in children:
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            spawned.append(int(child))
    return dict(enumerate(sorted(spawned)))


def ranks_of(program: Program, launcher: int) -> dict[int, int]:
    return spawned_pids(launcher) if program.spawn else rank_pids(launcher)


def target_pid(program: Program, proc: subprocess.Popen[bytes]) -> int:
    """The pid a user diagnoses: the program's, or rank 0's of a distributed one."""
    return ranks_of(program, proc.pid)[0] if program.distributed else proc.pid


def alive(program: Program, proc: subprocess.Popen[bytes]) -> bool:
    """Whether the program (every rank of a distributed one) still runs."""
    if proc.poll() is not None:
        return False
    if not program.distributed:
        return True
    ranks = ranks_of(program, proc.pid)
    return len(ranks) == program.nproc and all(_running(pid) for pid in ranks.values())


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the program: a torchrun job's launcher and every rank, else the process. torchrun
    starts each rank in a session of its own (start_new_session), so a signal to the launcher's
    group never reaches them: killed launcher-first, they ran on (orphans, each for the rest of
    its --seconds), and loaded the machine the next runs and tests were timed on."""
    if proc.poll() is None:
        ranks = list(rank_pids(proc.pid).values())
        try:
            if os.getsid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except ProcessLookupError:
            pass
        for pid in ranks:
            kill_group(pid)
    proc.wait()


def kill_group(pid: int) -> None:
    """SIGKILL ``pid``'s process group (a rank and its DataLoader workers), else ``pid``."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def diagnose(pid: int, target: tuple[str, ...], out: Path, extra: tuple[str, ...] = (),
             timeout: float = 240) -> tuple[int, dict[str, Any], float]:
    """Run `flight_profiler diagnose` as a user would: (exit code, --json document, seconds)."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "flight_profiler", "diagnose", str(pid), *target, "--out", str(out),
         "--json", *extra], capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - t0
    try:
        doc: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = {"error": (proc.stdout + proc.stderr)[-3000:]}
    return proc.returncode, doc, seconds
