"""`torch memory`, `torch tensors`, `torch profile`, `torch dataloader`: parse, resolve paths here,
render answers.

Output paths are resolved on this side (relative to the user's cwd) and sent absolute; without
-f the agent names the file fp-<pid>-<kind>-<timestamp>.<ext> in this cwd (docs/commands-torch.md).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import click

from flight_profiler.cli.agent_commands.base import AgentRequest, target_args
from flight_profiler.cli.params import FiniteFloatRange
from flight_profiler.report.units import fmt_bytes

if TYPE_CHECKING:
    from rich.console import Console


def _out(file: str | None) -> dict[str, Any]:
    """The path arguments every file-writing command sends."""
    if file:
        return {"path": os.path.abspath(os.path.expanduser(file))}
    return {"default_dir": os.getcwd()}


def _size(n: Any) -> str:
    """Bytes from the agent's JSON, where a missing figure is None or a string."""
    try:
        return fmt_bytes(float(n))
    except (TypeError, ValueError):
        return "?"


def _signed(n: Any) -> str:
    v = int(n or 0)
    return ("+" if v > 0 else "-" if v < 0 else "") + _size(abs(v))


def render_progress(data: dict[str, Any], console: Console) -> None:
    message = data.get("message")
    if message:
        console.print(f"[dim]{message}[/dim]")


def _file_line(data: dict[str, Any], console: Console, what: str) -> None:
    if data.get("path"):
        console.print(f"{what} written: [bold]{data['path']}[/bold] ({_size(data.get('size'))})")


# -- torch memory --------------------------------------------------------------------------


