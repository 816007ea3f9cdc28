"""`flight_profiler PID --all-ranks [--ranks 0,3-5] [--cmd "..."]`: one command on every local
rank of a torchrun job, attached in parallel, results labelled by rank (or one JSON document)."""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from flight_profiler.errors import FlightProfilerError, UsageError
from flight_profiler.requests.base import AgentRequest

if TYPE_CHECKING:
    from rich.console import Console

    from flight_profiler.api import Session
    from flight_profiler.attach.multirank import RankResult
    from flight_profiler.attach.ranks import ProcInfo
    from flight_profiler.cli.agent_commands.base import Rendering


def job_targets(pid: int, ranks_spec: str | None) -> list[ProcInfo]:
    """The local ranks of the job of ``pid`` (its launcher or any rank), optionally some."""
    from flight_profiler.attach import ranks

    wanted = ranks.parse_ranks(ranks_spec) if ranks_spec else None  # a typo fails first
    job = ranks.job_of(pid, ranks.scan(ranks_only=True))
    return ranks.select_ranks(job, wanted)


def per_rank_path(path: str, rank: int | None) -> str:
    """``/d/snap.pickle`` -> ``/d/snap_rank3.pickle``: one file per rank, never clobbered."""
    if rank is None:
        return path
    directory, name = os.path.split(path)
    stem, dot, ext = name.partition(".")
    return os.path.join(directory, f"{stem}_rank{rank}{dot}{ext}")


def _for_rank(req: AgentRequest, rank: int | None) -> AgentRequest:
    if isinstance(req.args.get("path"), str):
        return AgentRequest(req.cmd, {**req.args, "path": per_rank_path(req.args["path"], rank)},
                            req.line)
    return req


def run_request(targets: list[ProcInfo], req: AgentRequest, timeout: float, method: str,
                as_json: bool, shown: Rendering, deadline: float | None = None) -> list[RankResult]:
    """Run ``req`` on every target in parallel; stream events labelled by rank as they come."""
    from flight_profiler.attach.multirank import run_on_ranks
    from flight_profiler.cli.runner import console

    if req.cmd == "detach":
        from flight_profiler.attach.multirank import detach_ranks

        return detach_ranks(targets, timeout)
    lock = threading.Lock()
    by_pid = {t.pid: t.rank for t in targets}

    def work(session: Session) -> dict[str, Any]:
        rank = by_pid.get(session.pid)

        def on_event(data: dict[str, Any]) -> None:
            with lock:
                if as_json:
                    sys.stdout.write(json.dumps({"rank": rank, "event": data}, default=str) + "\n")
                    sys.stdout.flush()
                elif shown.event is not None:
                    console().print(f"[bold]rank {rank}[/bold]", highlight=False)
                    shown.event(data, console())

        return session.execute(_for_rank(req, rank), on_event, deadline)

    return run_on_ranks(targets, work, timeout, method)


def render(results: list[RankResult], req: AgentRequest, shown: Rendering, console: Console) -> None:
    from flight_profiler.cli.agent_commands.base import txt

    if req.cmd == "stack":
        render_grouped_stacks(results, console)
    else:
        for r in results:
            console.rule(f"rank {r.rank} (pid {r.pid}, {r.seconds:.2f}s)")
            if r.ok and r.result is not None and r.result.get("reason") == "no agent":
                console.print("no agent: nothing to detach")
            elif r.ok and r.result is not None:
                shown.result(r.result, console)
    for r in results:
        if not r.ok and r.error is not None:
            hint = f" (hint: {r.error.get('hint')})" if r.error.get("hint") else ""
            console.print(f"[red]rank {r.rank} (pid {r.pid}): {txt(r.error.get('message'))}"
                          f"{txt(hint)}[/red]", highlight=False)


def _who(ranks: list[int]) -> str:
    from flight_profiler.rank_list import format_ranks

    return f"rank {ranks[0]} is" if len(ranks) == 1 else f"ranks {format_ranks(ranks)} are"


def render_grouped_stacks(results: list[RankResult], console: Console) -> None:
    from flight_profiler.cli.agent_commands.base import txt
    from flight_profiler.rank_list import format_ranks
    from flight_profiler.report.rank_stacks import group_stacks

    per_rank = {r.rank if r.rank is not None else -r.pid: r.result for r in results
                if r.ok and r.result is not None}
    grouping = group_stacks(per_rank)
    for g in grouping.groups:
        label = "ranks" if len(g.ranks) > 1 else "rank"
        thread = "" if g.primary else f" [thread {g.thread}]"
        mark = "[bold red]ODD[/bold red] " if g.odd else ""
        console.print(f"{mark}[bold]{label} {format_ranks(g.ranks)}[/bold]{txt(thread, 400)}: "
                      f"{txt(g.position.describe())}", highlight=False)
        for frame in g.frames:
            console.print(f'  File "{txt(str(frame.get("file")))}", line {frame.get("line")}, '
                          f"in [cyan]{txt(str(frame.get('function')))}[/cyan]",
                          highlight=False, soft_wrap=True)
        console.print()
    for g in grouping.odd:
        others = grouping.primary[0]
        console.print(f"[bold red]odd:[/bold red] {_who(g.ranks)} at "
                      f"{txt(g.position.describe())}, while {_who(others.ranks)} at "
                      f"{txt(others.position.describe())}", highlight=False)


