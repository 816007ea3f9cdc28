"""``diagnose PID --all-ranks``: the per-process workflow on every local rank at once, one report
for the job.

1. Stack samples of every rank, in parallel, before anything else touches the job: a hung or
   desynchronised job is diagnosed from them alone (its ranks never reach a safe point or call
   the method again, so the per-rank phases would only wait for their timeouts).
2. Otherwise the existing workflow (``run_diagnosis``) runs on each rank in parallel, each into
   ``OUT/rank<N>/``.
3. The report engine reads every rank's artefacts and the stack files together: the job rules
   compare ranks, and each finding lists the ranks it is about (job-wide ones list none).
Agents this command injected are detached at the end: nothing stays attached.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from flight_profiler.atomic_files import write_text_atomic
from flight_profiler.diagnose.model import DiagnoseOptions, DiagnoseResult, MethodTarget
from flight_profiler.diagnose.outputs import REPORT_FILES

if TYPE_CHECKING:
    from flight_profiler.api import Session
    from flight_profiler.attach.multirank import RankResult
    from flight_profiler.attach.ranks import ProcInfo
    from flight_profiler.report.models import Report

STACK_SAMPLES = 3
SAMPLE_GAP_S = 0.5
STACKS_DIR = "stacks"
TRACES_DIR = "traces"
# Rules whose critical finding means the ranks are stuck: the per-rank phases are skipped.
_STUCK_RULES = ("job-hang", "job-desync")
ALIGN_WAIT_S = 60.0  # plus 3x the phase timeout: how long a rank waits for the others' profile


@dataclass
class JobDiagnosis:
    out_dir: str
    targets: list[ProcInfo]
    stack_results: list[RankResult] = field(default_factory=list)
    rank_results: list[RankResult] = field(default_factory=list)
    report: Report | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    skipped_phases: str = ""  # why the per-rank workflow did not run
    armed: list[RankResult] | None = None  # --arm: each rank's triggers (diagnose/arming.py)
    seconds: float = 0.0

    def gaps(self) -> list[dict[str, Any]]:
        """The evidence that is missing, per rank: stack samples not taken, a diagnosis that
        ended with an error (a rank killed mid-run), phases that failed or timed out. Phases
        skipped on purpose (a stuck job, no CUDA) are not gaps."""
        from flight_profiler.diagnose.evidence import missing

        out: list[dict[str, Any]] = []
        for r in self.stack_results:
            if not r.ok:
                out.append({"rank": r.rank, "pid": r.pid, "phase": "stacks", "status": "failed",
                            "reason": str((r.error or {}).get("message", "")),
                            "hides": "where the rank is (hang, desync, its waits)"})
        for r in self.rank_results:
            if not r.ok or r.result is None:
                out.append({"rank": r.rank, "pid": r.pid, "phase": "diagnosis", "status": "failed",
                            "reason": str((r.error or {}).get("message", "")),
                            "hides": "every per-rank phase of this rank"})
                continue
            for gap in missing(r.result["diagnosis"]):
                out.append({"rank": r.rank, "pid": r.pid, **gap})
        return out

    def collected(self) -> bool:
        """Anything at all came back from some rank (stack samples or a diagnosis)."""
        return any(r.ok for r in self.stack_results) or any(r.ok for r in self.rank_results)

    def to_dict(self) -> dict[str, Any]:
        from flight_profiler.attach.ranks import identity

        ranks: dict[str, Any] = {}
        job = identity(self.targets)
        for t in self.targets:  # who each rank is: what lets per-node directories merge
            if t.rank is not None:
                ranks[str(t.rank)] = {"pid": t.pid, "rank": t.rank, "local_rank": t.local_rank,
                                      "node_rank": t.node_rank, "hostname": job["hostname"],
                                      "world_size": t.world_size}
        for r in self.stack_results:
            ranks.setdefault(str(r.rank), {"pid": r.pid}).update(stacks_ok=r.ok, error=r.error)
        for r in self.rank_results:
            entry = ranks.setdefault(str(r.rank), {"pid": r.pid})
            entry["diagnose_ok"] = r.ok
            if r.ok and r.result is not None:
                res: DiagnoseResult = r.result["diagnosis"]
                entry["out_dir"] = res.options.out_dir
                entry["phases"] = {p.name: p.status for p in res.phases}
            else:
                entry["error"] = r.error
        return {"format": "flight_profiler.diagnose_job", "version": 1, "out_dir": self.out_dir,
                "job": job, "seconds": round(self.seconds, 3), "ranks": ranks,
                "per_rank_phases_skipped": self.skipped_phases or None,
                "missing": self.gaps(),
                "outputs": self.outputs,
                "armed": None if self.armed is None else [r.to_dict() for r in self.armed],
                "findings": [f.to_dict() for f in self.report.findings] if self.report else []}


def exit_code(job: JobDiagnosis, fail_on: str | None) -> int:
    """The documented exit code of a job diagnosis (docs/exit-codes.md): 9 when a finding reaches
    --fail-on; 1 when --fail-on asked for a verdict and no report could be made; 12 when some
    evidence is missing (a rank not sampled, a rank's diagnosis or some of its phases failed);
    else 0. When nothing came back from any rank, the ranks' own error decides (see
    ``nothing_collected``)."""
    from flight_profiler.errors import ExitCode

    if fail_on and job.report is not None and job.report.reaches(fail_on):
        return ExitCode.FINDINGS
    if fail_on and job.report is None:
        return ExitCode.COMMAND_FAILED
    if job.gaps():
        return ExitCode.INCOMPLETE
    return ExitCode.OK


def nothing_collected(job: JobDiagnosis) -> int | None:
    """When no rank gave anything (every attach failed, every rank dead): the exit code of the
    ranks' error when they all failed alike (3: gone, 4: not allowed, 6/7: attach), else 1."""
    from flight_profiler.errors import ExitCode

    if job.collected() or not (job.stack_results or job.rank_results):
        return None
    codes = {int((r.error or {}).get("exit_code", ExitCode.COMMAND_FAILED))
             for r in [*job.stack_results, *job.rank_results] if not r.ok}
    return codes.pop() if len(codes) == 1 else ExitCode.COMMAND_FAILED


