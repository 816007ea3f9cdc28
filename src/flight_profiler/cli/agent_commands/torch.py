"""`torch memory`, `torch tensors`, `torch profile`, `torch dataloader`: how answers are shown."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flight_profiler.report.units import fmt_bytes

if TYPE_CHECKING:
    from rich.console import Console


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


# -- torch tensors -------------------------------------------------------------------------


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
    if data.get("moment") and data["moment"] != "at a safe point":
        console.print(f"taken {data['moment']}")
    rows = data.get("holders") or []
    compared = any("sampled" in h for h in rows)
    columns = ["kind", "tensors", "bytes", "grad_fn", "graph bytes"] + (["since the previous census"] if compared else [])
    holders = Table(holder_col(), *columns, title="who holds them")
    for h in rows:
        kind = f"{h['kind']} (cap {h['cap']})" if "cap" in h else h["kind"]
        cells = [kind, str(h["count"]), _size(h["bytes"]), str(h["with_grad_fn"]), _size(h["graph_bytes"])]
        if compared:
            cells.append(_since(h))
        holders.add_row(h["example"] if h["path"] == h["example"] else f"{h['path']}  (e.g. {h['example']})", *cells)
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


def _since(h: dict[str, Any]) -> str:
    """What a holder still holds of the previous census, and whether its graph is chained to it."""
    parts = []
    if "sampled" in h:
        parts.append(f"{h.get('kept', 0)} of {h['sampled']} still held")
    if h.get("chained") is True:
        parts.append("graph chained to the previous one")
    return "; ".join(parts) or "new"


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
    ops = data.get("top_ops")
    if not ops:  # a trace too big to summarise inside the target (the note says so)
        console.print("open the trace in Perfetto (ui.perfetto.dev); `flight_profiler report FILE` diagnoses it")
        return
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
            rate = (f" ({it['batches_in_window']} in the {data.get('sampled_s')} s sampled: "
                    f"{it['batches_per_s']}/s)" if it.get("batches_per_s") is not None else "")
            console.print(f"  iterator {it.get('type')}: {it.get('batches_yielded')} batches yielded{rate}, "
                          f"{it.get('batches_in_flight')} in flight, {it.get('batches_ready')} ready"
                          + (" (ended during the sample)" if it.get("ended_during_window") else ""))
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