def run_all_ranks(pid: int, command_line: str, ranks_spec: str | None, as_json: bool,
                  timeout: float, method: str, deadline: float | None = None) -> bool:
    """One command on all (or some) local ranks. Returns True when every rank succeeded."""
    from flight_profiler.attach.multirank import to_document
    from flight_profiler.cli.agent_commands import rendering
    from flight_profiler.cli.runner import console
    from flight_profiler.requests import parse

    command_line, _, typed_spec = extract_rank_options(command_line)
    ranks_spec = typed_spec or ranks_spec
    req = parse(command_line)  # before touching any target: a typo leaves them all unharmed
    targets = job_targets(pid, ranks_spec)
    # one set of renderers for all ranks: a stream's spinner is one line for the whole job
    shown = rendering(req.cmd)
    results = run_request(targets, req, timeout, method, as_json, shown, deadline)
    if as_json:
        doc = to_document(results, command_line)
        if req.cmd == "stack":
            from flight_profiler.report.rank_stacks import group_stacks

            per_rank = {r.rank: r.result for r in results
                        if r.ok and r.result is not None and r.rank is not None}
            doc["grouped"] = group_stacks(per_rank).to_dict()
        sys.stdout.write(json.dumps(doc, default=str) + "\n")
        sys.stdout.flush()
    else:
        render(results, req, shown, console())
    return all(r.ok for r in results)


def run_all_ranks_shell(pid: int, ranks_spec: str | None, as_json: bool, timeout: float,
                        method: str, deadline: float | None = None) -> None:
    """The interactive shell, each line run on every selected rank."""
    from flight_profiler.cli.output import print_error
    from flight_profiler.rank_list import format_ranks
    from flight_profiler.requests import HelpShown, help_text

    targets = job_targets(pid, ranks_spec)
    interactive = sys.stdin.isatty()
    ranks = format_ranks([t.rank for t in targets if t.rank is not None])
    if interactive:
        print(f"flight_profiler: {len(targets)} rank(s) ({ranks}) of the job of pid {pid}. "
              "Every command runs on each rank. Type `help`, `quit` to leave.")
    while True:
        try:
            line = input(f"fp ranks {ranks}> " if interactive else "")
        except EOFError:
            break
        words = line.split()
        if not words:
            continue
        if words[0] in ("quit", "exit", "q"):
            break
        if words[0] in ("help", "?"):
            print(help_text(" ".join(words[1:]) or None))
            continue
        try:
            if not run_all_ranks(pid, line, ranks_spec, as_json, timeout, method, deadline):
                print("some ranks failed (see above)", file=sys.stderr)
        except HelpShown:
            continue
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
        except FlightProfilerError as err:
            print_error(err, as_json, one_line=True)


def extract_rank_options(command_line: str) -> tuple[str, bool, str | None]:
    """``"stack --all-ranks"`` -> ("stack", True, None): the rank options may also be typed
    inside the command, as the issue's `stack --all-ranks` reads."""
    import shlex

    from flight_profiler.agent.limits import MAX_STRING_CHARS

    # Only split what can hold a rank option, and never an oversized line: shlex is
    # quadratic, and the command parser refuses such lines with a usage error anyway.
    if "--all-ranks" not in command_line and "--ranks" not in command_line:
        return command_line, False, None
    if len(command_line) > MAX_STRING_CHARS:
        return command_line, False, None
    try:
        words = shlex.split(command_line)
    except ValueError:
        return command_line, False, None  # parse() reports the quoting error
    if "--all-ranks" not in words and "--ranks" not in words and not any(
            w.startswith("--ranks=") for w in words):
        return command_line, False, None
    kept: list[str] = []
    all_ranks, spec = False, None
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--all-ranks":
            all_ranks = True
        elif w == "--ranks":
            if i + 1 >= len(words):
                raise UsageError("--ranks needs a list", "e.g. --ranks 0,3-5")
            spec = words[i + 1]
            i += 1
        elif w.startswith("--ranks="):
            spec = w.split("=", 1)[1]
        else:
            kept.append(w)
        i += 1
    return shlex.join(kept), all_ranks, spec


def check_options(all_ranks: bool, ranks_spec: str | None) -> bool:
    if ranks_spec is not None and not ranks_spec.strip():
        raise UsageError("--ranks is empty", "e.g. --ranks 0,3-5")
    return all_ranks or ranks_spec is not None
