"""Evidence an armed trigger wrote (``arm --on hang|nan|oom|slow``): one finding per event,
naming the line the job hung on, the step and parameters the NaN hit, the allocation that
failed, or the slow step against the median (its trace is an input of its own: the trace rules
say where the time went)."""

from __future__ import annotations

from typing import Any

from flight_profiler.report.models import Finding, InputResult
from flight_profiler.report.rules import Context, Rule
from flight_profiler.report.units import fmt_bytes


def _at(frame: dict[str, Any] | None) -> str:
    if not frame:
        return "an unknown line"
    return f"{frame['function']} at {frame['file']}:{frame['line']}"


def _who(ev: dict[str, Any]) -> str:
    rank = f" rank {ev['rank']}" if ev.get("rank") is not None else ""
    return f"pid {ev.get('pid')}{rank}"


def _common(ev: dict[str, Any], inp: InputResult) -> list[str]:
    out = [f"evidence: {ev['dir'] or inp.path} ({', '.join(ev['files']) or 'event.json only'})"]
    if ev.get("dropped"):
        out.append(f"{ev['dropped']} file(s) dropped by the disk cap")
    if ev.get("capture_error"):
        out.append(f"capture incomplete: {ev['capture_error']}")
    return out


def _hang(ev: dict[str, Any], inp: InputResult) -> Finding:
    where = ev.get("where")
    evidence = [f"no progress for {ev.get('stalled_s') or 0:.0f} s (armed at {ev.get('seconds') or 0:g} s) "
                f"after step {ev.get('step')}"]
    for t in ev["threads"][:4]:
        evidence.append(f"thread {t['thread']} stopped in {_at(t['where'])}")
    if ev.get("fr"):
        evidence.append(f"no Flight Recorder dump: {ev['fr']}")
    elif "fr_trace.pickle" in ev["files"]:
        evidence.append("Flight Recorder dump: fr_trace.pickle (torch's format)")
    return Finding(
        rule="arm-hang", severity="critical", title=f"Hang caught by the armed trigger ({_who(ev)})",
        summary=f"The job stopped making progress in {_at(where)}.",
        root_cause=f"{_who(ev)} waited in {_at(where)} and never came back",
        evidence=evidence + _common(ev, inp),
        where=[f"{where['file']}:{where['line']}"] if where else [],
        fix=["Read the line above: a queue or a DataLoader whose producer died, a collective "
             "another rank never joined, a lock never released.",
             "stacks.json beside event.json has every thread's stack at that moment."],
        inputs=[inp.path], metrics={"step": ev.get("step"), "stalled_s": ev.get("stalled_s")},
        ranks=[ev["rank"]] if ev.get("rank") is not None else None)


# What makes a NaN/Inf out of finite values, by op (aten name or backward node), and its fix.
_OP_FIXES = (
    (("log", "xlogy"), "log of zero or a negative number: clamp its input (x.clamp_min(eps)), or use "
                       "log_softmax / log1p / BCEWithLogitsLoss, which stay finite"),
    (("sqrt", "rsqrt"), "sqrt's gradient is infinite at 0: sqrt(x + eps), or torch.linalg.vector_norm, "
                        "whose gradient at 0 is defined"),
    (("norm",), "the gradient of a norm at a zero vector is NaN: add eps inside, or skip zero vectors"),
    (("div", "reciprocal"), "division by zero: add eps to the denominator or guard it with torch.where"),
    (("exp", "pow", "softmax", "sinh", "cosh"), "overflow: subtract the max first (torch.logsumexp, "
                                                  "log_softmax), or compute it in float32"),
    (("acos", "asin", "atanh"), "an argument outside the domain: clamp it to [-1 + eps, 1 - eps]"),
)


def _op_fix(op: dict[str, Any]) -> str:
    name = f"{op.get('op') or ''} {op.get('backward_node') or ''}".lower()
    for keys, fix in _OP_FIXES:
        if any(k in name for k in keys):
            return fix
    return "the op above makes non-finite values out of finite inputs: guard its input"


def _op_line(op: dict[str, Any]) -> str | None:
    return op["stack"][-1] if op.get("stack") else None


def _op_where(op: dict[str, Any]) -> str:
    line = _op_line(op)
    kind = (f"the backward of {op['backward_node']} ({op['op']})" if op.get("phase") == "backward"
            and op.get("backward_node") else op["op"])
    return f"{kind} at {line}" if line else kind


