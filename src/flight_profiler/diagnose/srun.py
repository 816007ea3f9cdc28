"""``job srun JOBID -- diagnose --all-ranks ...``: diagnose every node of a running SLURM job
through the launcher the cluster already has, then one report for the job.

One ``srun --overlap --jobid JOBID --nodes 1 --ntasks 1 --nodelist NODE`` per node, in parallel
(at most ``fanout`` at once), each running ``flight_profiler job node`` there (job_node.py).
One step per node rather than one step over all nodes: each node's exit status and output are
its own (one multi-node step has one status, and its tasks' stdout interleave), so a node that
fails is named, its archive framing cannot be mixed with another node's, and a node that hangs
is killed at --timeout without losing the others. --overlap lets the step share the CPUs the
job holds (without it srun waits for free ones, forever on a full allocation).

Output: with a shared filesystem each node writes ``DIR/<node>`` itself (``--shared``); without
one (the default) each node streams its directory back on srun's stdout (node_archive.py) and
it is unpacked here into ``DIR/<node>``. Then ``merge_report`` over ``DIR``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from flight_profiler.diagnose.job_node import DETACH_GRACE
from flight_profiler.diagnose.node_archive import ArchiveError, read_stream, safe_node_name, unpack
from flight_profiler.errors import FlightProfilerError, ProcessNotFound, UsageError

if TYPE_CHECKING:
    from flight_profiler.report.models import Report

SLURM_TOOLS = ("srun", "squeue", "scontrol")
# diagnose exits 0 done, 9 --fail-on reached, 12 some phases failed: all three leave a report.
_NODE_OK = (0, 9, 12)


@dataclass
class NodeResult:
    node: str
    ok: bool
    exit_code: int | None  # the node's diagnose (None: it never ran or its stream was lost)
    seconds: float
    error: str | None = None
    files: int = 0


@dataclass
class JobRun:
    jobid: str
    out_dir: str
    nodes: list[NodeResult] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        return [n.node for n in self.nodes if not n.ok]

    def to_dict(self) -> dict[str, Any]:
        return {"jobid": self.jobid, "out_dir": self.out_dir,
                "nodes": [asdict(n) for n in self.nodes], "missing_nodes": self.missing}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise FlightProfilerError(
            f"{name} not found on PATH: job srun drives SLURM's own client commands",
            "run it on a login node of the cluster (or install slurm-client: "
            "apt-get install slurm-client); without SLURM, see docs/ranks.md, Multi-node")
    return path


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise FlightProfilerError(f"{os.path.basename(argv[0])} did not answer in {timeout:.0f} s",
                                  "check that slurmctld is reachable (`sinfo`)") from None


def job_nodes(jobid: str, timeout: float = 30.0) -> list[str]:
    """The nodes of running job ``jobid``; one clear error when it is not running."""
    if not jobid.isdigit() and not jobid.replace("_", "").isdigit():
        raise UsageError(f"JOBID {jobid!r} is not a SLURM job id", "e.g. `job srun 12345 -- ...`")
    done = _run([_tool("squeue"), "-h", "-j", jobid, "-o", "%T|%N"], timeout)
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    if done.returncode != 0 or not lines:
        said = (done.stderr.strip().splitlines() or ["not in the queue"])[-1]
        raise ProcessNotFound(f"SLURM job {jobid} is not running ({said[:200]})",
                              "check the id with `squeue -u $USER`")
    state, _, nodelist = lines[0].partition("|")
    if state != "RUNNING":
        raise ProcessNotFound(f"SLURM job {jobid} is {state}, not RUNNING: it has no ranks to "
                              "diagnose", "wait until `squeue -j JOBID` says RUNNING")
    done = _run([_tool("scontrol"), "show", "hostnames", nodelist], timeout)
    nodes = [n.strip() for n in done.stdout.splitlines() if n.strip()]
    if done.returncode != 0 or not nodes:
        raise FlightProfilerError(f"scontrol could not expand the node list {nodelist!r}: "
                                  f"{done.stderr.strip()[:200]}", "check `scontrol show job JOBID`")
    try:
        return [safe_node_name(n) for n in nodes]
    except ArchiveError as exc:  # the name becomes a directory: nothing path-like passes
        raise FlightProfilerError(f"scontrol expanded {nodelist!r} to a bad name: {exc}",
                                  "report it to the cluster's admins") from None


def srun_argv(srun: str, jobid: str, node: str, remote: list[str], out_dir: str | None,
              diagnose_args: list[str], job_pid: str) -> list[str]:
    """The srun command line for one node; ``out_dir`` None streams the results back."""
    where = ["--out", os.path.join(out_dir, node)] if out_dir is not None else ["--stream"]
    return [srun, "--overlap", "--jobid", jobid, "--nodes", "1", "--ntasks", "1",
            "--nodelist", node, "--kill-on-bad-exit=0", *remote, "job", "node", jobid,
            "--job-pid", job_pid, *where, "--", *diagnose_args]


def _stop(proc: subprocess.Popen[str], grace: float = DETACH_GRACE + 10) -> None:
    """End one node's srun so that its diagnose detaches its agents from the ranks first.

    srun forwards SIGUSR1 to the step's tasks and keeps waiting for them: the node step
    (job_node.py) turns it into the SIGINT that makes diagnose detach and end, then srun ends.
    Only if that takes longer than ``grace`` (the node's own grace, and then some): two SIGINTs within a second (srun aborts the step:
    SIGTERM, then SIGKILL after KillWait), then SIGKILL to srun. Never a SIGTERM to srun first:
    srun kills the step's tasks at once on it (measured: exit 137), agents left behind."""
    for sig, wait in ((signal.SIGUSR1, grace), (signal.SIGINT, 0.3), (signal.SIGINT, 5.0),
                      (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # its own session: srun, never us
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)


class _Steps:
    """The sruns running now, so that a Ctrl-C or an error stops every one of them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen[str]] = set()
        self.cancelled = False

    def start(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[str] | None:
        with self.lock:
            if self.cancelled:
                return None
            proc: subprocess.Popen[str] = subprocess.Popen(argv, **kwargs)
            self.procs.add(proc)
            return proc

    def done(self, proc: subprocess.Popen[str]) -> None:
        with self.lock:
            self.procs.discard(proc)

    def stop_all(self) -> None:
        with self.lock:
            self.cancelled = True
            procs = list(self.procs)
        stoppers = [threading.Thread(target=_stop, args=(p,)) for p in procs]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()


def run_node(argv: list[str], node: str, out_dir: str, stream: bool, deadline: float,
             progress: Callable[[str], None], steps: _Steps | None = None) -> NodeResult:
    """Run one node's srun until it ends or ``deadline``; collect its output."""
    start = time.monotonic()
    steps = steps or _Steps()
    log = os.path.join(out_dir, f".{node}.srun.log")
    with open(log, "wb") as err, tempfile.TemporaryFile(dir=out_dir) as sink:
        proc = steps.start(argv, stdout=subprocess.PIPE if stream else subprocess.DEVNULL,
                           stderr=err, stdin=subprocess.DEVNULL, text=True,
                           start_new_session=True)
        if proc is None:
            return NodeResult(node, False, None, 0.0, "not started: the job command was stopped")
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), _stop, (proc,))
        timer.start()
        try:
            received = None
            problem = None
            if stream:
                assert proc.stdout is not None
                try:
                    received = read_stream(proc.stdout, sink=sink)
                except ArchiveError as exc:
                    problem = str(exc)
                    for _ in proc.stdout:  # drain, so that srun is not blocked on a full pipe
                        pass
            code = proc.wait()
        finally:
            timer.cancel()
            steps.done(proc)
        seconds = time.monotonic() - start
        timed_out = time.monotonic() >= deadline
        node_dir = os.path.join(out_dir, node)
        result = NodeResult(node, False, None, seconds)
        if received is not None and received.sink is not None:
            result.exit_code = received.exit_code
            try:
                result.files = len(unpack(received.sink, node_dir))
            except (ArchiveError, OSError) as exc:
                problem = f"its archive was refused: {exc}"
    if not stream and os.path.isdir(node_dir):
        result.exit_code = code
        result.files = sum(len(files) for _, _, files in os.walk(node_dir))
    if timed_out:
        result.error = f"did not finish within --timeout ({seconds:.0f} s): stopped"
    elif problem is None and result.exit_code in _NODE_OK and result.files:
        result.ok = True
        with contextlib.suppress(OSError):
            os.unlink(log)
    else:
        parts = [_why(code, log)] if code != 0 else []
        if problem and (code == 0 or received is not None or "no archive" not in problem):
            parts.append(problem)  # "sent no archive" after its own error line says nothing
        result.error = "; ".join(parts) or (f"its diagnose exited {result.exit_code} "
                                            f"with {result.files} file(s)")
    progress(f"node {node}: " + ("done" if result.ok else f"FAILED: {result.error}")
             + f" ({seconds:.1f} s)")
    return result


