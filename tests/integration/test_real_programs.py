"""`diagnose` on realistic programs written the way the field's tutorials write them
(tests/integration/real_programs: an LSTM language model, a DCGAN, an LBFGS sequence model, a
Transformer with gradient accumulation, an AMP classifier, a VAE, an actor-critic, a character RNN,
a DQN, a neural style transfer, a fine-tuned ResNet (the transfer-learning tutorial), MNIST, a
PINN trained by one long LBFGS step, a character-level GRU text generator, a WGAN-GP, a two-rank
DDP trainer under torchrun, the DDP tutorial's model under torch.multiprocessing.spawn),
healthy and with one classic mistake, pointed at the model's `forward`, at the step, and at
nothing, as users do.

A healthy program must get no warning; a planted mistake must be found with its holder and the
right fix; the program must survive. bench/bench_real_programs.py runs the same cases repeatedly.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from support import torch_available

sys.path.insert(0, str(Path(__file__).resolve().parent / "real_programs"))
import cases

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch_available(), reason="the programs need torch"),
]

DIAGNOSE = ("--calls", "5", "--duration", "3", "--timeout", "30")


def run_case(tmp_path: Path, name: str, mistake: bool, method: str) -> None:
    right, why = diagnosed(tmp_path, name, mistake, method)
    assert right, why


class Incomplete(AssertionError):
    """A diagnosis that ended with some phase failed or timed out (exit 12), the program alive."""


def diagnosed(tmp_path: Path, name: str, mistake: bool, method: str) -> tuple[bool, str]:
    """(right, why) of one diagnosis of a fresh run of the program; one incomplete diagnosis is
    run again (a fresh program), the failed phases it named kept as a warning in the test report.

    Why: CI once got exit 12 from a healthy LBFGS run with `forward` (stop 40), which 75 runs of
    this module, 34 diagnoses of that case under load and 80 back-to-back profiles here never
    showed again; the document was cut short, so the failed phase is unknown. A second
    incomplete one fails the test with its phases named."""
    try:
        return _diagnosed_once(tmp_path, name, mistake, method)
    except Incomplete as exc:
        warnings.warn(f"{name} {method}: an incomplete diagnosis, run again: {exc}", stacklevel=1)
        return _diagnosed_once(tmp_path / "again", name, mistake, method)


def _diagnosed_once(tmp_path: Path, name: str, mistake: bool, method: str) -> tuple[bool, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    program = cases.PROGRAMS[name]
    proc = cases.start(program, mistake, log=tmp_path / "program.log")
    # the loader's share by the program's own meters, before the tool attaches: the truth that a
    # dataloader-bottleneck finding is judged against
    own = cases.steady_dataloader_share(name, tmp_path / "program.log")
    try:
        code, doc, _seconds = cases.diagnose(cases.target_pid(program, proc), program.targets()[method],
                                            tmp_path / "diag", (*DIAGNOSE, *program.options(method)))
        alive = cases.alive(program, proc)
    finally:
        cases.stop(proc)
    log = (tmp_path / "program.log").read_text(errors="replace")[-2000:]
    assert alive, f"the program died during its diagnosis:\n{log}"
    failed = cases.failed_phases(doc)
    # the phases that failed come first: pytest cuts a long document short
    if code == 12 and failed:
        raise Incomplete(f"{failed} (the document: {tmp_path / 'diag' / 'diagnose.json'})")
    assert code in (0, 9), (failed, doc)
    assert not failed, failed
    return cases.judge(program, mistake, doc, own)


SINGLE = sorted(n for n, p in cases.PROGRAMS.items() if not p.distributed)


@pytest.mark.parametrize("method", ["forward", "step", "none"])
@pytest.mark.parametrize("name", SINGLE)
def test_healthy_program_gets_no_warning(tmp_path: Path, name: str, method: str) -> None:
    run_case(tmp_path, name, False, method)


@pytest.mark.parametrize("name", [n for n in SINGLE if not cases.PROGRAMS[n].by_chance])
def test_planted_mistake_is_found_with_holder_and_fix(tmp_path: Path, name: str) -> None:
    right, why = diagnosed(tmp_path / "first", name, True, "forward")
    if not right and why.startswith("missed") and cases.PROGRAMS[name].reset_every:
        # the holder is reset periodically: a diagnosis whose censuses fall on a reset has
        # nothing to see; a second one, a few seconds later, must find it
        right, why = diagnosed(tmp_path / "second", name, True, "forward")
        why = f"missed twice ({cases.PROGRAMS[name].reset_every}): {why}"
    assert right, why


# The DDP trainer (torchrun, 2 ranks on gloo), kept to four runs for CI's sake: rank 0 diagnosed
# healthy with `forward` and with nothing, its mistake (rank 0's validation once an epoch without
# no_grad) with nothing named (a window of whole seconds holds an epoch's end; five forward calls
# do not: docs/diagnose.md), and the job as a whole with --all-ranks.
@pytest.mark.parametrize("method", ["forward", "none"])
def test_healthy_ddp_rank_gets_no_warning(tmp_path: Path, method: str) -> None:
    run_case(tmp_path, "ddp_trainer", False, method)


def test_ddp_validation_with_grad_on_rank_0_is_found(tmp_path: Path) -> None:
    run_case(tmp_path, "ddp_trainer", True, "none")


def test_ddp_job_with_all_ranks_finds_rank_0s_validation_and_the_ranks_survive(tmp_path: Path) -> None:
    run_case(tmp_path, "ddp_trainer", True, "all-ranks")


# The DDP tutorial's ToyModel started by torch.multiprocessing.spawn, diagnosed on rank 0's pid:
# healthy with nothing named; its mistake (the loop calls the module DDP wraps, so gradients are
# never all-reduced) with `forward` named.
def test_healthy_spawned_ddp_rank_gets_no_warning(tmp_path: Path) -> None:
    run_case(tmp_path, "ddp_spawn", False, "none")


def test_a_loop_that_bypasses_ddp_is_found_on_a_spawned_rank(tmp_path: Path) -> None:
    run_case(tmp_path, "ddp_spawn", True, "forward")


# The same spawned job with `sampler.set_epoch(epoch)` left out, with nothing named and with the
# forward: each epoch begins at the sampler's old epoch, on the loader trained on.
@pytest.mark.parametrize("method", ["none", "forward"])
def test_a_ddp_loop_that_never_calls_set_epoch_is_found_on_a_spawned_rank(tmp_path: Path, method: str) -> None:
    run_case(tmp_path, "ddp_set_epoch", True, method)

