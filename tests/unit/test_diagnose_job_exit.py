"""`diagnose PID --all-ranks`: every way out ends with the documented exit code
(docs/exit-codes.md), and the --json document says the same code as the process' status.

The CLI runs for real; the job diagnosis (attaching, phases, report) is replaced by its outcome:
which ranks gave stack samples, which diagnoses ended how, which phases failed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flight_profiler.attach.multirank import RankResult
from flight_profiler.attach.ranks import ProcInfo
from flight_profiler.cli.main import main
from flight_profiler.diagnose.all_ranks import JobDiagnosis
from flight_profiler.diagnose.model import (
    FAILED,
    OK,
    SKIPPED,
    TIMED_OUT,
    DiagnoseOptions,
    DiagnoseResult,
    PhaseResult,
)
from flight_profiler.errors import AgentLost, ExitCode, ProcessNotFound, UsageError
from flight_profiler.report.models import Finding, Report

TARGETS = [ProcInfo(pid=5000 + r, ppid=4999, user="u", cmdline=["python", "train.py"],
                    python="3.11", torch=True, rank=r, world_size=2) for r in range(2)]


def _diagnosis(rank: int, statuses: dict[str, str]) -> RankResult:
    res = DiagnoseResult(DiagnoseOptions(pid=5000 + rank, out_dir=f"/tmp/x/rank{rank}"))
    for name, status in statuses.items():
        res.phases.append(PhaseResult(name, name, status=status, reason=f"{name} {status}"))
    return RankResult(rank, 5000 + rank, True, {"diagnosis": res})


def _stacks(*ok: bool) -> list[RankResult]:
    return [RankResult(r, 5000 + r, True, {}) if good else
            RankResult(r, 5000 + r, False, error=AgentLost("the agent of rank went away", "").to_dict())
            for r, good in enumerate(ok)]


def _report(*severities: str) -> Report:
    return Report([], [Finding(rule="job-straggler", severity=s, title="t", summary="s", ranks=[1])
                       for s in severities])


def _run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
         job: JobDiagnosis | BaseException, *extra: str) -> tuple[int, str, str]:
    def fake_job(targets: list[ProcInfo], out_dir: str, *a: Any, **k: Any) -> JobDiagnosis:
        if isinstance(job, BaseException):
            raise job
        return job

    monkeypatch.setattr("flight_profiler.cli.ranks_cmd.job_targets", lambda pid, spec: TARGETS)
    monkeypatch.setattr("flight_profiler.diagnose.outputs.prepare_out_dir", lambda out, pid: None)
    monkeypatch.setattr("flight_profiler.diagnose.all_ranks.diagnose_job", fake_job)
    with pytest.raises(SystemExit) as exc:
        main(["diagnose", "4999", "--all-ranks", "--out", str(tmp_path / "out"), *extra])
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


_ALL_OK = {"status": OK, "census-before": OK, "profile": OK, "record": SKIPPED}


@pytest.mark.parametrize("name, make, extra, code", [
    ("complete, nothing found", lambda: JobDiagnosis("o", TARGETS, _stacks(True, True),
        [_diagnosis(0, _ALL_OK), _diagnosis(1, _ALL_OK)], _report()), (), ExitCode.OK),
    # the run: a rank killed mid-run, the other's phases failed after it
    ("phases failed on every rank", lambda: JobDiagnosis("o", TARGETS, _stacks(True, True),
        [_diagnosis(0, {**_ALL_OK, "profile": FAILED, "census-after": TIMED_OUT}),
         RankResult(1, 5001, False, error=AgentLost("the target exited", "").to_dict())],
        _report("warning")), (), ExitCode.INCOMPLETE),
    ("one phase timed out on one rank", lambda: JobDiagnosis("o", TARGETS, _stacks(True, True),
        [_diagnosis(0, _ALL_OK), _diagnosis(1, {**_ALL_OK, "grads": TIMED_OUT})], _report()),
     (), ExitCode.INCOMPLETE),
    ("a rank gave no stack samples (stuck job)", lambda: JobDiagnosis("o", TARGETS,
        _stacks(True, False), [], _report("critical"), skipped_phases="stuck"), (), ExitCode.INCOMPLETE),
    ("stuck job, every rank sampled: skipped phases are no gap", lambda: JobDiagnosis("o", TARGETS,
        _stacks(True, True), [], _report("critical"), skipped_phases="stuck"), (), ExitCode.OK),
    ("--fail-on reached beats incomplete", lambda: JobDiagnosis("o", TARGETS, _stacks(True, True),
        [_diagnosis(0, {"profile": FAILED}), _diagnosis(1, _ALL_OK)], _report("warning")),
     ("--fail-on", "warning"), ExitCode.FINDINGS),
    ("--fail-on not reached, complete", lambda: JobDiagnosis("o", TARGETS, _stacks(True, True),
        [_diagnosis(0, _ALL_OK), _diagnosis(1, _ALL_OK)], _report("warning")),
     ("--fail-on", "critical"), ExitCode.OK),
    ("--fail-on and no report could be made", lambda: JobDiagnosis("o", TARGETS, _stacks(True, False),
        [], None), ("--fail-on", "warning"), ExitCode.COMMAND_FAILED),
    ("every rank gone before anything came back", lambda: JobDiagnosis("o", TARGETS,
        [RankResult(r, 5000 + r, False, error=ProcessNotFound(f"no process {5000 + r}", "").to_dict())
         for r in range(2)],
        [RankResult(r, 5000 + r, False, error=ProcessNotFound(f"no process {5000 + r}", "").to_dict())
         for r in range(2)], None), (), ExitCode.PROCESS_NOT_FOUND),
    ("every rank failed, differently", lambda: JobDiagnosis("o", TARGETS,
        [RankResult(0, 5000, False, error=ProcessNotFound("no process 5000", "").to_dict()),
         RankResult(1, 5001, False, error=AgentLost("lost", "").to_dict())], [], None),
     (), ExitCode.COMMAND_FAILED),
])
@pytest.mark.parametrize("as_json", [True, False])
def test_every_outcome_exits_with_the_documented_code(
        name: str, make: Any, extra: tuple[str, ...], code: int, as_json: bool,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, out, err = _run(monkeypatch, capsys, tmp_path, make(), *extra,
                            *(["--json"] if as_json else []))
    assert status == code, (name, out, err)
    if as_json:
        doc = json.loads(out)  # one document, whatever the outcome
        assert doc["exit_code"] == code, name
        assert "error" not in doc
        if code == ExitCode.INCOMPLETE:
            assert doc["missing"] and all({"rank", "phase", "status", "hides"} <= set(g) for g in doc["missing"])
    elif code == ExitCode.INCOMPLETE:
        assert "the evidence is incomplete" in out and f"exit {code}" in err


def test_the_missing_evidence_names_each_rank_and_phase() -> None:
    job = JobDiagnosis("o", TARGETS, _stacks(True, False),
                       [_diagnosis(0, {**_ALL_OK, "profile": FAILED}),
                        RankResult(1, 5001, False, error=AgentLost("the target exited", "").to_dict())])
    gaps = [(g["rank"], g["phase"], g["status"]) for g in job.gaps()]
    assert gaps == [(1, "stacks", "failed"), (0, "profile", "failed"), (1, "diagnosis", "failed")]


@pytest.mark.parametrize("failure, code", [
    (UsageError("rank 7 is not on this node", "--ranks 0,1"), ExitCode.USAGE),
    (KeyboardInterrupt(), ExitCode.INTERRUPTED),
])
def test_failures_before_or_during_the_diagnosis_keep_their_codes(
        failure: BaseException, code: int, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, out, _err = _run(monkeypatch, capsys, tmp_path, failure, "--json")
    assert status == code
    if code != ExitCode.INTERRUPTED:
        assert json.loads(out)["error"]["exit_code"] == code
