"""`diagnose` on realistic programs written the way the field's tutorials write them
(tests/integration/real_programs: an LSTM language model, a DCGAN, an LBFGS sequence model, a
Transformer with gradient accumulation, an AMP classifier), healthy and with one classic mistake,
pointed at the model's `forward`, at the step, and at nothing, as users do.

A healthy program must get no warning; a planted mistake must be found with its holder and the
right fix; the program must survive. bench/bench_real_programs.py runs the same cases repeatedly.
"""

from __future__ import annotations

import sys
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
    program = cases.PROGRAMS[name]
    proc = cases.start(program, mistake, log=tmp_path / "program.log")
    # the loader's share by the program's own meters, before the tool attaches: the truth that a
    # dataloader-bottleneck finding is judged against
    own = cases.steady_dataloader_share(name, tmp_path / "program.log")
    try:
        code, doc, _seconds = cases.diagnose(proc.pid, program.targets()[method],
                                            tmp_path / "diag", DIAGNOSE)
        alive = proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    log = (tmp_path / "program.log").read_text(errors="replace")[-2000:]
    assert alive, f"the program died during its diagnosis:\n{log}"
    assert code in (0, 9), doc
    failed = [(p["name"], p["reason"]) for p in doc["phases"] if p["status"] in ("failed", "timed_out")]
    assert not failed, failed
    right, why = cases.judge(program, mistake, doc, own)
    assert right, why


@pytest.mark.parametrize("method", ["forward", "step", "none"])
@pytest.mark.parametrize("name", sorted(cases.PROGRAMS))
def test_healthy_program_gets_no_warning(tmp_path: Path, name: str, method: str) -> None:
    run_case(tmp_path, name, False, method)


@pytest.mark.parametrize("name", sorted(cases.PROGRAMS))
def test_planted_mistake_is_found_with_holder_and_fix(tmp_path: Path, name: str) -> None:
    run_case(tmp_path, name, True, "forward")
