"""`torch memory`, `torch tensors`, `torch profile`, `torch dataloader`: how answers are shown."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flight_profiler.cli.agent_commands.base import fmt, txt
from flight_profiler.report.units import fmt_bytes

if TYPE_CHECKING:
    from rich.console import Console


def _size(n: Any) -> str:
    """Bytes from the agent's JSON, where a missing figure is None or a string."""
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return "?"
    try:
        return fmt_bytes(float(n))
    except (ValueError, OverflowError):  # NaN, infinities
        return "?"


def _signed(n: Any) -> str:
    if isinstance(n, bool) or not isinstance(n, (int, float)) or n != n:
        return "?"
    return ("+" if n > 0 else "-" if n < 0 else "") + _size(abs(n))


def _shape(shape: list[int]) -> str:
    return str(tuple(shape))


def render_progress(data: dict[str, Any], console: Console) -> None:
    message = data.get("message")
    if message:
        console.print(f"[dim]{txt(message, 400)}[/dim]", highlight=False)


def _file_line(data: dict[str, Any], console: Console, what: str) -> None:
    if data.get("path"):
        console.print(f"{what} written: [bold]{txt(data['path'])}[/bold] ({_size(data.get('size'))})",
                      highlight=False, soft_wrap=True)


def _note(console: Console, text: Any) -> None:
    console.print(f"[yellow]note:[/yellow] {txt(text)}", highlight=False)


# -- torch memory --------------------------------------------------------------------------