def _why(code: int, log: str) -> str:
    try:
        with open(log, encoding="utf-8", errors="replace") as fh:
            lines = [ln.strip() for ln in fh if ln.strip()]
    except OSError:
        lines = []
    said = next((ln for ln in reversed(lines) if ln.startswith("error:")), lines[-1] if lines else "")
    return f"exit {code}" + (f": {said[:300]}" if said else "")


def run_job(jobid: str, out_dir: str, diagnose_args: list[str], *, shared: bool,
            timeout: float, fanout: int, remote: list[str] | None = None, job_pid: str = "auto",
            progress: Callable[[str], None] | None = None) -> JobRun:
    """Diagnose every node of ``jobid`` into ``out_dir/<node>``; never raises for one node."""
    say = progress or (lambda _msg: None)
    deadline = time.monotonic() + timeout
    srun = _tool("srun")
    nodes = job_nodes(jobid)
    remote = remote or [sys.executable, "-m", "flight_profiler"]
    os.makedirs(out_dir, exist_ok=True)
    taken = [n for n in nodes if os.path.exists(os.path.join(out_dir, n))]
    if taken:
        raise UsageError(f"{os.path.join(out_dir, taken[0])} exists: the job's nodes write "
                         "into DIR/<node>", "pass a new --out DIR")
    say(f"job {jobid}: {len(nodes)} node(s): {', '.join(nodes)}")
    run = JobRun(jobid, os.path.abspath(out_dir))

    steps = _Steps()

    def one(node: str) -> NodeResult:
        argv = srun_argv(srun, jobid, node, remote, out_dir if shared else None,
                         diagnose_args, job_pid)
        return run_node(argv, node, out_dir, not shared, deadline, say, steps)

    pool = ThreadPoolExecutor(max_workers=max(1, min(fanout, len(nodes))))
    try:
        run.nodes = list(pool.map(one, nodes))
    except BaseException:  # Ctrl-C: no srun, and no diagnose on a node, outlives the command
        steps.stop_all()
        raise
    finally:
        pool.shutdown(wait=True)
    return run