def flight_recorder(session: Session) -> dict[str, Any] | None:
    """The rank's Flight Recorder summary; ``{"enabled": false, "reason"}`` when the job runs
    without it (the report says so); None when it cannot be read."""
    from flight_profiler.errors import FlightProfilerError

    try:
        fr = session.request("torch fr")
    except FlightProfilerError:  # no torch, no distributed build, an older agent
        return None
    return fr if isinstance(fr, dict) else None


def sample_stacks(targets: list[ProcInfo], out_dir: str, timeout: float,
                  samples: int = STACK_SAMPLES, gap: float = SAMPLE_GAP_S) -> tuple[list[RankResult], list[str]]:
    """``samples`` stack samples per rank, ``gap`` seconds apart, in parallel; one file per rank."""
    from flight_profiler.attach.multirank import run_on_ranks
    from flight_profiler.report.rank_stacks import stacks_document
    from flight_profiler.requests import basic

    stack_request = basic.stack(progress=True)

    def work(session: Session) -> dict[str, Any]:
        taken = []
        for i in range(samples):
            if i:
                time.sleep(gap)
            res = session.execute(stack_request)
            res["time"] = time.time()
            taken.append(res)
        return {"samples": taken, "flight_recorder": flight_recorder(session)}

    results = run_on_ranks(targets, work, timeout)
    directory = os.path.join(out_dir, STACKS_DIR)
    os.makedirs(directory, exist_ok=True)
    from flight_profiler.attach.ranks import identity

    world = {t.pid: t.world_size for t in targets}
    node = identity(targets)
    files = []
    for r in results:
        if not r.ok or r.result is None:
            continue
        doc = stacks_document(r.rank, r.pid, world.get(r.pid), r.result["samples"],
                              r.result.get("flight_recorder"),
                              {"node_rank": node["node_rank"], "hostname": node["hostname"]})
        path = os.path.join(directory, f"stacks_rank{r.rank}.json")
        write_text_atomic(path, json.dumps(doc))
        files.append(path)
    return results, files


# Commands that hold every thread of the rank at a safe point while they read its tensors
# (agent/safepoint.py). See TakeTurns.
_HOLDING = ("torch tensors", "torch memory", "torch grads")


class TakeTurns:
    """A driver that lets one rank at a time run a command that holds its threads.

    A rank whose threads are held stops in the middle of its step; the other ranks then wait
    for it in their next collective (for DDP, inside backward, in native code), where their own
    thread gate cannot hold them (a thread inside a native call is not at a safe point): run at
    the same moment on every rank, each rank's census waited for the others' and gave up after
    its 2 s budget on a loaded machine ("thread 'MainThread' stayed inside one native call in
    _engine_run_backward()"). One at a time, the others run freely meanwhile, so a waiting
    rank's collective completes and its thread reaches a safe point."""

    def __init__(self, driver: Any, turn: Any) -> None:
        self.driver = driver
        self.turn = turn
        self.injected = getattr(driver, "injected", False)

    def run(self, request: Any, on_event: Any = None, timeout: float | None = None) -> dict[str, Any]:
        if request.cmd not in _HOLDING or request.args.get("mode") == "record":
            return self.driver.run(request, on_event, timeout)  # type: ignore[no-any-return]
        with self.turn:
            return self.driver.run(request, on_event, timeout)  # type: ignore[no-any-return]