def _located(ev: dict[str, Any], evidence: list[str]) -> tuple[str | None, list[str], list[str]]:
    """What the watched step after the fire showed: (root cause, where, fixes)."""
    loc = ev.get("located")
    if not loc:
        return None, [], []
    if not loc["watched"]:
        evidence.append(f"the next step was not watched op by op: {loc['reason'] or 'unknown'}")
        return None, [], []
    cut = f" (cut short: {loc['cut_short']})" if loc.get("cut_short") else ""
    origin = loc.get("origin")
    if origin:
        line = _op_line(origin)
        evidence.append(f"step {loc['step']}, watched op by op{cut}: {_op_where(origin)} made "
                        f"{origin.get('nan') or 0} NaN and {origin.get('inf') or 0} Inf values out of "
                        f"finite inputs")
        evidence += [f"  {frame}" for frame in origin["stack"][-4:-1]]
        return (f"{_op_where(origin)} makes non-finite values out of finite inputs",
                [line] if line else [], [f"{origin['op']}: {_op_fix(origin)}."])
    first = loc.get("first_nonfinite")
    what = (f"; the first non-finite value there came in through "
            f"{'a parameter' if first.get('from_parameter') else 'an input'} of {_op_where(first)}"
            if first else "")
    evidence.append(f"step {loc['step']}, watched op by op ({loc.get('ops_checked') or 0} ops){cut}: no op "
                    f"made a NaN or Inf out of finite values{what}. The parameters were non-finite "
                    f"already: the optimizer applied the non-finite gradient of step {ev.get('step')}, "
                    "and the op that made it ran in that step, not again")
    return ("no op made a NaN or Inf out of finite values in the next step: the parameters were "
            "non-finite already"), [], ["The op that made it ran only once: to name it, restart from the last good "
                      "checkpoint and run `torch anomaly` on the step method over the steps before "
                      "it (or keep the GradScaler / clip_grad_norm_ guard below so one bad step "
                      "cannot poison the parameters)."]


def _nan(ev: dict[str, Any], inp: InputResult) -> Finding:
    params = ev["first_params"]
    names = [p["name"] or f"group {p['group']} param {p['index']}" for p in params]
    clean = ev.get("clean_at_step")
    since = (f" (last checked clean at step {clean})" if clean is not None else "")
    evidence = [f"non-finite gradients at step {ev.get('step')}{since}: {ev.get('params_hit')} of "
                f"{ev.get('params_checked')} parameters"]
    for p, name in zip(params[:6], names):
        evidence.append(f"{name} {tuple(p['shape'])}: {p['nonfinite']} of {p['elements']} gradient "
                        f"elements non-finite; the parameter itself "
                        f"{'still finite' if p['param_finite'] else 'non-finite now'}")
    if (ev.get("checked_every") or 1) > 1:
        evidence.append(f"checked one step in {ev['checked_every']} (the check's own cost kept under 0.3 % of the step)")
    cause, lines, fixes = _located(ev, evidence)
    origin = (ev.get("located") or {}).get("origin")
    step_cause = f"step {ev.get('step')}: non-finite gradient in {', '.join(names[:3]) or '?'}"
    if cause and not origin:  # said in the summary, not a cause
        cause, note = None, f"; {cause}"
    else:
        note = f"; {cause}" if cause else ""
    return Finding(
        rule="arm-nan", severity="critical",
        title=f"First non-finite gradient at step {ev.get('step')} ({_who(ev)})",
        summary=f"Gradients went non-finite at step {ev.get('step')}, first in {', '.join(names[:3]) or '?'}"
                f"{note}.",
        root_cause=f"{cause} ({step_cause})" if cause else step_cause,
        evidence=evidence + _common(ev, inp), where=lines + names[:6],
        fix=[*fixes, "Lower the learning rate / clip gradients (torch.nn.utils.clip_grad_norm_) / check "
                     "the loss for log(0), division by zero, fp16 overflow (use a GradScaler)."]
        if fixes else ["Find the op: `torch anomaly` on the step method for one step, or lower the learning "
                       "rate / clip gradients (torch.nn.utils.clip_grad_norm_) / check the loss for log(0), "
                       "division by zero, fp16 overflow (use a GradScaler)."],
        inputs=[inp.path], metrics={"step": ev.get("step"), "params": names[:20], "op": origin["op"] if origin else None},
        ranks=[ev["rank"]] if ev.get("rank") is not None else None)


def _oom(ev: dict[str, Any], inp: InputResult) -> Finding:
    where = ev.get("where")
    sig = ev.get("signal")
    if sig == "rss":
        what = (f"RSS {fmt_bytes(ev.get('rss_bytes') or 0)} passed the limit "
                f"{fmt_bytes(ev.get('rss_limit') or 0)}")
    elif sig == "cuda":
        what = (f"CUDA allocation of {fmt_bytes(ev.get('alloc_bytes') or 0)} failed on device "
                f"{ev.get('device')}")
    else:
        what = f"{ev.get('error') or 'out of memory'} (RSS {fmt_bytes(ev.get('rss_bytes') or 0)})"
    evidence = [what]
    top = ev["census_top"]
    if where:
        evidence.append(f"in {_at(where)}")
    for h in ev["census_top"]:
        evidence.append(f"held: {h['path']} {fmt_bytes(h['bytes'] or 0)}")
    return Finding(
        rule="arm-oom", severity="critical", title=f"Out of memory caught by the armed trigger ({_who(ev)})",
        summary=what + (f", in {_at(where)}" if where else "") + (
            f"; held most: {top[0]['path']} ({fmt_bytes(top[0]['bytes'] or 0)})" if top else "") + ".",
        root_cause=what, evidence=evidence + _common(ev, inp),
        where=[f"{where['file']}:{where['line']}"] if where else [],
        fix=["census.json / memory_snapshot.pickle beside event.json say who held the memory: "
             "`flight_profiler report` them; free what is kept across steps, lower the batch size."],
        inputs=[inp.path], metrics={"signal": sig, "rss_bytes": ev.get("rss_bytes")},
        ranks=[ev["rank"]] if ev.get("rank") is not None else None)


