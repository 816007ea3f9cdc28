"""One job report from the per-node directories of ``diagnose --all-ranks`` (a multi-node job).

Each node runs ``diagnose LAUNCHER --all-ranks --out OUT/nodeK``; each directory's
``diagnose_job.json`` says which job (run id, master address, SLURM job id) and which global
ranks it holds, on which node (node rank, hostname). ``merge_node_dirs`` checks that the
directories are one job and that no rank comes twice, then the report engine reads every
directory's files together: the job rules compare global ranks across nodes as they do on one.

Ranks are identified by (job, global rank); the node is its node rank. The hostname is shown to
the reader, never used to tell ranks or nodes apart (simulated nodes on one machine share it).
Events are never ordered across nodes by wall clock: the rules compare per-rank durations
(waits and work per step, step times), Flight Recorder sequence ids, and Flight Recorder enqueue
times only between ranks of one node (report/rules/job_fr.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from flight_profiler.errors import BadInputFile, UsageError
from flight_profiler.rank_list import format_ranks

JOB_FILE = "diagnose_job.json"
_MAX_JOB_FILE = 16 << 20  # a real one is a few KiB per rank
_JOB_KEYS = ("run_id", "master", "slurm_job_id")
MAX_NODES = 4096


@dataclass
class NodeDir:
    path: str
    node_rank: int | None
    hostname: str | None
    job: dict[str, Any]
    ranks: list[int]
    world_size: int | None

    def label(self) -> str:
        node = f"node {self.node_rank}" if self.node_rank is not None else "node ?"
        return f"{node} ({self.hostname})" if self.hostname else node


@dataclass
class MergedJob:
    nodes: list[NodeDir]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (directory, why)
    world_size: int | None = None

    @property
    def node_of(self) -> dict[int, NodeDir]:
        return {r: n for n in self.nodes for r in n.ranks}

    @property
    def missing(self) -> list[int]:
        if not self.world_size or self.world_size > 100_000:
            return []
        have = self.node_of
        return [r for r in range(self.world_size) if r not in have]

    def job_id(self) -> str:
        return job_id(self.nodes[0].job) if self.nodes else "-"

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id(), "world_size": self.world_size,
                "nodes": [{"path": n.path, "node_rank": n.node_rank, "hostname": n.hostname,
                           "ranks": n.ranks} for n in self.nodes],
                "missing_ranks": self.missing,
                "skipped": [{"path": p, "reason": why} for p, why in self.skipped]}


class NodeDirError(ValueError):
    pass


def job_id(job: dict[str, Any]) -> str:
    parts = [f"{k}={job[k]}" for k in _JOB_KEYS if job.get(k)]
    return " ".join(parts) or "(no job identity)"


def node_dirs(paths: list[str]) -> list[str] | None:
    """The node directories named by ``paths`` (the ``report DIR1 DIR2`` form: every path a
    directory, at least one with diagnose_job.json; or the ``report PARENT`` form: one directory
    without one whose subdirectories have it), else None (the plain inputs form)."""
    if not paths or not all(os.path.isdir(p) for p in paths):
        return None
    if len(paths) == 1:
        parent = paths[0]
        if os.path.isfile(os.path.join(parent, JOB_FILE)):
            return None  # one node's directory: the single-node form, as before
        try:
            subs = sorted(os.path.join(parent, d) for d in os.listdir(parent))
        except OSError:
            return None
        subs = [d for d in subs if os.path.isdir(d) and not os.path.islink(d)]
        found = [d for d in subs if os.path.isfile(os.path.join(d, JOB_FILE))]
        return subs if found else None
    return list(paths) if any(os.path.isfile(os.path.join(p, JOB_FILE)) for p in paths) else None


def read_node(path: str) -> NodeDir:
    """One node directory's identity, from its diagnose_job.json (read with O_NOFOLLOW)."""
    name = os.path.join(path, JOB_FILE)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise NodeDirError(f"no {JOB_FILE}: not a `diagnose --all-ranks` directory") from None
    except OSError as exc:
        raise NodeDirError(f"{JOB_FILE}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(_MAX_JOB_FILE + 1)
    if len(data) > _MAX_JOB_FILE:
        raise NodeDirError(f"{JOB_FILE} is over {_MAX_JOB_FILE >> 20} MiB")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise NodeDirError(f"{JOB_FILE} is not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(doc, dict) or doc.get("format") != "flight_profiler.diagnose_job":
        raise NodeDirError(f"{JOB_FILE} is not a flight_profiler.diagnose_job document")
    job = doc.get("job")
    if not isinstance(job, dict):
        raise NodeDirError(f"{JOB_FILE} has no job identity (written by an older flight_profiler: "
                           "run diagnose --all-ranks again)")
    job = {k: job.get(k) if isinstance(job.get(k), (str, int)) else None
           for k in (*_JOB_KEYS, "world_size", "node_rank", "hostname")}
    ranks_doc = doc.get("ranks")
    if not isinstance(ranks_doc, dict):
        raise NodeDirError(f'{JOB_FILE}: "ranks" is not an object')
    ranks: list[int] = []
    nodes: set[int] = set()
    for key, entry in ranks_doc.items():
        if not (isinstance(key, str) and key.isdigit() and len(key) < 7):
            raise NodeDirError(f"{JOB_FILE}: rank {key[:20]!r} is not a rank number")
        ranks.append(int(key))
        n = entry.get("node_rank") if isinstance(entry, dict) else None
        if type(n) is int:
            nodes.add(n)
    node_rank = job["node_rank"] if type(job["node_rank"]) is int else (
        nodes.pop() if len(nodes) == 1 else None)
    world = job["world_size"] if type(job["world_size"]) is int and job["world_size"] > 0 else None
    host = job["hostname"] if isinstance(job["hostname"], str) and job["hostname"].isprintable() else None
    return NodeDir(path, node_rank, host, job, sorted(ranks), world)


def _same_job(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two identities are one job unless a key both of them have differs."""
    return all(a.get(k) == b.get(k) for k in _JOB_KEYS if a.get(k) and b.get(k))


def merge_node_dirs(paths: list[str]) -> MergedJob:
    """The per-node directories of one job, checked: directories of two jobs are a UsageError
    naming both; a rank in two directories (overlapping or repeated runs on one node) is a
    UsageError naming the rank and both directories (refused, not deduped: which run to keep is
    the user's choice); the same directory twice counts once. A directory that cannot be read
    (corrupt, not a node directory) is skipped and listed in ``skipped``: its ranks are reported
    missing; when no directory can be read it is BadInputFile."""
    if len(paths) > MAX_NODES:
        raise UsageError(f"{len(paths)} node directories: more than {MAX_NODES}",
                         "pass the directories of one job, one per node")
    merged = MergedJob([])
    seen: set[str] = set()
    owner: dict[int, str] = {}  # global rank -> the directory that holds it
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        try:
            node = read_node(path)
        except NodeDirError as exc:
            merged.skipped.append((path, str(exc)))
            continue
        other = next((n for n in merged.nodes if not _same_job(n.job, node.job)), None)
        if other is not None:
            raise UsageError(f"{other.path} and {path} are from two different jobs "
                             f"({job_id(other.job)} vs {job_id(node.job)})",
                             "pass the node directories of one job")
        both = sorted(r for r in node.ranks if r in owner)
        if both:
            raise UsageError(f"rank(s) {format_ranks(both)} are in both {owner[both[0]]} and {path} "
                             "(overlapping node directories)",
                             "pass one directory per node, each from one diagnose --all-ranks run")
        owner.update(dict.fromkeys(node.ranks, path))
        merged.nodes.append(node)
    if not merged.nodes:
        reasons = "; ".join(f"{p}: {why}" for p, why in merged.skipped[:3])
        raise BadInputFile(f"no node directory could be read ({reasons})",
                           "pass the --out directories of `diagnose PID --all-ranks`, one per node")
    worlds = {n.world_size for n in merged.nodes if n.world_size}
    merged.world_size = max(worlds) if worlds else None
    merged.nodes.sort(key=lambda n: (n.node_rank is None, n.node_rank or 0, n.ranks[:1]))
    return merged


_ABSENT_NOTE = "(dead, or on another node: run --all-ranks there too)"


def merged_report(merged: MergedJob, jobs: int | None = None) -> Any:
    """The job report over every node's directory: the job rules on all the ranks together,
    each job finding told which node its ranks are on, the ranks in no directory named."""
    from flight_profiler.report import analyze

    report = analyze([n.path for n in merged.nodes], jobs=jobs)
    annotate(report, merged)
    return report


def annotate(report: Any, merged: MergedJob) -> None:
    """Name the node (node rank and host) of every rank a job finding is about, in its title
    and evidence (``metrics.nodes`` too); say which ranks no directory holds."""
    node_of = merged.node_of
    missing = merged.missing
    for f in report.findings:
        if not f.rule.startswith("job-"):
            continue
        if missing:
            f.evidence = [e.replace(_ABSENT_NOTE, "(in no node directory: dead, or its node's "
                                                  "directory was not passed)") for e in f.evidence]
        named = [r for r in (f.ranks or []) if r in node_of]
        if not named:
            continue
        f.metrics["nodes"] = {str(r): {"node_rank": node_of[r].node_rank,
                                       "hostname": node_of[r].hostname} for r in named}
        where = "; ".join(f"rank {r} on {node_of[r].label()}" for r in named[:8])
        f.title += f" [{where}]"
        f.evidence.append(f"{where} (from {', '.join(sorted({node_of[r].path for r in named}))})")
    report.job = merged.to_dict()