def _diagnose_ranks(targets: list[ProcInfo], base: DiagnoseOptions, attach_timeout: float) -> list[RankResult]:
    import threading

    from flight_profiler.attach.multirank import run_on_ranks
    from flight_profiler.diagnose.driver import SessionDriver
    from flight_profiler.diagnose.workflow import run_diagnosis

    rank_of = {t.pid: t.rank for t in targets}
    align = ProfileAlignment(len(targets), ALIGN_WAIT_S + 3 * base.timeout)
    turn = threading.Lock()

    def work(session: Session) -> dict[str, Any]:
        options = DiagnoseOptions(pid=session.pid, target=base.target,
                                  out_dir=os.path.join(base.out_dir, f"rank{rank_of[session.pid]}"),
                                  calls=base.calls, duration=base.duration, timeout=base.timeout,
                                  align_profile=align.wait)
        driver = TakeTurns(SessionDriver(session, connect_timeout=attach_timeout), turn)
        return {"diagnosis": run_diagnosis(driver, options, None, session.attach_seconds)}

    def done(target: ProcInfo, result: RankResult) -> None:
        # A rank that ends before its profile (attach failed, method not found, no torch) must
        # not hold the others.
        align.leave()

    return run_on_ranks(targets, work, attach_timeout, on_done=done)


class ProfileAlignment:
    """Starts every rank's profile phase together, so the per-rank traces cover the same
    wall-clock window. The phases before it take different times on different ranks (a census
    of a bigger model, a slower attach); without this, one rank's window can fall on a moment
    the host was busy with another rank's census and make it look like a straggler.

    A barrier whose parties can leave: a rank that fails to attach, or ends its diagnosis
    before its profile, stops being waited for instead of breaking the alignment of the rest."""

    def __init__(self, parties: int, timeout: float) -> None:
        import threading

        self._cond = threading.Condition()
        self._expected = parties
        self._arrived = 0
        self._released = False
        self._timeout = timeout
        self.parties = parties

    def wait(self) -> str:
        with self._cond:
            if self.parties < 2:
                return "not aligned: one rank"
            if self._released:
                return "not aligned: the other ranks had given up waiting and started already"
            self._arrived += 1
            self._release_if_complete()
            if not self._cond.wait_for(lambda: self._released, self._timeout):
                self._released = True  # the late ones start at once too
                self._cond.notify_all()
                return (f"not aligned: {self._expected - self._arrived} rank(s) did not reach "
                        f"their profile within {self._timeout:g}s")
            return f"aligned: {self._arrived} of {self.parties} ranks started their profile together"

    def leave(self) -> None:
        """A rank is done with its diagnosis, or never started it. Once the ranks are released
        this changes nothing; before, a rank leaving without arriving is no longer waited for."""
        with self._cond:
            if not self._released:
                self._expected -= 1
                self._release_if_complete()

    def _release_if_complete(self) -> None:
        if self._arrived >= self._expected:
            self._released = True
            self._cond.notify_all()


def hta_directory(out_dir: str, results: list[RankResult]) -> dict[str, str]:
    """OUT/traces/rank<N>.pt.trace.json.gz, one per rank and nothing else: Holistic Trace
    Analysis reads every .json/.gz file of its trace directory and needs each to carry
    distributedInfo.rank (torch's profiler writes it), so censuses or reports beside the traces
    would break it. Hard links (copies across file systems)."""
    import shutil

    directory = os.path.join(out_dir, TRACES_DIR)
    made = False
    for r in results:
        if not r.ok or r.result is None:
            continue
        traces = [f for f in rank_artefacts(r.result["diagnosis"])
                  if f.endswith((".json.gz", ".json")) and os.path.basename(f).startswith("profile")]
        if not traces:
            continue
        os.makedirs(directory, exist_ok=True)
        ext = ".json.gz" if traces[0].endswith(".gz") else ".json"
        target = os.path.join(directory, f"rank{r.rank}.pt.trace{ext}")
        if os.path.exists(target):
            os.unlink(target)
        try:
            os.link(traces[0], target)
        except OSError:
            shutil.copyfile(traces[0], target)
        made = True
    return {"hta_trace_dir": directory} if made else {}