def _slow(ev: dict[str, Any], inp: InputResult) -> Finding:
    slow, typical, factor = ev.get("slow_step_s") or 0.0, ev.get("median_s") or 0.0, ev.get("factor")
    ratio = slow / typical if typical else 0.0
    step = ev.get("slow_step")
    what = (f"step {step} took {slow * 1000:.1f} ms, {ratio:.1f}x the running median of "
            f"{typical * 1000:.1f} ms (armed at {factor or 0:g}x)")
    evidence = [what]
    profiled = ev["profiled_step_s"]
    if profiled:
        shown = ", ".join(f"{p * 1000:.1f}" for p in profiled[:10])
        still = sum(1 for p in profiled if typical and p > (factor or 1.0) * typical)
        evidence.append(f"the {len(profiled)} profiled step(s) after it took {shown} ms "
                        f"({still} still over {factor or 0:g}x the median)")
    late = ev.get("started_after_s")
    if late is not None and late > 1.0:
        evidence.append(f"the profile started {late:.1f} s after the slow step (torch's profiler "
                        "starting up): the trace holds the steps from then on")
    if ev.get("timed_out"):
        evidence.append(f"the job stopped stepping before {ev.get('steps_wanted')} steps were profiled")
    trace = ev.get("trace")
    if trace and trace in ev["files"]:
        evidence.append(f"trace of the steps after it: {trace} (its own findings in this report)")
    elif trace:
        evidence.append(f"the trace {trace} is not in the evidence (dropped or not written)")
    return Finding(
        rule="arm-slow", severity="warning",
        title=f"Step {step} {ratio:.1f}x slower than the median ({_who(ev)})",
        summary=what + ".", root_cause=what, evidence=evidence + _common(ev, inp),
        where=[trace] if trace else [],
        fix=["Read the trace's findings below (or open it in Perfetto): the ops or the data "
             "wait that grew in the slow steps name the cause: a bigger batch or sequence, a "
             "slower data shard or storage, a recompilation, another process on the device."],
        inputs=[inp.path],
        metrics={"step": step, "step_s": slow, "median_s": typical, "ratio": round(ratio, 2),
                 "profiled_step_s": profiled[:20]},
        ranks=[ev["rank"]] if ev.get("rank") is not None else None)


# Where a rank waits for the others: a torch.distributed call, or DDP's all-reduce, which
# loss.backward() waits for inside the autograd engine.
_COLLECTIVE_DIRS = ("/torch/distributed/", "/torch/nn/parallel/", "/torch/autograd/")


def _in_collective(ev: dict[str, Any]) -> bool:
    threads = ev.get("threads") or []
    inner = threads[0].get("inner") or [] if threads else []
    return any(any(d in str(f.get("file", "")) for d in _COLLECTIVE_DIRS) for f in inner[-6:])


def _blame_ranks(hangs: list[tuple[dict[str, Any], Finding]]) -> None:
    """Hangs of several ranks of one job: the ranks that stopped outside any collective are the
    cause, the ranks waiting in one wait for them (critical stays on the cause only)."""
    ranked = [(ev, f) for ev, f in hangs if ev.get("rank") is not None and (ev.get("world_size") or 0) > 1]
    waiting = [(ev, f) for ev, f in ranked if _in_collective(ev)]
    stopped = [(ev, f) for ev, f in ranked if not _in_collective(ev)]
    if not waiting or not stopped:
        return
    culprits = ", ".join(str(ev["rank"]) for ev, _ in stopped)
    waiters = ", ".join(str(ev["rank"]) for ev, _ in waiting)
    for ev, f in stopped:
        f.summary = (f"Rank {ev['rank']} stopped outside any collective, in {_at(ev.get('where'))}; "
                     f"rank(s) {waiters} wait for it in a collective.")
        f.evidence.insert(0, f"rank(s) {waiters} hung inside a collective at the same time: they wait "
                             f"for rank(s) {culprits}")
    for ev, f in waiting:
        f.severity = "warning"
        f.summary = (f"Rank {ev['rank']} waits in a collective, in {_at(ev.get('where'))}, for "
                     f"rank(s) {culprits}, which stopped outside one.")


def check(ctx: Context) -> list[Finding]:
    out = []
    hangs = []
    for inp in ctx.arm_events:
        ev = inp.data
        make = {"hang": _hang, "nan": _nan, "oom": _oom, "slow": _slow}.get(ev.get("kind", ""))
        if make is not None:
            out.append(make(ev, inp))
            if ev.get("kind") == "hang":
                hangs.append((ev, out[-1]))
    _blame_ranks(hangs)
    return out


RULE = Rule("arm-events", "Evidence of armed triggers", check)
