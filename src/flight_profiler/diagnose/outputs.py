"""The diagnosis' written outputs: the report (md, json, html) with the workflow's own sections,
and diagnose.json (phases, timings, skips, the cost spread and where the time goes).

The report itself comes from the report engine (``flight_profiler.report.analyze``) over every
artefact the phases wrote; the before/after census and snapshot pairs are passed together so
that the engine sees growth. The workflow's sections are appended to its Markdown and HTML views
and added under ``"diagnose"`` in its JSON, so one file tells the whole story.
"""

from __future__ import annotations

import html
import json
import os
import time
from typing import TYPE_CHECKING, Any

from flight_profiler.atomic_files import write_text_atomic
from flight_profiler.diagnose import evidence

if TYPE_CHECKING:
    from flight_profiler.errors import FlightProfilerError
    from flight_profiler.report.models import InputResult

from flight_profiler.diagnose.model import FAILED, OK, SKIPPED, DiagnoseResult, PhaseResult

REPORT_FILES = {"md": "report.md", "json": "report.json", "html": "report.html"}
DIAGNOSE_JSON = "diagnose.json"


def build_report(result: DiagnoseResult, loaded: dict[str, InputResult] | None = None) -> PhaseResult:
    """Analyse the artefacts and write report.{md,json,html} into the output directory;
    ``loaded``: artefacts already loaded while the workflow waited (preload.py), by path."""
    phase = PhaseResult("report", "Report", started=time.time())
    started = time.monotonic()
    paths = [f for f in result.artefacts if os.path.lexists(f)]
    try:
        if not paths:
            phase.status, phase.reason = SKIPPED, "no artefact was written to analyse"
            return phase
        from flight_profiler.render.formats import render_report

        # through descriptors where the target's user could have swapped an artefact
        report = evidence.analyze_artefacts(paths, evidence.target_uids(result.options.pid),
                                            loaded)
        # Live evidence no artefact carries (the loop's share, the loaders' settings).
        report.findings = evidence.merge(result, report.findings, report.inputs)
        result.report = report
        result.step = evidence.step_of(report.inputs)
        result.dataloader = evidence.dataloader_share(result, report.inputs)
        out = result.options.out_dir
        extra = result_sections(result)
        data = report.to_dict()
        data["diagnose"] = extra
        texts = {
            "json": json.dumps(data, indent=2, default=str) + "\n",
            "md": render_report(report, "md").rstrip("\n") + "\n\n" + sections_markdown(extra),
            "html": _inject_html(render_report(report, "html"), sections_html(extra)),
        }
        for fmt, name in REPORT_FILES.items():
            path = os.path.join(out, name)
            write_text_atomic(path, texts[fmt])
            result.outputs[fmt] = path
        phase.files = [os.path.join(out, n) for n in REPORT_FILES.values()]
        phase.data = {"inputs": len(paths), "findings": len(report.findings)}
    except ImportError as exc:
        phase.status, phase.reason = FAILED, f"the report engine is not available ({exc})"
    except Exception as exc:  # a bug in analysis must not lose the artefacts already written
        phase.status, phase.reason = FAILED, f"{type(exc).__name__}: {exc}"
    finally:
        phase.seconds = time.monotonic() - started
    return phase


def write_diagnose_json(result: DiagnoseResult) -> str:
    path = os.path.join(result.options.out_dir, DIAGNOSE_JSON)
    data = result.to_dict()
    data["sections"] = result_sections(result)
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")
    result.outputs["diagnose"] = path
    return path


# -- the workflow's own sections --------------------------------------------------------------
def result_sections(result: DiagnoseResult) -> dict[str, Any]:
    target = result.options.target
    watch = result.phase("watch")
    trace = result.phase("trace")
    return {
        "target": target.words if target else None,
        "step": result.step,
        "phases": [{"name": p.name, "title": p.title, "status": p.status, "reason": p.reason,
                    "seconds": round(p.seconds, 3), "command": p.command}
                   for p in result.phases],
        "cost": watch.data.get("cost") if watch else None,
        "where_time_goes": trace.data.get("where_time_goes") if trace else None,
        "missing_evidence": evidence.missing(result),
    }


def _status_text(status: str) -> str:
    return {OK: "ok", SKIPPED: "skipped", FAILED: "failed"}.get(status, status.replace("_", " "))