def write_job_json(run: JobRun) -> str:
    from flight_profiler.atomic_files import write_text_atomic

    path = os.path.join(run.out_dir, "job_srun.json")
    write_text_atomic(path, json.dumps(run.to_dict(), indent=2) + "\n")
    return path


def merge_report(run: JobRun) -> Report:
    """One job report over every node's directory (report/job_merge.py: the job rules across
    the nodes, each finding naming its ranks' node, ranks in no directory named missing); each
    node that gave no directory is an input that could not be read, so every view of the report
    (terminal, md, json, html) lists it with why."""
    from flight_profiler.errors import BadInputFile
    from flight_profiler.report import analyze
    from flight_profiler.report.job_merge import merge_node_dirs, merged_report
    from flight_profiler.report.models import InputResult

    done = [os.path.join(run.out_dir, n.node) for n in run.nodes if n.ok]
    try:
        merged = merge_node_dirs(done) if done else None
    except BadInputFile:  # no node's directory holds a readable diagnose_job.json
        merged = None
    report: Report
    if merged is not None:
        report = merged_report(merged)
        for path, why in merged.skipped:
            report.inputs.append(InputResult(path, "node", False, why))
    else:
        report = analyze(done)
    for n in run.nodes:
        if not n.ok:
            report.inputs.append(InputResult(os.path.join(run.out_dir, n.node), "node", False,
                                             f"node {n.node} missing from the job report: "
                                             f"{n.error}"))
    return report