def render_memory(data: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    mode = data.get("mode")
    if mode == "summary":
        console.print(f"process RSS: {_size(data.get('rss_bytes'))}   CUDA in use: {data.get('cuda')}")
        if data.get("devices"):
            t = Table("device", "allocated", "reserved", "peak allocated", "reserved - allocated")
            for d in data["devices"]:
                t.add_row(d["device"], _size(d["allocated"]), _size(d["reserved"]),
                          _size(d["peak_allocated"]), _size(d["fragmentation"]))
            console.print(t)
            settings = data.get("allocator_settings") or {}
            console.print("allocator settings: " + (", ".join(f"{k}={v}" for k, v in settings.items()) or "defaults"))
        t = Table("device", "live tensors", "bytes (storages once)", title="live tensors by device")
        for dev, row in sorted((data.get("tensors_by_device") or {}).items()):
            t.add_row(dev, str(row["count"]), _size(row["bytes"]))
        console.print(t)
        return
    if mode == "history":
        console.print(f"allocation history recording: {'on' if data.get('recording') else 'off'} - {data.get('note', '')}")
        return
    _file_line(data, console, "snapshot" if mode == "snapshot" else "recording")
    if mode == "snapshot":
        console.print(f"{data.get('device_type')} snapshot: {data.get('segments')} segments, "
                      f"{_size(data.get('reserved_bytes'))} reserved, {_size(data.get('active_bytes'))} active, "
                      f"{data.get('trace_entries')} trace entries")
    else:
        console.print(f"{data.get('summary', '')}; still allocated at the end: {_size(data.get('surviving_bytes'))}")
        if data.get("timed_out") or data.get("cancelled"):
            console.print(f"[yellow]stopped early: {data.get('calls_recorded')} of {data.get('calls_requested')} calls[/yellow]")
        if data.get("top_sites"):
            t = Table("allocation site", "count", "bytes", title="top allocation sites")
            for row in data["top_sites"]:
                t.add_row(row["site"], str(row["count"]), _size(row["bytes"]))
            console.print(t)
    for note in data.get("notes") or []:
        console.print(f"[yellow]note:[/yellow] {note}")
    if data.get("path"):
        console.print("open it with `flight_profiler report FILE` or PyTorch's memory_viz")


@click.command("torch memory", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", nargs=-1)
@click.option("-s", "--snapshot", is_flag=True, help="Write a memory snapshot pickle (PyTorch's schema).")
@click.option("-r", "--record", is_flag=True, help="Record allocations during the next call(s) of TARGET.")
@click.option("--record-history", type=click.Choice(["on", "off"]), help="Start/stop CUDA allocation history recording.")
@click.option("--max-entries", type=click.IntRange(1), help="History ring buffer size (CUDA).")
@click.option("-n", "--calls", type=click.IntRange(1), default=1, show_default=True, help="Calls to record (-r).")
@click.option("-f", "--file", "file", help="Output file (default: fp-<pid>-memory-<time>.pickle in this directory).")
@click.option("--timeout", type=FiniteFloatRange(0.1), default=60.0, show_default=True, help="Seconds to wait for the calls (-r).")
@click.option("--label", default="", help="Label stored in the file.")
def memory(target: tuple[str, ...], snapshot: bool, record: bool, record_history: str | None,
           max_entries: int | None, calls: int, file: str | None, timeout: float, label: str) -> AgentRequest:
    """Allocator state; -s snapshot; -r record a method's allocations; --record-history on|off.

    \b
    torch memory                         per-device allocated/reserved/peak, RSS, live tensors
    torch memory -s [-f snap.pickle]     snapshot (CUDA allocator, or live storages on CPU)
    torch memory --record-history on     CUDA: later snapshots carry allocation stacks
    torch memory -r __main__ train_step -n 2   allocations and frees with Python stacks
    """
    from flight_profiler.errors import UsageError

    chosen = [name for name, on in (("-s", snapshot), ("-r", record), ("--record-history", record_history)) if on]
    if len(chosen) > 1:
        raise UsageError(f"torch memory: {' and '.join(chosen)} cannot be combined", "pick one mode")
    if target and not record:
        raise UsageError("torch memory: a method is only used with -r", "e.g. `torch memory -r __main__ train_step`")
    args: dict[str, Any] = {"label": label}
    if record:
        args.update(mode="record", target=target_args(target), calls=calls, timeout=timeout, **_out(file))
        if max_entries:
            args["max_entries"] = max_entries
    elif snapshot:
        args.update(mode="snapshot", **_out(file))
    elif record_history:
        args.update(mode="history", history=record_history, max_entries=max_entries)
    else:
        if file:
            raise UsageError("torch memory: -f needs -s or -r", "e.g. `torch memory -s -f snap.pickle`")
        args["mode"] = "summary"
    return AgentRequest("torch memory", args, render_memory, render_progress)


# -- torch tensors -------------------------------------------------------------------------


def load_census(path: str) -> dict[str, Any]:
    """A previous census for --diff (JSON only; never a pickle)."""
    from flight_profiler.errors import BadInputFile

    full = os.path.abspath(os.path.expanduser(path))
    try:
        with open(full, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise BadInputFile(f"cannot read {full}: {exc.strerror}", "pass a census written by `torch tensors`") from None
    except UnicodeDecodeError:
        # a pickle or a gzip given by mistake: the codec's byte offsets say nothing to the user
        raise BadInputFile(f"{full} is a binary file, not a census (census files are JSON)",
                           "pass a census written by `torch tensors`") from None
    except ValueError as exc:
        raise BadInputFile(f"{full} is not JSON: {exc}", "pass a census written by `torch tensors`") from None
    if not isinstance(doc, dict) or doc.get("format") != "flight_profiler.census":
        raise BadInputFile(f"{full} is not a flight_profiler census", "pass a file written by `torch tensors`")
    return {k: doc.get(k) for k in ("pid", "time", "label", "totals", "groups", "holders")}


def render_tensors(data: dict[str, Any], console: Console) -> None:
    from rich.table import Column, Table

    def holder_col() -> Column:
        # The holder path is the answer: fold it onto more lines rather than cut it.
        return Column("holder", overflow="fold", min_width=24)

    _file_line(data, console, "census")
    totals = data.get("totals") or {}
    console.print(f"{totals.get('count', 0)} live tensors, {_size(totals.get('bytes'))} "
                  f"(storages counted once); {totals.get('with_grad_fn', 0)} hold a grad_fn, their graphs "
                  f"keep {_size(totals.get('graph_bytes'))} more alive; census took {float(data.get('elapsed_s') or 0):.2f} s")
    holders = Table(holder_col(), "kind", "tensors", "bytes", "grad_fn", "graph bytes", title="who holds them")
    for h in data.get("holders") or []:
        holders.add_row(h["example"] if h["path"] == h["example"] else f"{h['path']}  (e.g. {h['example']})",
                        h["kind"], str(h["count"]), _size(h["bytes"]), str(h["with_grad_fn"]), _size(h["graph_bytes"]))
    groups = Table("device", "dtype", "shape", "tensors", "bytes", "grad_fn", title="biggest groups")
    for g in data.get("groups") or []:
        groups.add_row(g["device"], g["dtype"], str(tuple(g["shape"])), str(g["count"]), _size(g["bytes"]), str(g["with_grad_fn"]))
    for table in ((groups, holders) if data.get("by") == "shape" else (holders, groups)):
        console.print(table)
    if data.get("note"):
        console.print(f"[yellow]note:[/yellow] {data['note']}")
    diff = data.get("diff")
    if diff:
        t = diff.get("totals", {})
        console.print(f"since the previous census ({diff.get('seconds_between')} s earlier): "
                      f"{t.get('count_delta', 0):+d} tensors, {_signed(t.get('bytes_delta'))}, "
                      f"graphs {_signed(t.get('graph_bytes_delta'))}")
        if not diff.get("same_process"):
            console.print("[yellow]the previous census is from another process[/yellow]")
        grew = Table(holder_col(), "tensors", "bytes", "graph bytes", title="what grew, by holder")
        for h in diff.get("holders") or []:
            grew.add_row(h["path"], f"{h['count_before']} -> {h['count_after']}", _signed(h["bytes_delta"]), _signed(h["graph_bytes_delta"]))
        console.print(grew)
        gg = Table("device", "dtype", "shape", "tensors", "bytes", title="what grew, by group")
        for g in diff.get("groups") or []:
            gg.add_row(g["device"], g["dtype"], str(tuple(g["shape"])), f"{g['count_before']} -> {g['count_after']}", _signed(g["bytes_delta"]))
        console.print(gg)
    skipped = data.get("skipped") or {}
    if skipped.get("reason"):
        console.print(f"[yellow]incomplete:[/yellow] {skipped['reason']}")


@click.command("torch tensors", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--top", type=click.IntRange(1), default=10, show_default=True, help="Rows per table.")
@click.option("--by", type=click.Choice(["holder", "shape", "site"]), default="holder", show_default=True,
              help="Which table comes first (sites are only known to `torch memory -r`).")
@click.option("--diff", "diff", type=click.Path(dir_okay=False), help="A previous census JSON: show what grew.")
@click.option("-f", "--file", "file", help="Output JSON (default: fp-<pid>-census-<time>.json in this directory).")
@click.option("--label", default="", help="Label stored in the census.")
@click.option("--budget", type=FiniteFloatRange(0.1), default=5.0, show_default=True, help="Time budget in seconds.")
def tensors(top: int, by: str, diff: str | None, file: str | None, label: str, budget: float) -> AgentRequest:
    """Census of live tensors and who holds them (leak finder); --diff PREVIOUS.json for growth.

    \b
    torch tensors -f before.json
    torch tensors -f after.json --diff before.json    what grew, by holder and by shape
    """
    args: dict[str, Any] = {"top": top, "by": by, "label": label, "seconds": budget, **_out(file)}
    if diff:
        args["previous"] = load_census(diff)
    return AgentRequest("torch tensors", args, render_tensors, render_progress)


# -- torch profile -------------------------------------------------------------------------


def render_profile(data: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    _file_line(data, console, "trace")
    if data.get("mode") == "window":
        console.print(f"profiled {'all threads' if data.get('all_threads') else 'the agent thread only'} "
                      f"for {data.get('duration_s')} s")
    else:
        console.print(f"profiled {data.get('calls_recorded')} of {data.get('calls_requested')} calls of {data.get('target')}")
    if data.get("note"):
        console.print(f"[yellow]note:[/yellow] {data['note']}")
    ops = data.get("top_ops") or {}
    cuda = ops.get("has_cuda")
    columns = ["operator", "calls", "self CPU", "CPU total"] + (["self CUDA"] if cuda else [])
    t = Table(*columns, title=f"top operators by {ops.get('sort_by')} ({ops.get('operators', 0)} distinct)")
    for r in ops.get("rows") or []:
        row = [r["name"][:70], str(int(r["count"])), f"{r['self_cpu'] / 1000:.3f} ms", f"{r['cpu_total'] / 1000:.3f} ms"]
        if cuda:
            row.append(f"{r['self_cuda'] / 1000:.3f} ms")
        t.add_row(*row)
    console.print(t)
    console.print("open the trace in Perfetto (ui.perfetto.dev) or chrome://tracing; `flight_profiler report FILE` diagnoses it")


def _schedule(text: str | None) -> list[int] | None:
    from flight_profiler.errors import UsageError

    if not text:
        return None
    try:
        parts = [int(x) for x in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) not in (3, 4) or min(parts) < 0 or parts[2] < 1:
        raise UsageError(f"bad --schedule {text!r}", "use wait,warmup,active[,repeat], e.g. 1,1,3")
    return parts


@click.command("torch profile", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", nargs=-1)
@click.option("--duration", type=FiniteFloatRange(0.01, 3600), help="Profile all threads for SECONDS instead of a method.")
@click.option("-n", "--calls", type=click.IntRange(1), default=1, show_default=True, help="Calls to profile.")
@click.option("-f", "--file", "file", help="Output trace (default: fp-<pid>-profile-<time>.pt.trace.json.gz here).")
@click.option("--record-shapes", is_flag=True, help="Record operator input shapes.")
@click.option("--profile-memory", is_flag=True, help="Record allocations ([memory] events).")
@click.option("--with-stack", is_flag=True, help="Record Python stacks (python_function events).")
@click.option("--sort-by", type=click.Choice(["self_cpu", "cpu_total", "self_cuda", "count"]),
              help="Sort key of the operator table (default self_cuda with CUDA, else self_cpu).")
@click.option("--row-limit", type=click.IntRange(1), default=15, show_default=True, help="Rows of the operator table.")
@click.option("--timeout", type=FiniteFloatRange(0.1), default=60.0, show_default=True, help="Seconds to wait for the calls.")
@click.option("--schedule", help="wait,warmup,active[,repeat]: ProfilerStep per call (training steps).")
@click.option("--tensorboard", type=click.Path(file_okay=False), help="Write DIR/plugins/profile/<run>/<host>_<pid>.<ts>.pt.trace.json.gz.")
@click.option("--label", default="", help="Trace name (and TensorBoard run name).")
def profile(target: tuple[str, ...], duration: float | None, calls: int, file: str | None,
            record_shapes: bool, profile_memory: bool, with_stack: bool, sort_by: str | None,
            row_limit: int, timeout: float, schedule: str | None, tensorboard: str | None,
            label: str) -> AgentRequest:
    """Profile a method's next calls (or all threads for --duration) to a Chrome trace.

    \b
    torch profile __main__ train_step -n 3 --with-stack
    torch profile mypkg.trainer Trainer step --schedule 1,1,3
    torch profile --duration 5 -f window.json.gz
    """
    from flight_profiler.errors import UsageError

    if duration is not None and target:
        raise UsageError("torch profile: give a method or --duration, not both")
    if duration is None and not target:
        raise UsageError("torch profile: give `module [class] method` or --duration SECONDS",
                         "e.g. `torch profile __main__ train_step -n 3`")
    if tensorboard and file:
        raise UsageError("torch profile: --tensorboard and -f cannot be combined", "--tensorboard names the file itself")
    args: dict[str, Any] = {
        "record_shapes": record_shapes, "profile_memory": profile_memory, "with_stack": with_stack,
        "sort_by": sort_by, "row_limit": row_limit, "label": label, **_out(file),
    }
    if tensorboard:
        args["tensorboard"] = os.path.abspath(os.path.expanduser(tensorboard))
    if duration is not None:
        if schedule:
            raise UsageError("torch profile: --schedule needs a method")
        args["duration"] = duration
    else:
        args.update(target=target_args(target), calls=calls, timeout=timeout, schedule=_schedule(schedule))
    return AgentRequest("torch profile", args, render_profile, render_progress)


# -- torch dataloader ----------------------------------------------------------------------

_CATEGORY = {"dataloader_wait": "waiting for DataLoader workers", "dataloader_load": "loading batches itself",
             "sleep": "sleeping", "io": "in I/O", "wait": "waiting", "running": "running Python/ops"}


def render_dataloader(data: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    if data.get("note"):
        console.print(data["note"])
    for n, dl in enumerate(data.get("loaders") or [], 1):
        ds = dl.get("dataset") or {}
        length = "?" if ds.get("length") is None else ds["length"]
        console.print(f"[bold]DataLoader {n}[/bold] ({dl.get('type')}): dataset {ds.get('type')} "
                      f"(len {length}), batch_size={dl.get('batch_size')}, num_workers={dl.get('num_workers')}, "
                      f"pin_memory={dl.get('pin_memory')}, prefetch_factor={dl.get('prefetch_factor')}, "
                      f"persistent_workers={dl.get('persistent_workers')}")
        for it in dl.get("iterators") or []:
            console.print(f"  iterator {it.get('type')}: {it.get('batches_yielded')} batches yielded, "
                          f"{it.get('batches_in_flight')} in flight, {it.get('batches_ready')} ready")
            if it.get("workers"):
                t = Table("worker", "pid", "state", "CPU %", "RSS")
                for w in it["workers"]:
                    t.add_row(str(w.get("worker_id")), str(w.get("pid")), str(w.get("state")),
                              "?" if w.get("cpu_percent") is None else f"{w['cpu_percent']:.0f}",
                              _size(w.get("rss_bytes")))
                console.print(t)
        if not dl.get("iterators"):
            console.print("  no live iterator (not being iterated right now)")
    threads = data.get("threads") or []
    if threads:
        console.print(f"where the threads spent the last {data.get('sampled_s')} s:")
        for th in threads:
            shares = ", ".join(f"{_CATEGORY.get(k, k)} {v:.0%}" for k, v in (th.get("shares") or {}).items())
            console.print(f"  [bold]{th.get('thread')}[/bold]: {shares}")
            for top in (th.get("top") or [])[:2]:
                console.print(f"    {top['share']:.0%} {top['where']}")


@click.command("torch dataloader", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--sample", type=click.FloatRange(0, 60), default=1.0, show_default=True,
              help="Seconds of stack sampling to see what each thread waits on (0: none).")
def dataloader(sample: float) -> AgentRequest:
    """DataLoaders alive in the target: dataset and length, batch_size, num_workers, pin_memory,
    prefetch_factor, persistent_workers; each worker's pid, state, CPU and RSS; batches in
    flight; and what the training loop is waiting on (sampled stacks).

    \b
    torch dataloader
    torch dataloader --sample 3       a longer look at what the loop waits on
    """
    return AgentRequest("torch dataloader", {"sample": sample}, render_dataloader)