def step_line(step: dict[str, Any] | None) -> str:
    """One sentence: the step found, how, its rate, and where the named method sits in it."""
    if not step:
        return "No step found (no profile)."
    if step.get("kind") == "window":
        text = f"No step found: {step.get('how')}."
    else:
        rate = step.get("steps_per_s")
        text = (f"The step: {step.get('name')} ({step.get('how')}); {step.get('whole_steps')} whole "
                "steps in the profile" + (f", {rate:g} steps/s" if rate else "") + ".")
    method = step.get("method") or {}
    if method.get("role") == "inside the step" and method.get("calls_per_step"):
        text += f" {method['name']} runs {method['calls_per_step']:g} time(s) per step, inside it."
    elif method.get("role"):
        text += f" {method.get('name')}: {method['role']}."
    return text


def sections_markdown(extra: dict[str, Any]) -> str:
    target = extra.get("target") or "(time window)"
    lines = [f"## Diagnose workflow: `{target}`", "", step_line(extra.get("step")), "",
             "| phase | status | seconds | note |", "|---|---|---:|---|"]
    for p in extra["phases"]:
        note = p["reason"] or (f"`{p['command']}`" if p["command"] else "")
        note = note.replace("|", "\\|")
        lines.append(f"| {p['title']} | {_status_text(p['status'])} | {p['seconds']:.2f} | {note} |")
    gaps = extra.get("missing_evidence") or []
    if gaps:
        lines += ["", "### Missing evidence", "",
                  f"{len(gaps)} phase(s) failed: the report above cannot show what they would have "
                  "found, so no finding there is not an all-clear.", ""]
        lines += [f"- {g['title']} ({g['status'].replace('_', ' ')}): hides {g['hides']}. "
                  f"Why: {g['reason']}" for g in gaps]
    cost = extra.get("cost")
    if cost and cost.get("calls"):
        lines += ["", f"### Cost per call over {cost['calls']} calls", "",
                  f"{cost['verdict']}.", "",
                  "| mean | median | p90 | min | max | stdev |", "|---:|---:|---:|---:|---:|---:|",
                  f"| {cost['mean_ms']:.3f} ms | {cost['median_ms']:.3f} ms | {cost['p90_ms']:.3f} ms "
                  f"| {cost['min_ms']:.3f} ms | {cost['max_ms']:.3f} ms | {cost['stdev_ms']:.3f} ms |"]
    where = extra.get("where_time_goes")
    if where and where.get("calls"):
        lines += ["", f"### Where the time goes (inclusive, over {where['calls']} traced calls)", "",
                  f"Mean {where['mean_ms']:.3f} ms per call; {where['self_pct']:.0f}% in the "
                  "method's own lines.", "",
                  "| callee | depth | calls | total ms | share |", "|---|---:|---:|---:|---:|"]
        for row in where["top"]:
            name = str(row["name"]).replace("|", "\\|")
            indent = "&nbsp;&nbsp;" * (row["depth"] - 1)
            lines.append(f"| {indent}`{name}` | {row['depth']} | {row['calls']} | {row['total_ms']:.3f} "
                         f"| {row['share_pct']:.1f}% |")
    return "\n".join(lines) + "\n"


def sections_html(extra: dict[str, Any]) -> str:
    e = html.escape
    target = extra.get("target") or "(time window)"
    rows = "".join(
        f"<tr><td>{e(p['title'])}</td><td>{e(_status_text(p['status']))}</td>"
        f"<td>{p['seconds']:.2f}</td><td>{e(p['reason'] or p['command'])}</td></tr>"
        for p in extra["phases"])
    parts = [f"<section id=\"diagnose\"><h2>Diagnose workflow: <code>{e(target)}</code></h2>",
             f"<p>{e(step_line(extra.get('step')))}</p>",
             "<table><tr><th>phase</th><th>status</th><th>seconds</th><th>note</th></tr>",
             rows, "</table>"]
    gaps = extra.get("missing_evidence") or []
    if gaps:
        items = "".join(f"<li>{e(g['title'])} ({e(g['status'].replace('_', ' '))}): hides "
                        f"{e(g['hides'])}. Why: {e(g['reason'])}</li>" for g in gaps)
        parts += ["<h3>Missing evidence</h3>",
                  f"<p>{len(gaps)} phase(s) failed: the report cannot show what they would have "
                  f"found, so no finding there is not an all-clear.</p><ul>{items}</ul>"]
    cost = extra.get("cost")
    if cost and cost.get("calls"):
        cells = "".join(f"<td>{cost[k]:.3f} ms</td>" for k in
                        ("mean_ms", "median_ms", "p90_ms", "min_ms", "max_ms", "stdev_ms"))
        parts += [f"<h3>Cost per call over {cost['calls']} calls</h3><p>{e(cost['verdict'])}.</p>",
                  "<table><tr><th>mean</th><th>median</th><th>p90</th><th>min</th><th>max</th>"
                  f"<th>stdev</th></tr><tr>{cells}</tr></table>"]
    where = extra.get("where_time_goes")
    if where and where.get("calls"):
        body = "".join(
            f"<tr><td style=\"padding-left:{r['depth'] - 1}em\"><code>{e(str(r['name']))}</code></td><td>{r['depth']}</td><td>{r['calls']}</td>"
            f"<td>{r['total_ms']:.3f}</td><td>{r['share_pct']:.1f}%</td></tr>" for r in where["top"])
        parts += [f"<h3>Where the time goes (over {where['calls']} traced calls)</h3>",
                  f"<p>Mean {where['mean_ms']:.3f} ms per call; {where['self_pct']:.0f}% in the "
                  "method's own lines.</p>",
                  "<table><tr><th>callee</th><th>depth</th><th>calls</th><th>total ms</th>"
                  f"<th>share</th></tr>{body}</table>"]
    parts.append("</section>")
    return "\n".join(parts)