def render_memory(data: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    mode = data.get("mode")
    if mode == "summary":
        console.print(f"process RSS: {_size(data.get('rss_bytes'))}   CUDA in use: "
                      f"{txt(data.get('cuda'), 80)}", highlight=False)
        if data.get("devices"):
            t = Table("device", "allocated", "reserved", "peak allocated", "reserved - allocated")
            for d in data["devices"]:
                t.add_row(txt(d["device"], 80), _size(d["allocated"]), _size(d["reserved"]),
                          _size(d["peak_allocated"]), _size(d["fragmentation"]))
            console.print(t)
            settings = data.get("allocator_settings") or {}
            console.print("allocator settings: " + (", ".join(f"{txt(k, 200)}={txt(v, 400)}"
                                                              for k, v in settings.items())
                                                    or "defaults"), highlight=False)
        t = Table("device", "live tensors", "bytes (storages once)", title="live tensors by device")
        for dev, row in sorted((data.get("tensors_by_device") or {}).items()):
            t.add_row(txt(dev, 80), str(row["count"]), _size(row["bytes"]))
        console.print(t)
        return
    if mode == "history":
        console.print(f"allocation history recording: {'on' if data.get('recording') else 'off'} - "
                      f"{txt(data.get('note') or '')}", highlight=False)
        return
    _file_line(data, console, "snapshot" if mode == "snapshot" else "recording")
    if mode == "snapshot":
        console.print(f"{txt(data.get('device_type'), 40)} snapshot: {fmt(data.get('segments'), 'd')} "
                      f"segments, {_size(data.get('reserved_bytes'))} reserved, "
                      f"{_size(data.get('active_bytes'))} active, "
                      f"{fmt(data.get('trace_entries'), 'd')} trace entries", highlight=False)
    else:
        console.print(f"{txt(data.get('summary') or '')}; still allocated at the end: "
                      f"{_size(data.get('surviving_bytes'))}", highlight=False)
        if data.get("timed_out") or data.get("cancelled"):
            console.print(f"[yellow]stopped early: {fmt(data.get('calls_recorded'), 'd')} of "
                          f"{fmt(data.get('calls_requested'), 'd')} calls[/yellow]")
        elif data.get("budget_s"):
            console.print(f"{fmt(data.get('calls_recorded'), 'd')} of "
                          f"{fmt(data.get('calls_requested'), 'd')} calls: the recorded calls "
                          f"took the --budget of {fmt(data.get('budget_s'), 'g')} s", highlight=False)
        if data.get("top_sites"):
            t = Table("allocation site", "count", "bytes", title="top allocation sites")
            for row in data["top_sites"]:
                t.add_row(txt(row["site"], 400), str(row["count"]), _size(row["bytes"]))
            console.print(t)
    for note in data.get("notes") or []:
        _note(console, note)
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
    console.print(f"{fmt(totals.get('count', 0), 'd')} live tensors, {_size(totals.get('bytes'))} "
                  f"(storages counted once); {fmt(totals.get('with_grad_fn', 0), 'd')} hold a grad_fn, "
                  f"their graphs keep {_size(totals.get('graph_bytes'))} more alive; census took "
                  f"{fmt(data.get('elapsed_s') or 0, '.2f')} s", highlight=False)
    if data.get("moment") and data["moment"] != "at a safe point":
        console.print(f"taken {txt(data['moment'], 200)}", highlight=False)
    rows = data.get("holders") or []
    compared = any("sampled" in h for h in rows)
    columns = ["kind", "tensors", "bytes", "grad_fn", "graph bytes"] + (["since the previous census"] if compared else [])
    holders = Table(holder_col(), *columns, title="who holds them")
    for h in rows:
        kind = f"{txt(h['kind'], 80)} (cap {fmt(h['cap'], 'd')})" if "cap" in h else txt(h["kind"], 80)
        cells = [kind, str(h["count"]), _size(h["bytes"]), str(h["with_grad_fn"]), _size(h["graph_bytes"])]
        if compared:
            cells.append(_since(h))
        where = txt(h["example"]) if h["path"] == h["example"] else f"{txt(h['path'])}  (e.g. {txt(h['example'])})"
        holders.add_row(where, *cells)
    groups = Table("device", "dtype", "shape", "tensors", "bytes", "grad_fn", title="biggest groups")
    for g in data.get("groups") or []:
        groups.add_row(txt(g["device"], 80), txt(g["dtype"], 80), _shape(g["shape"]), str(g["count"]),
                       _size(g["bytes"]), str(g["with_grad_fn"]))
    for table in ((groups, holders) if data.get("by") == "shape" else (holders, groups)):
        console.print(table)
    if data.get("note"):
        _note(console, data["note"])
    diff = data.get("diff")
    if diff:
        t = diff.get("totals") or {}
        console.print(f"since the previous census ({fmt(diff.get('seconds_between'), 'g')} s earlier): "
                      f"{fmt(t.get('count_delta', 0), '+d')} tensors, {_signed(t.get('bytes_delta'))}, "
                      f"graphs {_signed(t.get('graph_bytes_delta'))}", highlight=False)
        if not diff.get("same_process"):
            console.print("[yellow]the previous census is from another process[/yellow]")
        grew = Table(holder_col(), "tensors", "bytes", "graph bytes", title="what grew, by holder")
        for h in diff.get("holders") or []:
            grew.add_row(txt(h["path"]), f"{h['count_before']} -> {h['count_after']}",
                         _signed(h["bytes_delta"]), _signed(h["graph_bytes_delta"]))
        console.print(grew)
        gg = Table("device", "dtype", "shape", "tensors", "bytes", title="what grew, by group")
        for g in diff.get("groups") or []:
            gg.add_row(txt(g["device"], 80), txt(g["dtype"], 80), _shape(g["shape"]),
                       f"{g['count_before']} -> {g['count_after']}", _signed(g["bytes_delta"]))
        console.print(gg)
    skipped = data.get("skipped") or {}
    if skipped.get("reason"):
        console.print(f"[yellow]incomplete:[/yellow] {txt(skipped['reason'])}", highlight=False)


def _since(h: dict[str, Any]) -> str:
    """What a holder still holds of the previous census, and whether its graph is chained to it."""
    parts = []
    if "sampled" in h:
        parts.append(f"{fmt(h.get('kept', 0), 'd')} of {fmt(h['sampled'], 'd')} still held")
    if h.get("chained") is True:
        parts.append("graph chained to the previous one")
    return "; ".join(parts) or "new"


# -- torch profile -------------------------------------------------------------------------


def render_profile(data: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    _file_line(data, console, "trace")
    if data.get("mode") == "window":
        console.print(f"profiled {'all threads' if data.get('all_threads') else 'the agent thread only'} "
                      f"for {fmt(data.get('duration_s'), 'g')} s"
                      + (f" (ended once every optimizer stepped {fmt(data['ended_by_steps'], 'd')} "
                         "times: --steps)" if data.get("ended_by_steps") else ""))
    else:
        console.print(f"profiled {fmt(data.get('calls_recorded'), 'd')} of "
                      f"{fmt(data.get('calls_requested'), 'd')} calls of {txt(data.get('target'))}"
                      + (f": the profiled calls took the --budget of {fmt(data.get('budget_s'), 'g')} s"
                         if data.get("budget_s") else ""),
                      highlight=False)
    if data.get("note"):
        _note(console, data["note"])
    ops = data.get("top_ops")
    if not ops:  # a trace too big to summarise inside the target (the note says so)
        console.print("open the trace in Perfetto (ui.perfetto.dev); `flight_profiler report FILE` diagnoses it")
        return
    cuda = ops.get("has_cuda")
    columns = ["operator", "calls", "self CPU", "CPU total"] + (["self CUDA"] if cuda else [])
    t = Table(*columns, title=f"top operators by {txt(ops.get('sort_by'), 40)} "
                              f"({fmt(ops.get('operators', 0), 'd')} distinct)")
    for r in ops.get("rows") or []:
        row = [txt(r["name"], 70), fmt(r["count"], ".0f"), f"{fmt(r['self_cpu'] / 1000, '.3f')} ms",
               f"{fmt(r['cpu_total'] / 1000, '.3f')} ms"]
        if cuda:
            row.append(f"{fmt((r.get('self_cuda') or 0) / 1000, '.3f')} ms")
        t.add_row(*row)
    console.print(t)
    console.print("open the trace in Perfetto (ui.perfetto.dev) or chrome://tracing; `flight_profiler report FILE` diagnoses it")


# -- torch dataloader ----------------------------------------------------------------------

_CATEGORY = {"dataloader_wait": "waiting for DataLoader workers", "dataloader_load": "loading batches itself",
             "dataloader_receive": "receiving batches from DataLoader workers",
             "sleep": "sleeping", "io": "in I/O", "wait": "waiting", "running": "running Python/ops"}


def render_dataloader(data: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    from flight_profiler.report.live_loop import epochs_phrase

    if data.get("note"):
        console.print(txt(data["note"]), highlight=False)
    sampled = fmt(data.get("sampled_s"), "g")
    for n, dl in enumerate(data.get("loaders") or [], 1):
        ds = dl.get("dataset") or {}
        length = "?" if ds.get("length") is None else fmt(ds["length"], "d")
        console.print(f"[bold]DataLoader {n}[/bold] ({txt(dl.get('type'), 200)}): dataset "
                      f"{txt(ds.get('type'), 200)} (len {length}), batch_size={txt(dl.get('batch_size'), 40)}, "
                      f"num_workers={txt(dl.get('num_workers'), 40)}, pin_memory={txt(dl.get('pin_memory'), 40)}, "
                      f"prefetch_factor={txt(dl.get('prefetch_factor'), 40)}, "
                      f"persistent_workers={txt(dl.get('persistent_workers'), 40)}", highlight=False)
        sampler = dl.get("sampler") or {}
        if sampler.get("distributed"):
            seen = sampler.get("epochs_at_starts")
            console.print(f"  sampler {txt(sampler.get('type'), 200)}: rank {txt(sampler.get('rank'), 40)} of "
                          f"{txt(sampler.get('num_replicas'), 40)}, shuffle={txt(sampler.get('shuffle'), 40)}, "
                          f"epoch {txt(sampler.get('epoch'), 40)}"
                          + (f"; epoch {', '.join(fmt(e, 'd') for e in seen)} as each new epoch began"
                             f" ({fmt(sampler.get('unchanged_at_starts'), 'd')} at the epoch before's value, "
                             f"{fmt(sampler.get('backward_passes'), 'd')} backward passes on its batches)"
                             if isinstance(seen, list) and seen else ""), highlight=False)
            if int(sampler.get("unchanged_at_starts") or 0) and int(sampler.get("backward_passes") or 0):
                console.print("  [bold]set_epoch(epoch) is not called[/bold]: every epoch shuffles the same way "
                              "(call `sampler.set_epoch(epoch)` before each epoch's loop)", highlight=False)
        for it in dl.get("iterators") or []:
            rate = (f" ({fmt(it.get('batches_in_window'), 'd')} in the {sampled} s sampled: "
                    f"{fmt(it['batches_per_s'], 'g')}/s)" if it.get("batches_per_s") is not None else "")
            console.print(f"  iterator {txt(it.get('type'), 200)}: {fmt(it.get('batches_yielded'), 'd')} "
                          f"batches yielded{rate}, {fmt(it.get('batches_in_flight'), 'd', 'None')} in flight, "
                          f"{fmt(it.get('batches_ready'), 'd')} ready"
                          + (" (ended during the sample)" if it.get("ended_during_window") else ""),
                          highlight=False)
            if it.get("workers"):
                t = Table("worker", "pid", "state", "CPU %", "RSS")
                for w in it["workers"]:
                    t.add_row(fmt(w.get("worker_id"), "d"), fmt(w.get("pid"), "d", "None"),
                              txt(w.get("state"), 40), fmt(w.get("cpu_percent"), ".0f"),
                              _size(w.get("rss_bytes")))
                console.print(t)
        if not dl.get("iterators"):
            console.print("  no live iterator (not being iterated right now)")
    threads = data.get("threads") or []
    if threads:
        console.print(f"where the threads spent the last {sampled} s:")
        for th in threads:
            shares = ", ".join(f"{txt(_CATEGORY.get(k, k), 80)} {fmt(v, '.0%')}"
                               for k, v in (th.get("shares") or {}).items())
            console.print(f"  [bold]{txt(th.get('thread'), 200)}[/bold]: {shares}", highlight=False)
            for top in (th.get("top") or [])[:2]:
                console.print(f"    {fmt(top['share'], '.0%')} {txt(top['where'], 400)}", highlight=False)
    for row in data.get("next_timing") or []:
        console.print(f"DataLoader next() timed on {txt(row.get('thread'), 200)}: "
                      f"{fmt(row.get('batches'), 'd')} batches in {fmt(row.get('window_s'), '.2f')} s, "
                      f"{fmt(row.get('next_s'), '.3f')} s in next()"
                      + (f" and iter() ({fmt(row.get('starts'), 'd')} iter() starting an epoch: "
                         f"{fmt(row.get('start_s'), '.3f')} s)" if row.get("starts") else "") + ": "
                      f"{fmt(100 * float(row.get('share') or 0), '.1f')}% of its loop"
                      + (f"; {fmt(100 * float(row['share_epochs']), '.1f')}% over whole epochs "
                         f"({txt(epochs_phrase(row), 300)})"
                         if isinstance(row.get("share_epochs"), (int, float)) else ""),
                      highlight=False)
    if isinstance(data.get("waited_for_start_s"), (int, float)):
        console.print(f"  (timing went on {fmt(data['waited_for_start_s'], '.1f')} s after the sampling, "
                      "until the workers started again: the epoch's end was that near)", highlight=False)
    use = data.get("graph_use")
    if isinstance(use, dict):
        console.print(
            f"graphs built by {txt(use.get('target'), 200)} in {fmt(use.get('window_s'), 'g')} s: "
            f"{fmt(use.get('calls'), 'd')} calls ({fmt(use.get('grad_calls'), 'd')} with grad on); "
            f"of {fmt(use.get('judged'), 'd')} judged, {fmt(use.get('used'), 'd')} read by a "
            f"backward, {fmt(use.get('unused'), 'd')} never read", highlight=False)
        for p in (use.get("unused_where") or [])[:3]:
            console.print(f"  never read, called from {txt(p.get('file'), 400)}:{fmt(p.get('line'), 'd')} "
                          f"({txt(p.get('function'), 200)}): {fmt(p.get('calls'), 'd')} calls "
                          "(an evaluation pass without torch.no_grad()?)", highlight=False)