def rank_artefacts(res: DiagnoseResult) -> list[str]:
    """What a rank's phases wrote (traces, snapshots, censuses), not its own report files."""
    return [f for p in res.phases if p.name != "report" for f in p.files
            if os.path.exists(f) and not f.endswith("diagnose.json")]


def _detach_injected(targets: list[ProcInfo], injected: set[int], timeout: float) -> None:
    from flight_profiler.attach.multirank import detach_ranks

    detach_ranks([t for t in targets if t.pid in injected], timeout)


def _quiet(_: str) -> None:
    pass


def diagnose_job(targets: list[ProcInfo], out_dir: str, target: MethodTarget | None, calls: int,
                 duration: float, timeout: float, attach_timeout: float,
                 say: Callable[[str], None] = _quiet,
                 arming: list[Any] | None = None) -> JobDiagnosis:
    from flight_profiler.attach.multirank import has_agent
    from flight_profiler.diagnose.evidence import merge_rank_loader
    from flight_profiler.rank_list import format_ranks
    from flight_profiler.render.formats import write_report
    from flight_profiler.report import analyze

    started = time.monotonic()
    job = JobDiagnosis(out_dir, targets)
    os.makedirs(out_dir, exist_ok=True)
    injected: set[int] = set()
    # Interrupted while the ranks are being attached (stack sampling runs in worker threads
    # that finish their injection), ``injected`` is not known yet: the ranks that have an
    # agent at the end and had none now were injected by this command and are detached too.
    had_agent = {t.pid for t in targets if has_agent(t.pid)}
    names = format_ranks([t.rank for t in targets if t.rank is not None])
    try:
        say(f"stack samples of ranks {names} ({STACK_SAMPLES} each, in parallel)")
        job.stack_results, files = sample_stacks(targets, out_dir, attach_timeout)
        injected = {r.pid for r in job.stack_results if r.injected}
        stuck = analyze(files, jobs=1) if files else None
        # Stuck: a critical hang or desync; or every local rank still in one collective waiting
        # for ranks on other nodes (one node of a job hung elsewhere): the per-rank phases
        # would only wait for their timeouts there too.
        critical = [f for f in (stuck.findings if stuck else [])
                    if f.rule in _STUCK_RULES and (f.severity == "critical"
                                                   or f.metrics.get("absent_ranks"))]
        if critical:
            job.skipped_phases = ("the ranks are stuck in collectives (" + critical[0].title +
                                  "): per-rank phases would only wait for their timeouts")
            say(f"stuck: {critical[0].title}; per-rank phases skipped")
        else:
            say(f"the diagnosis workflow on ranks {names} in parallel (each into {out_dir}/rank<N>)")
            base = DiagnoseOptions(pid=0, target=target, out_dir=out_dir, calls=calls,
                                   duration=duration, timeout=timeout)
            job.rank_results = _diagnose_ranks(targets, base, attach_timeout)
            injected |= {r.pid for r in job.rank_results if r.injected}
            for r in job.rank_results:
                if r.ok and r.result is not None:
                    files.extend(rank_artefacts(r.result["diagnosis"]))
            job.outputs.update(hta_directory(out_dir, job.rank_results))
        if files:
            say(f"the job report from {len(files)} file(s)")
            job.report = analyze(files)
            for r in job.rank_results:  # each rank's timed DataLoader share decides for it
                if r.ok and r.result is not None:
                    job.report.findings = merge_rank_loader(r.result["diagnosis"],
                                                            job.report.findings, r.rank)
            for f in job.report.findings:
                if f.ranks is None:  # in a job report every finding says its ranks: [] = all
                    f.ranks = []
            for fmt, name in REPORT_FILES.items():
                path = os.path.join(out_dir, name)
                write_report(job.report, path, fmt)
                job.outputs[fmt] = path
        if arming:
            from flight_profiler.diagnose.arming import arm_ranks, rank_keeps_agent

            say(f"arming {len(arming)} trigger(s) on ranks {names}")
            job.armed = arm_ranks(targets, arming, attach_timeout)
            injected -= {r.pid for r in job.armed if rank_keeps_agent(r)}  # detach would disarm
    except BaseException:
        injected |= {t.pid for t in targets if has_agent(t.pid)} - had_agent
        raise
    finally:
        _detach_injected(targets, injected, attach_timeout)
        job.seconds = time.monotonic() - started
        write_text_atomic(os.path.join(out_dir, "diagnose_job.json"),
                          json.dumps(job.to_dict(), indent=2, default=str) + "\n")
    return job
