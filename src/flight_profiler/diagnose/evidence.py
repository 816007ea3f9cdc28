"""What the diagnosis adds to the report engine's verdicts: findings from live evidence that no
artefact file carries (the method's share of its loop, the DataLoaders' real settings), the
evidence that is missing because a phase failed, with what that hides, and the reading of the
artefacts the target wrote (through descriptors, where another user could have swapped them).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Any

from flight_profiler.atomic_files import kind_of
from flight_profiler.diagnose.model import FAILED, TIMED_OUT, DiagnoseResult
from flight_profiler.report.models import Finding, InputResult, Report

# What each phase's evidence shows; when it fails, what the report cannot see.
HIDES = {
    "status": "whether torch and CUDA are there (every torch phase)",
    "locate": "every phase that observes the method's calls",
    "memory": "the allocator's state (allocated vs reserved, fragmentation)",
    "snapshot-before": "memory growth over time and fragmentation (snapshots)",
    "snapshot-after": "memory growth over time and fragmentation (snapshots)",
    "census-before": "leaks of small tensors, who holds them, and retained autograd graphs",
    "census-middle": "whether growth goes on (three censuses tell a leak from a cache filling up)",
    "census-after": "leaks of small tensors, who holds them, and retained autograd graphs",
    "profile": "hot operators, launch overhead, transfer/sync stalls, DataLoader waits in the step",
    "record": "where the method allocates",
    "watch": "the method's cost per call and its share of the loop (input-bound loops)",
    "input": "the DataLoaders' settings and what the loop waits on between calls",
    "trace": "where the time goes inside the method",
}


def missing(result: DiagnoseResult) -> list[dict[str, str]]:
    """Phases that failed or timed out, each with why and what it hides."""
    return [{"phase": p.name, "title": p.title, "status": p.status, "reason": p.reason,
             "hides": HIDES.get(p.name, "its evidence")}
            for p in result.phases if p.status in (FAILED, TIMED_OUT)]


def step_of(findings_inputs: list[Any]) -> dict[str, Any] | None:
    """The step model of the profile (the first trace's), as the report computed it."""
    for inp in findings_inputs:
        if getattr(inp, "kind", None) == "trace" and inp.ok and inp.data.get("step"):
            return dict(inp.data["step"])
    return None


def dataloader_share(result: DiagnoseResult, inputs: list[Any]) -> dict[str, Any] | None:
    """The DataLoader's share of the loop, timed (input phase) and in the profile's steps."""
    from flight_profiler.report.live_loop import dataloader_share as timed_row
    from flight_profiler.report.live_loop import timed_share

    out: dict[str, Any] = {}
    phase = result.phase("input")
    watch = result.phase("watch")
    if phase is not None:
        timed = timed_row(phase.data.get("next_timing") or [],
                          (watch.data.get("loop") if watch is not None else None) or None)
        if timed is not None:
            out["timed_pct"] = round(100.0 * timed_share(timed), 2)
            out["timed"] = timed
    for inp in inputs:
        dl = inp.data.get("dataloader") if getattr(inp, "kind", None) == "trace" and inp.ok else None
        if dl:
            out["profile_pct"] = dl.get("pct_of_window")
            out["profile"] = {k: dl.get(k) for k in ("calls", "total_us", "clipped", "left_out",
                                                      "cut_us")}
            out["profile"]["over"] = inp.data.get("window_kind")
            break
    return out or None


def live_findings(result: DiagnoseResult, step: dict[str, Any] | None = None) -> list[Finding]:
    """Findings from the watch and input phases (not from files): the DataLoader's share of the
    loop (timed), and a loop that idles."""
    from flight_profiler.report import live_loop

    phase = result.phase("input")
    if phase is None:
        return []
    watch = result.phase("watch")
    loop = (watch.data.get("loop") if watch is not None else None) or None
    status = result.phase("status")
    cuda = bool(status.data.get("cuda")) if status is not None else False
    inputs = [os.path.join(result.options.out_dir, "diagnose.json")]
    method = result.options.target.label if result.options.target is not None else None
    threads = phase.data.get("threads") or []
    timed = live_loop.dataloader_share(phase.data.get("next_timing") or [], loop)
    out = []
    loader = live_loop.dataloader_finding(timed, loop, threads, phase.data.get("loaders") or [],
                                          method, step, phase.data.get("cpus"), cuda, inputs,
                                          phase.data.get("ranks_here"))
    if loader is not None:
        out.append(loader)
    idle = live_loop.idle_finding(loop, threads, method, inputs)
    if idle is not None:
        out.append(idle)
    unread = live_loop.graph_use_finding(phase.data.get("graph_use"), inputs)
    if unread is not None:
        out.append(unread)
    unshuffled = live_loop.set_epoch_finding(phase.data.get("loaders") or [], inputs)
    if unshuffled is not None:
        out.append(unshuffled)
    return out


def refine_fixes(result: DiagnoseResult, findings: list[Finding]) -> None:
    """A trace-based DataLoader finding gets the fix that starts from the loader's settings."""
    from flight_profiler.report.rules import dataloader_bottleneck

    phase = result.phase("input")
    loaders = (phase.data.get("loaders") if phase is not None else None) or []
    loader = next((d for d in loaders if d.get("iterators")), loaders[0] if loaders else None)
    if loader is None or phase is None:
        return
    status = result.phase("status")
    cuda = bool(status.data.get("cuda")) if status is not None else False
    for f in findings:
        if f.rule == "dataloader-bottleneck" and not f.metrics.get("busy_share"):
            f.fix = dataloader_bottleneck.settings_fix(loader, cpus=phase.data.get("cpus"), cuda=cuda,
                                                       ranks=phase.data.get("ranks_here")) + f.fix[2:]


def merge(result: DiagnoseResult, findings: list[Finding], inputs: list[Any] | None = None,
          ) -> list[Finding]:
    """The engine's findings plus the live ones. One problem, one finding: a live DataLoader
    verdict replaces the trace-based one, and a DataLoader share timed without the profiler
    decides (the profiler slows the loop, not the workers); the trace's figures stay as
    evidence."""
    from flight_profiler.report.cost import settle

    step = step_of(inputs or [])
    refine_fixes(result, findings)
    extra = live_findings(result, step)
    settle(extra)
    phase = result.phase("input")
    timed = None
    if phase is not None:
        from flight_profiler.report.live_loop import dataloader_share

        watch = result.phase("watch")
        timed = dataloader_share(phase.data.get("next_timing") or [],
                                 (watch.data.get("loop") if watch is not None else None) or None)
    # A profile's eval-with-grad (operators, graph nodes) stays the finding; the live calls'
    # count joins its evidence.
    for f in [f for f in extra if f.rule == "eval-with-grad"]:
        for old in findings:
            if old.rule == f.rule:
                old.evidence += [f"live: {line}" for line in f.evidence[:1]]
                extra.remove(f)
                break
    rules = {f.rule for f in extra}
    if timed is not None:
        rules.add("dataloader-bottleneck")  # the timed share is the verdict, either way
    replaced = [f for f in findings if f.rule in rules]
    for f in extra:
        for old in replaced:
            if old.rule == f.rule:
                f.evidence += [f"in the profile: {line}" for line in old.evidence[:2]]
                f.where = f.where or old.where
    merged = [f for f in findings if f.rule not in rules] + extra
    merged.sort(key=Finding.order)
    return merged


def merge_rank_loader(result: DiagnoseResult, findings: list[Finding], rank: int | None,
                      ) -> list[Finding]:
    """In a job's report: the DataLoader share one rank's diagnosis timed without the profiler
    decides for that rank's trace, as it does in the rank's own report (merge). A job report
    is made from the ranks' files alone, where a profile's next() spans, slowed by the profiler
    (a validation loader's batches in the window), read 19.5 % against 6.5 % timed."""
    from flight_profiler.report.cost import settle
    from flight_profiler.report.live_loop import dataloader_share

    phase = result.phase("input")
    if phase is None:
        return findings
    watch = result.phase("watch")
    if dataloader_share(phase.data.get("next_timing") or [],
                        (watch.data.get("loop") if watch is not None else None) or None) is None:
        return findings
    own = os.path.join(os.path.abspath(result.options.out_dir), "")
    mine = [f for f in findings if f.rule == "dataloader-bottleneck"
            and any(os.path.abspath(str(i)).startswith(own) for i in f.inputs)]
    live = [f for f in live_findings(result) if f.rule == "dataloader-bottleneck"]
    settle(live)
    for f in live:
        f.ranks = [rank] if rank is not None else []
        for old in mine:
            f.evidence += [f"in the profile: {line}" for line in old.evidence[:2]]
            f.where = f.where or old.where
    merged = [f for f in findings if not any(f is m for m in mine)] + live
    merged.sort(key=Finding.order)
    return merged


def as_dicts(items: list[Any]) -> list[dict[str, Any]]:
    return [dict(i) for i in items]


# -- reading what the target wrote ---------------------------------------------------------------
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class _Refused(Exception):
    """An artefact that is not what the agent wrote: not read at all."""


class _Private:
    """A fresh directory of ours (0700) inside a shared directory, reached only through its
    descriptor, holding hard links to the artefacts that passed the checks."""

    def __init__(self, directory: str, owners: set[int]) -> None:
        self.dir_fd = os.open(directory, _DIR_FLAGS)  # the user named it: its path is theirs
        self.fd = -1
        self.owners = owners | {os.fstat(self.dir_fd).st_uid}
        self.name = f".fp-read-{os.urandom(6).hex()}"
        os.mkdir(self.name, 0o700, dir_fd=self.dir_fd)
        self.fd = os.open(self.name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=self.dir_fd)
        st = os.fstat(self.fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
            raise OSError(f"{directory}/{self.name} was replaced as it was made")
        # a path through our descriptor: the engine's worker processes resolve it too
        self.prefix = f"/proc/{os.getpid()}/fd/{self.fd}"
        self.taken: list[str] = []

    def take(self, name: str) -> str:
        """Check ``name`` through one descriptor and link that very file in; its new path."""
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=self.dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _Refused("replaced by a symbolic link after the agent wrote it: not read") \
                    from None
            raise _Refused(f"cannot open it ({exc.strerror}): not read") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _Refused(f"{kind_of(st.st_mode)}, not the file the agent wrote: not read")
            if st.st_nlink != 1:
                raise _Refused("a hard link to another file, not the file the agent wrote: "
                               "not read")
            if st.st_uid not in self.owners:
                raise _Refused(f"owned by uid {st.st_uid}, neither the target's user nor you: "
                               "not read")
            alias = name if name not in self.taken else f"{len(self.taken)}-{name}"
            try:
                os.link(f"/proc/self/fd/{fd}", alias, dst_dir_fd=self.fd, follow_symlinks=True)
            except OSError:  # another file system (or no /proc link): a copy, through fd
                _copy(fd, alias, self.fd)
            self.taken.append(alias)
            return f"{self.prefix}/{alias}"
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.fd >= 0:
            for alias in self.taken:
                with contextlib.suppress(OSError):
                    os.unlink(alias, dir_fd=self.fd)
            mine = os.fstat(self.fd)
            os.close(self.fd)
            self.fd = -1
            with contextlib.suppress(OSError):
                now = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
                if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                    os.rmdir(self.name, dir_fd=self.dir_fd)
        os.close(self.dir_fd)


def _copy(src_fd: int, name: str, dir_fd: int) -> None:
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o600, dir_fd=dir_fd)
    try:
        os.lseek(src_fd, 0, os.SEEK_SET)
        while os.sendfile(out, src_fd, None, 1 << 30):
            pass
    finally:
        os.close(out)


def _shared(directory: str) -> bool:
    """Whether someone other than us may create or rename entries in ``directory``."""
    st = os.stat(directory)
    return st.st_uid != os.geteuid() or bool(st.st_mode & 0o022)


def target_uids(pid: int) -> set[int]:
    """The uids a target's agent writes files as (empty once it has exited)."""
    from flight_profiler.agent.protocol import process_uids

    try:
        return set(process_uids(pid))
    except (OSError, ValueError):
        return set()


def analyze_artefacts(paths: list[str], owners: set[int] | None = None,
                      loaded: dict[str, InputResult] | None = None) -> Report:
    """The report engine over the artefacts a target's agent wrote.

    In a directory another user may write (root diagnosing that user's job: the output
    directory is handed to them so that their agent can write), any artefact may have been
    swapped for a link to a file only we may read between the agent's write and our read.
    There each artefact is opened once (O_NOFOLLOW, O_NONBLOCK), checked with fstat (a regular
    file, one link, owned by ``owners``, us or the directory's owner), hard-linked through that
    descriptor into a fresh private directory of ours, and the engine reads it there through
    that directory's descriptor: never by its name again. One that fails is reported as
    unreadable, and not one of its bytes is read. Paths in the report are the artefacts' own.
    ``loaded``: artefacts loaded already (preload.py), used only for those read by their own
    names, i.e. in a directory that no one else may write.
    """
    from flight_profiler.report import analyze

    groups: dict[str, list[str]] = {}
    for p in paths:
        groups.setdefault(os.path.dirname(os.path.abspath(p)), []).append(p)
    readable: list[str] = []
    refused: list[InputResult] = []
    shown: dict[str, str] = {}  # a path the engine reads -> the artefact's own path
    private: list[_Private] = []
    try:
        for directory, members in groups.items():
            try:
                shared = _shared(directory)
            except OSError:
                shared = False  # gone: the engine says so for each file
            if not shared:
                readable.extend(members)
                continue
            holder = _Private(directory, set(owners or ()) | {os.geteuid()})
            private.append(holder)
            for p in members:
                try:
                    alias = holder.take(os.path.basename(p))
                except _Refused as exc:
                    refused.append(InputResult(p, "unknown", False, str(exc)))
                    continue
                readable.append(alias)
                shown[alias] = p
        own = {p: i for p, i in (loaded or {}).items() if p in readable and p not in shown}
        report = analyze(readable, loaded=own) if readable else Report(inputs=[], findings=[])
    finally:
        for holder in private:
            holder.close()
    _show_own_paths(report, shown)
    report.inputs.extend(refused)
    return report


def _show_own_paths(report: Report, shown: dict[str, str]) -> None:
    if not shown:
        return
    for inp in report.inputs:
        inp.path = shown.get(inp.path, inp.path)
    for f in report.findings:
        f.inputs = [shown.get(p, p) for p in f.inputs]
    for s in report.series:
        for point in s.get("points", []):
            if isinstance(point, dict) and point.get("path") in shown:
                point["path"] = shown[point["path"]]