def _inject_html(page: str, section: str) -> str:
    marker = page.lower().rfind("</body>")
    if marker < 0:
        return page + "\n" + section + "\n"
    return page[:marker] + section + "\n" + page[marker:]


def prepare_out_dir(path: str, pid: int) -> None:
    """Create the output directory; the agent (running as the target's user) writes into it.

    As root diagnosing another user's job, a directory made here is handed to that user
    (fchown on the descriptor of the very directory made, so that their agent can write its
    artefacts); an existing directory is never handed over: if that user cannot write in it,
    the diagnosis is refused before the target is touched.
    """
    from flight_profiler.errors import UsageError

    created = False
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            os.mkdir(path)
            created = True
        except FileExistsError:
            pass
    except OSError as exc:
        raise UsageError(f"cannot create the output directory {path}: {exc.strerror}",
                         "pass a writable --out DIR") from None
    writer = _writer_of(pid) if os.geteuid() == 0 else None
    if writer is None or writer[0] == 0:
        return
    uid, gid, groups = writer
    try:
        # what we made is entered without following a link (it may have been swapped since)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
                     | (os.O_NOFOLLOW if created else 0))
    except OSError as exc:
        raise UsageError(f"cannot use the output directory {path}: {exc.strerror}",
                         "pass a directory path") from None
    try:
        st = os.fstat(fd)
        if created and st.st_uid == 0:
            os.fchown(fd, uid, gid)  # the directory made just now, and only that one
        elif not _writable_by(st, uid, groups):
            raise UsageError(
                f"--out {path} exists and uid {uid}, whose job this is, cannot write its "
                "artefacts in it (an existing directory is never handed over)",
                f"pass a directory that does not exist yet (it is made for uid {uid}), or one "
                f"uid {uid} can write")
    finally:
        os.close(fd)


def _writer_of(pid: int) -> tuple[int, int, set[int]] | None:
    """The uid and gid the target's agent creates files as (file-system ids), and its groups."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        uid, gid = int(fields["Uid"].split()[3]), int(fields["Gid"].split()[3])
        groups = {int(g) for g in fields.get("Groups", "").split()} | {gid}
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return uid, gid, groups


def _writable_by(st: os.stat_result, uid: int, groups: set[int]) -> bool:
    if st.st_uid == uid:
        return st.st_mode & 0o300 == 0o300
    if st.st_gid in groups:
        return st.st_mode & 0o030 == 0o030
    return st.st_mode & 0o003 == 0o003


def verdict(code: int, fail_on: str | None, gaps: int) -> FlightProfilerError:
    """The error that ends a diagnosis with ``code``, said by the summary, not as an error."""
    from flight_profiler.errors import ExitCode, FindingsThreshold, FlightProfilerError, Incomplete

    if code == ExitCode.FINDINGS:
        return FindingsThreshold(f"findings reached --fail-on {fail_on}: exit {code}", "",
                                 reported=True)
    if code == ExitCode.INCOMPLETE:
        return Incomplete(f"{gaps} phase(s) failed, so the diagnosis is incomplete: exit {code}",
                          "", reported=True)
    # CI asked for a verdict and no report could make one.
    return FlightProfilerError(f"no report could be made, so --fail-on {fail_on} cannot pass: "
                               f"exit {code}", "", reported=True)
