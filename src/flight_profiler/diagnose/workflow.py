"""The diagnosis a careful engineer would run by hand, as one sequence of small phases.

``run_diagnosis(driver, options, progress) -> DiagnoseResult``: plain data in and out. Each phase
is a function ``(run, phase) -> None`` that builds its requests with the typed builders (each
records the command line a user would type for it, in ``phase.command``),
fills ``phase.data`` / ``phase.files``, and raises :class:`Skip` when it cannot run (no CUDA,
torch not imported, no method given, the method not called in time). A phase that fails or is
skipped never stops the others; only a target that does not exist (a typo in the module or
method) ends the diagnosis, since every later phase would fail the same way.

Order matters: the "before" census comes first, a "middle" census at least half of
``options.duration`` later, the "after" one last with at least ``options.duration`` seconds of
the job running in between, so that the report engine can judge growth over three censuses; the
memory summary and the "before" snapshot are taken just inside that window (the workflow waits
there on a fast loop, so they cost no wall time), the "after" snapshot after it; the profile
comes before watch/trace so that their hooks cannot distort it. While it waits, the workflow
loads the artefacts already written for the report (preload.Preloader), which it would
otherwise do after the last phase; the profile's trace is loaded by a worker process of the
lowest CPU priority from the profile phase's end on.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from flight_profiler.diagnose import stats
from flight_profiler.diagnose.driver import Driver, PhaseTimeout
from flight_profiler.diagnose.model import (
    FAILED,
    OK,
    SKIPPED,
    TIMED_OUT,
    DiagnoseOptions,
    DiagnoseResult,
    PhaseResult,
)
from flight_profiler.diagnose.progress import NullProgress, Progress
from flight_profiler.diagnose.run import TRACE_CALLS_LEAST, Run, Skip, TargetUnusable, expect_file
from flight_profiler.diagnose.training import phase_grads
from flight_profiler.errors import FlightProfilerError, TorchMissing
from flight_profiler.requests import basic, hooks
from flight_profiler.requests import torch as torch_requests

# Levels of the call tree the agent keeps (wrapper chains such as Module.__call__ ->
# _call_impl -> forward eat several), and rows shown in the report once chains are collapsed.
TRACE_DEPTH = 8
WHERE_LEVELS = 3
# The input phase's shortest look at a loop (whose method keeps it busy, or no method): enough
# batches for the timed DataLoader share (3 whole periods at least) at ~2 batches/s.
INPUT_SAMPLE_S = 2.0
# Without a method the loop's period is unknown: a longer look.
WINDOW_SAMPLE_S = 3.0
# Calls the profile window holds at most: whole steps around them (3 or more) are what the
# report needs; every profiled step of a Python-heavy loop costs seconds (the profiler records
# each operator and Python call) and megabytes of trace.
PROFILE_CALLS = 5
# Calls traced and profiled when one call of the method is costly (Run.calls_for):
# each such call is a whole step of seconds under the profiler or the tracer (an LBFGS step:
# 5 closure calls), and 3 whole steps are what the report's per-step figures need (a profile
# whose sessions outrun PROFILE_BUDGET_S keeps 2, and claims no per-step memory figure).
HEAVY_CALLS = 3
# Seconds the profiled calls may take in all where the method holds a whole step (a session per
# call), their sessions' stops included, 2 calls at least: the stop of a session of a style
# transfer's LBFGS step (20 closure evaluations, with stacks and memory) took 0.37 s after a
# 0.25 s step, its export and freeing 0.3 s more: 3 calls were 3.0-3.6 s of a 9-10 s diagnosis.
# Growth is judged over the 3 censuses; a profile's per-step memory figure needs 3 steps
# (report/thresholds.py: leak_min_steps), which such a profile then does not claim.
PROFILE_BUDGET_S = 1.0
# Calls recorded (`torch memory -r`) when one is costly: the recording shows where the method
# allocates (the report's sites and the peak inside the calls), which one whole step of seconds
# already shows (an LBFGS step: 5 closure calls, 17,000 allocations); no rule judges per-step
# figures on it (those come from the profile's 3 steps), and each recorded step cost 2-3 s here.
HEAVY_RECORD_CALLS = 1
# Seconds the recorded calls may take in all, recording included: an actor-critic's
# finish_episode is a few ms, its recording (thousands of allocations with stacks) ~0.4 s a call:
# 10 calls made the phase 4.5 s. The report judges sites and the peak inside calls, which a few
# calls show as well as ten. Turning the recording into the snapshot afterwards takes about twice
# the recorded time again (measured: 5 calls, 1.5 s recorded, 4.5 s in all), hence 0.75 s.
RECORD_BUDGET_S = 0.75
CPU_RECORD_SKIPPED = ("a CPU-only target: the profile's memory events (profile.json.gz) hold the "
                      "same calls' allocations with their stacks; `torch memory -r` records them "
                      "alone, as a snapshot for memory_viz")
# Calls whose cost is watched when one is costly: their spread (median, p90, outliers) is judged
# on 5 as well as on 10, and 10 LBFGS steps took 2-6 s of the diagnosis here.
HEAVY_WATCH_CALLS = 5
# Without a method, the --duration window ends once every optimizer stepped this many times
# (after 1 s at least): whole steps are what the report needs, and a fast loop's 5 s window was
# millions of events (a DQN stepping 450 times a second: 41 s to stop, export and load, of a
# 60-66 s diagnosis). 4 steps hold 3 whole ones, as the window around a method's calls holds
# (profile_window.STEPS_WANTED): 10 made a character RNN's window (2.4 steps/s, 100,000 events a
# step) 4.2 s long and its profile phase 16 s, and the report's loading of it 7.7 s. A loop
# without an optimizer keeps the whole window.
WINDOW_STEPS = 4
# The profile's answer comes after torch exports the trace inside the target: a 5 s with_stack
# window of a GAN's loop on a loaded 2-core box took longer than the window's own timeout plus
# the backstop (the phase was cancelled and its trace lost, 1 run in 2 at load 15). The CLI's
# own `torch profile` allows 300 s for this; diagnose, bounded, allows this much.
EXPORT_S = 60.0


# -- phases -----------------------------------------------------------------------------------
def phase_status(run: Run, phase: PhaseResult) -> None:
    data = run.command(phase, basic.status())
    torch = data.get("torch") or {}
    run.torch_imported = bool(torch.get("imported"))
    if torch.get("importing"):
        run.torch_missing = "the target is still importing torch (diagnose again in a few seconds)"
    run.cuda = bool(torch.get("cuda_available")) if run.torch_imported else False
    phase.data.update({"python": (data.get("python") or {}).get("version"),
                       "torch": torch.get("version"), "torch_imported": run.torch_imported,
                       "cuda": run.cuda})


def phase_locate(run: Run, phase: PhaseResult) -> None:
    """One watched call: proves the method exists and is being called before the long phases.

    A method the training loop never calls (a LightningModule's `forward`: Lightning runs
    `training_step`; a `forward` named on the wrong class) used to cost the whole `--timeout`
    (30 s of a 45 s diagnosis) to say so. So the first LOCATE_QUICK_S seconds are watched; if no
    call came, the loop is asked whether it trains meanwhile (backward passes): when it does, the
    method is not part of its step and the diagnosis goes on without it at once; when it does
    not (an inference loop, a loop stopped between epochs), the rest of `--timeout` is waited."""
    run.require_method()
    target = run.options.target
    assert target is not None
    t = run.options.timeout
    quick = min(t, LOCATE_QUICK_S)
    try:
        result = run.command(phase, hooks.watch(run.words(), expr="cost", count=1, timeout=quick),
                             expect_calls=1)
        if not _was_called(phase, result) and t > quick:
            running = _running_call(run, phase)
            if running is not None:
                run.method_called = False
                run.not_called = (f"{target.label} is running ({running}) and did not return in "
                                  f"{quick:g}s: a call that outlasts the diagnosis")
                raise Skip(f"{run.not_called} (one LBFGS step of max_iter=50000, say): its calls "
                           "cannot be observed; the phases that observe them are skipped and the "
                           "profile covers a window instead. Name what it calls repeatedly (the "
                           "closure, the model's forward), or nothing")
            backwards = _backward_passes(run, phase)
            if backwards >= LOCATE_TRAINING_BACKWARDS:
                run.method_called = False
                run.not_called = (f"{target.label} is not part of the training step (not called in "
                                  f"{quick:g}s while the loop ran {backwards} backward passes)")
                raise Skip(f"{target.label} was not called in {quick:g}s while the loop ran "
                           f"{backwards} backward passes: it is not part of the training step (a "
                           "LightningModule's forward, say: Lightning calls training_step). The "
                           "phases that observe its calls are skipped; name a method the loop calls, "
                           "or none")
            result = run.command(phase, hooks.watch(run.words(), expr="cost", count=1,
                                                    timeout=t - quick), expect_calls=1)
    except PhaseTimeout:
        run.method_called = False
        raise
    except FlightProfilerError as exc:
        raise TargetUnusable(exc) from None
    run.method_called = _was_called(phase, result)
    costs = [c for c in (stats.cost_ms(e) for e in phase.data.get("events", [])) if c is not None]
    phase.data["resolved"] = result.get("target")
    if not run.method_called:
        raise Skip(f"{target.label} was not called within {t:g}s: the phases that observe its "
                   "calls are skipped")
    phase.data["first_call_ms"] = round(costs[0], 4) if costs else None
    run.first_call_ms = costs[0] if costs else None
    run.call_period_s = costs[0] / 1000.0 if costs else None


# How long the locate phase watches before it asks whether the loop trains without the method,
# and the backward passes (in LOCATE_PROBE_S) that say it does.
LOCATE_QUICK_S = 5.0
LOCATE_PROBE_S = 2.0
LOCATE_TRAINING_BACKWARDS = 3
BACKWARD_WORDS = ["torch.autograd", "backward"]


def _was_called(phase: PhaseResult, result: dict[str, Any]) -> bool:
    costs = [c for c in (stats.cost_ms(e) for e in phase.data.get("events", [])) if c is not None]
    return bool(costs) or bool(result.get("matched"))


def _running_call(run: Run, phase: PhaseResult) -> str | None:
    """``thread T at file:line`` where a thread is inside the method now, or None."""
    target = run.options.target
    assert target is not None
    words = run.words()
    method = words[-1]
    qualified = f"{words[1]}.{method}" if len(words) == 3 else method
    path = words[0].replace(".", "/")
    command, events = phase.command, phase.data.pop("events", None)
    try:
        result = run.command(phase, basic.stack())
    except FlightProfilerError:
        return None
    finally:
        phase.command = command
        if events is not None:
            phase.data["events"] = events
    for thread in result.get("threads") or []:
        for frame in thread.get("frames") or []:
            file, function = str(frame.get("file", "")), str(frame.get("function", ""))
            if function in (qualified, method) and (words[0] == "__main__" or path in file):
                return f"thread {thread.get('name')!s} at {file.rsplit('/', 1)[-1]}:{frame.get('line')}"
    return None


def _backward_passes(run: Run, phase: PhaseResult) -> int:
    """Backward passes the loop runs in LOCATE_PROBE_S (0 if they cannot be watched)."""
    command, events = phase.command, phase.data.pop("events", None)
    probe = hooks.watch(BACKWARD_WORDS, count=LOCATE_TRAINING_BACKWARDS, timeout=LOCATE_PROBE_S)
    try:
        result = run.command(phase, probe)
    except FlightProfilerError:
        return 0
    finally:
        phase.command = f"{command}; {probe.line}"
        phase.data.pop("events", None)
        if events is not None:
            phase.data["events"] = events
    matched = result.get("matched")
    return matched if isinstance(matched, int) else 0


def phase_memory(run: Run, phase: PhaseResult) -> None:
    run.require_torch()
    result = run.command(phase, torch_requests.memory())
    phase.data["summary"] = result


def _snapshot(run: Run, phase: PhaseResult, name: str) -> None:
    # On CUDA the allocator's snapshot; on a CPU-only target the agent builds one in the same
    # schema from the live tensors, so the report compares both alike.
    run.require_torch()
    path = run.path(name)
    run.command(phase, torch_requests.memory(snapshot=True, file=path))
    expect_file(phase, path)


def phase_snapshot_before(run: Run, phase: PhaseResult) -> None:
    _snapshot(run, phase, "snapshot-before.pickle")


def phase_snapshot_after(run: Run, phase: PhaseResult) -> None:
    _snapshot(run, phase, "snapshot-after.pickle")


CENSUS_ATTEMPTS = 3
CENSUS_RETRY_S = 1.0


def _census(run: Run, phase: PhaseResult, name: str, previous: str | None) -> dict[str, Any]:
    """One census of the series (before, middle, after), each compared with the one before it.

    With a method that is being called, it is taken right after the method's next call returns
    (`torch tensors METHOD`): every census of the series then sees the program at the same point
    of its step, and a running forward's locals cannot take the credit for what the loop holds.
    """
    run.require_torch()
    path = run.path(name)
    o = run.options
    target = run.words() if o.target is not None and run.method_called else ()
    diff = previous if previous is not None and os.path.exists(previous) else None
    request = torch_requests.tensors(target, file=path, diff=diff, timeout=o.timeout if target else None)
    for attempt in range(CENSUS_ATTEMPTS):
        try:
            result = run.command(phase, request)
            break
        except FlightProfilerError as exc:
            # The agent read nothing because a thread sat in one native call for its whole
            # budget: a DDP rank waiting in backward's all-reduce for a peer busy elsewhere (rank
            # 0's validation pass, another rank's census). Any moment of the window serves: wait
            # for the peer and look again, rather than lose a census of the series.
            if attempt + 1 == CENSUS_ATTEMPTS or not (exc.hint or "").startswith("retry"):
                raise
            phase.data.setdefault("retried", []).append(exc.message[:300])
            time.sleep(CENSUS_RETRY_S)
    expect_file(phase, path)
    phase.data["totals"] = result.get("totals")
    phase.data["moment"] = result.get("moment")
    return result


def _let_it_run(run: Run, seconds: float) -> None:
    """Growth needs time: let the job run until ``seconds`` after the first census."""
    if run.census_before_at:
        left = seconds - (time.monotonic() - run.census_before_at)
        if left > 0:
            run.progress.waiting(f"letting the job run {left:.0f}s more to measure growth")
            run.preloader.warm(run.artefacts, left)  # the report's loading, done meanwhile
            left = seconds - (time.monotonic() - run.census_before_at)
            if left > 0:
                time.sleep(left)


def phase_census_before(run: Run, phase: PhaseResult) -> None:
    _census(run, phase, "census-before.json", None)
    run.census_before_at = time.monotonic()


def phase_census_middle(run: Run, phase: PhaseResult) -> None:
    # Growth is judged over three censuses at least (report/census_growth.py): two points
    # cannot tell a leak from a cache filling up or a step caught at two moments.
    _let_it_run(run, run.options.duration / 2)
    _census(run, phase, "census-middle.json", run.path("census-before.json"))


def phase_profile(run: Run, phase: PhaseResult) -> None:
    run.require_torch()
    o = run.options
    path = run.path("profile.json.gz")
    if o.align_profile is not None:
        run.progress.waiting("waiting for the other ranks, to profile the same window")
        phase.data["aligned"] = o.align_profile()
    if o.target is not None and run.method_called:
        # All threads around the next calls: whole steps, wherever the method runs in them
        # (a forward's outputs are freed and its graph used by the backward after it returns);
        # the report finds the step from the marked calls and optimizer steps.
        calls = min(run.calls_for(HEAVY_CALLS), PROFILE_CALLS)
        request = torch_requests.profile(run.words(), calls=calls, window=True,
                                         duration=o.duration, file=path, profile_memory=True,
                                         with_stack=True, timeout=o.timeout, row_limit=0,
                                         budget=PROFILE_BUDGET_S if calls > 2 else None)
        result = run.command(phase, request, timeout=o.timeout + EXPORT_S, expect_calls=calls)
        if result.get("mode") == "around":
            entered, window = result.get("calls_entered"), result.get("window_s")
            if isinstance(entered, int) and entered >= 2 and isinstance(window, (int, float)):
                run.call_period_s = max(run.call_period_s or 0.0, float(window) / entered)
            steps = ", ".join(f"optimizer {k}: {n} steps"
                              for k, n in (result.get("optimizer_steps") or {}).items())
            phase.data["mode"] = (f"all threads around {result.get('calls_entered')} calls of "
                                  f"{o.target.label}, "
                                  f"{result.get('window_s') or result.get('duration_s')}s"
                                  + (f" ({steps})" if steps else ""))
        elif result.get("holds_step"):
            warm = result.get("warmup_calls")
            phase.data["mode"] = (f"each call of {o.target.label} holds a whole step: its next "
                                  f"{calls} calls, one session each"
                                  + (f" (after {warm} warm-up call)" if warm else ""))
        else:
            phase.data["mode"] = f"next {calls} calls of {o.target.label} (one session each)"
        _note_partial(phase, result, calls)
    else:
        run.progress.waiting(f"profiling a {o.duration:g}s window")
        request = torch_requests.profile(duration=o.duration, file=path, profile_memory=True,
                                         with_stack=True, steps=WINDOW_STEPS, row_limit=0)
        result = run.command(phase, request, timeout=o.duration + o.timeout + EXPORT_S)
        why = "no method given" if o.target is None else f"{o.target.label} was not called"
        phase.data["mode"] = f"{o.duration:g}s window ({why})"
        _window_step(run, phase, result)
    phase.data.update({k: result[k] for k in ("window_s", "stop_s", "export_s") if k in result})
    expect_file(phase, path)
    run.preloader.load_aside(path)  # at the lowest CPU priority, while the next phases measure


# Optimizer steps a window must have seen for its optimizer to stand for the step afterwards.
WINDOW_STEP_MIN = 3


def _window_step(run: Run, phase: PhaseResult, result: dict[str, Any]) -> None:
    """Without a method, the optimizer whose steps the window saw (the one that stepped least,
    at least WINDOW_STEP_MIN times) stands for the step in the gradient phase: measured right
    after its calls, what the loop carries from step to step is checked as if the user had named
    it. Without it, 3 measurements 1 s apart at safe points could not see a running sum of
    losses restarted each epoch (the yunjey-style language model: `total_loss += loss`, an
    epoch every ~2 s, censuses 3 s apart: each held a new chain)."""
    steps = result.get("optimizer_steps") or {}
    classes = result.get("optimizer_classes") or {}
    seen = [(int(n), classes[k]) for k, n in steps.items()
            if isinstance(n, int) and isinstance(classes.get(k), str)]
    if not seen:
        return
    count, path = min(seen)
    module, _, name = path.rpartition(".")
    duration = float(result.get("window_s") or result.get("duration_s") or 0.0)
    nameable = bool(module) and all(part.isidentifier() for part in (*module.split("."), name))
    if count < WINDOW_STEP_MIN or not nameable or duration <= 0:
        return
    run.window_step = [module, name, "step"]
    run.window_steps_per_s = count / duration
    phase.data["step"] = f"{name}.step ({count} steps in {duration:g}s)"


def phase_record(run: Run, phase: PhaseResult) -> None:
    # CUDA: the allocator's history, with each allocation's stack, segments and OOMs.
    run.require_method()
    run.require_torch()
    if run.cuda is False:
        # On CPU, `torch memory -r` is the profiler's memory events in the snapshot's schema:
        # the profile phase just recorded those same calls' allocations (profile_memory, with
        # stacks), and no rule judges a CPU recording (fragmentation and OOMs are CUDA's). It
        # cost 1.0-2.5 s of a 10-13 s diagnosis (LBFGS, actor-critic) for a file nothing read.
        raise Skip(CPU_RECORD_SKIPPED)
    o = run.options
    assert o.target is not None
    path = run.path("record.pickle")
    calls = run.calls_for(HEAVY_RECORD_CALLS)
    request = torch_requests.memory(run.words(), record=True, calls=calls, file=path,
                                    timeout=o.timeout, budget=RECORD_BUDGET_S)
    result = run.command(phase, request, expect_calls=calls)
    _note_partial(phase, result, calls)
    expect_file(phase, path)


def phase_watch(run: Run, phase: PhaseResult) -> None:
    run.require_method()
    o = run.options
    assert o.target is not None
    calls = run.calls_within(run.calls_for(HEAVY_WATCH_CALLS))
    try:
        request = hooks.watch(run.words(), expr="cost", count=calls, timeout=o.timeout)
        result = run.command(phase, request, expect_calls=calls)
    except PhaseTimeout as exc:
        # Some calls may have been seen: their spread is still worth reporting.
        _summarise_watch(phase, exc.partial or {})
        raise
    _summarise_watch(phase, result)
    run.watch_loop = phase.data.get("loop")
    period_ms = (run.watch_loop or {}).get("period_ms")
    if isinstance(period_ms, (int, float)) and period_ms > 0:
        run.call_period_s = float(period_ms) / 1000.0
    _note_partial(phase, {"calls_recorded": phase.data["cost"].get("calls", 0)}, calls)


def _note_partial(phase: PhaseResult, result: dict[str, Any], wanted: int) -> None:
    """Fewer calls than asked within the time limit: keep what was seen, and say so."""
    got = result.get("calls_recorded")
    if isinstance(got, int) and got < wanted:
        phase.data["partial"] = (f"{got} of {wanted} calls: their recording took its "
                                 f"{result['budget_s']:g} s budget" if result.get("budget_s") else
                                 f"{got} of {wanted} calls within the time limit")


def _summarise_watch(phase: PhaseResult, result: dict[str, Any]) -> None:
    events = phase.data.pop("events", [])
    costs = [c for c in (stats.cost_ms(e) for e in events) if c is not None]
    if not costs:
        for key in ("calls", "events", "records"):
            if isinstance(result.get(key), list):
                costs = [c for c in (stats.cost_ms(e) for e in result[key]) if c is not None]
                break
    phase.data["cost"] = stats.spread(costs)
    phase.data["costs_ms"] = [round(c, 4) for c in costs]
    loop = stats.busy_share(events)
    if loop is not None:
        phase.data["loop"] = loop


def phase_input(run: Run, phase: PhaseResult) -> None:
    """The DataLoaders' real settings, and where the loop spends its time between calls.

    Runs when torch is there: the input-bound verdict and its fix need the loaders' settings
    (num_workers, pin_memory...), and with a method whose calls are a small share of the loop,
    the stacks sampled here say what fills the rest (a DataLoader wait, a sleep, I/O).
    """
    run.require_torch()
    watch = run.watch_loop or {}
    idle = bool(watch) and float(watch.get("busy_share", 1.0)) < stats.BUSY_SHARE_IDLE
    # Long enough to see a few loop periods (the DataLoader's share is timed over whole batch
    # periods, see report/live_loop.py), short enough not to slow the diagnosis down.
    period_s = float(watch.get("period_ms", 0.0)) / 1000.0 if watch else 0.0
    # With a method, its calls' graphs are followed for the same window: at least 2 s, so that
    # an evaluation pass once an epoch of up to about that is seen (a forward is well under half
    # of its loop, which alone would have given 1 s).
    follow = run.options.target is not None and bool(run.method_called)
    floor = (INPUT_SAMPLE_S if follow else 1.0 if idle
             else INPUT_SAMPLE_S if run.options.target is not None else WINDOW_SAMPLE_S)
    sample = min(5.0, max(floor, 5 * period_s))
    # No DataLoader alive: nothing's share needs timing over whole batch periods; the method's
    # calls are followed for 5 of its periods (an evaluation pass every step among them), not
    # 2 s (1 s of a style-transfer LBFGS step's 10.6 s diagnosis).
    if_none = max(1.0, 5 * period_s) if follow and period_s > 0 else None
    # Without a method, the same for the optimizer step the profile window found: the models'
    # forwards are followed for 5 of its steps, not 3 s (of a 9-12 s diagnosis of an
    # actor-critic or a DQN, which have no DataLoader). With no such step nothing is followed,
    # and without a loader or a watched loop no finding reads the stacks sampled: 1 s.
    if if_none is None and not follow:
        rate = run.window_steps_per_s if run.window_step is not None else None
        if_none = max(1.0, 5.0 / rate) if rate else 1.0
    # With a method, whether a backward reads the graphs its calls build meanwhile (an
    # evaluation pass once an epoch is a few seconds' look away, rarely in a profile's steps).
    # Without one, the optimizer step the profile window found stands for it: the models'
    # forwards are followed (a step is not a module's method), as when a user names the step.
    words = run.words() if follow else (run.window_step or ())
    # Beyond the sample: finding the models (1 s at most), waiting for an epoch's end that is
    # near (4 s at most, agent/dataloader_state.START_WAIT_S), the backwards in flight (2 s).
    result = run.command(phase, basic.dataloader(sample=sample, target=words,
                                                 sample_if_none=if_none if if_none and if_none < sample else None),
                         timeout=sample + 15)
    phase.data["loaders"] = result.get("loaders") or []
    phase.data["threads"] = result.get("threads") or []
    phase.data["next_timing"] = result.get("next_timing") or []
    phase.data["sampled_s"] = result.get("sampled_s")
    phase.data["cpus"] = result.get("cpus")
    if result.get("ranks_here"):
        phase.data["ranks_here"] = result["ranks_here"]
    if result.get("graph_use"):
        phase.data["graph_use"] = result["graph_use"]
    if watch:
        phase.data["loop"] = watch


def phase_trace(run: Run, phase: PhaseResult) -> None:
    run.require_method()
    o = run.options
    assert o.target is not None
    try:
        # -i 0.01: keep callees down to 10 us so that small Python-level costs still add up.
        calls = run.calls_within(run.calls_for(HEAVY_CALLS), least=TRACE_CALLS_LEAST)
        request = hooks.trace(run.words(), count=calls, min_ms=0.01, depth=TRACE_DEPTH,
                              timeout=o.timeout)
        result = run.command(phase, request, expect_calls=calls)
    except PhaseTimeout as exc:
        _summarise_trace(phase, exc.partial or {})
        raise
    _summarise_trace(phase, result)


def _summarise_trace(phase: PhaseResult, result: dict[str, Any]) -> None:
    events = phase.data.pop("events", [])
    roots = stats.call_trees(events) or stats.call_trees([result])
    phase.data["where_time_goes"] = stats.where_time_goes(roots, depth=WHERE_LEVELS)
    calls = len(roots)
    if calls == 0:
        raise Skip("no traced call arrived within the time limit")


def phase_census_after(run: Run, phase: PhaseResult) -> None:
    _let_it_run(run, run.options.duration)
    middle = run.path("census-middle.json")
    _census(run, phase, "census-after.json",
            middle if os.path.exists(middle) else run.path("census-before.json"))
    if run.census_before_at:
        phase.data["seconds_since_before"] = round(time.monotonic() - run.census_before_at, 2)


PhaseFn = Callable[[Run, PhaseResult], None]

# The census window (census-before to census-after) lasts --duration at least, and on a fast
# loop its phases take less: the workflow waits. So every phase whose moment does not matter
# runs inside it, where it costs no wall time (the memory summary and the first snapshot:
# 0.2-0.5 s a diagnosis here), not before it.
PHASES: list[tuple[str, str, PhaseFn]] = [
    ("status", "Check the target (torch, CUDA)", phase_status),
    ("locate", "Find the method and wait for a call", phase_locate),
    ("census-before", "Tensor census (before)", phase_census_before),
    ("memory", "Memory state", phase_memory),
    ("snapshot-before", "Memory snapshot (before)", phase_snapshot_before),
    ("profile", "Profile with memory", phase_profile),
    ("record", "Record allocations during the method", phase_record),
    ("watch", "Watch the method's cost", phase_watch),
    ("census-middle", "Tensor census (middle)", phase_census_middle),
    ("input", "DataLoaders, and where the loop waits", phase_input),
    ("trace", "Trace where the time goes", phase_trace),
    ("census-after", "Tensor census (after)", phase_census_after),
    # After the wait, not inside it: the two snapshots stay --duration apart, as the censuses.
    ("snapshot-after", "Memory snapshot (after)", phase_snapshot_after),
    # Last of the live phases: its per-call hooks make the measured calls' graphs hold Python
    # tensor objects, which a census taken after it would count as new, unreached tensors.
    ("grads", "Gradient health (and the first NaN)", phase_grads),
]


# From this phase's end on no phase measures time (the "after" snapshot, the gradients): the
# report's inputs written by then are loaded meanwhile, in a thread (preload.py).
LOAD_BEHIND_AFTER = "census-after"


def _run_phase(run: Run, name: str, title: str, fn: PhaseFn) -> PhaseResult:
    phase = PhaseResult(name, title, started=time.time())
    started = time.monotonic()
    try:
        fn(run, phase)
    except Skip as exc:
        phase.status, phase.reason = SKIPPED, str(exc)
    except PhaseTimeout as exc:
        target = run.options.target
        calls = exc.events
        what = f"{target.label} was called {calls} time(s) in" if target else "no answer within"
        phase.status = TIMED_OUT
        phase.reason = f"{what} {run.options.timeout:g}s; cancelled (its hooks are removed)"
    except TorchMissing as exc:
        run.torch_imported = False
        phase.status, phase.reason = SKIPPED, exc.message
    except FlightProfilerError as exc:
        phase.status, phase.reason = FAILED, exc.message + (f" ({exc.hint})" if exc.hint else "")
    phase.data.pop("events", None)
    if phase.status == OK and phase.data.get("partial"):
        phase.reason = f"partial: {phase.data['partial']}"
    phase.seconds = time.monotonic() - started
    return phase


def run_diagnosis(driver: Driver, options: DiagnoseOptions, progress: Progress | None = None,
                  attach_seconds: float = 0.0) -> DiagnoseResult:
    """Run every phase against the live target, then write the report and diagnose.json."""
    progress = progress or NullProgress()
    os.makedirs(options.out_dir, exist_ok=True)
    result = DiagnoseResult(options, attach_seconds=attach_seconds)
    run = Run(driver, options, progress)
    total = len(PHASES) + 1  # + the report
    try:
        for index, (name, title, fn) in enumerate(PHASES, 1):
            progress.phase(index, total, title)
            try:
                phase = _run_phase(run, name, title, fn)
            except TargetUnusable as exc:
                progress.close()
                raise exc.error from None
            result.phases.append(phase)
            run.artefacts.extend(phase.files)
            progress.done(phase)
            if name == LOAD_BEHIND_AFTER:
                run.preloader.load_behind(run.artefacts)
    except BaseException:
        run.preloader.close()  # no loading worker outlives a diagnosis that ended here
        raise
    from flight_profiler.diagnose.outputs import build_report, write_diagnose_json

    progress.phase(total, total, "Report")
    waited = time.monotonic()
    loaded = run.preloader.taken(result.artefacts)  # waits for the loads still running
    waited = time.monotonic() - waited
    phase = build_report(result, loaded)
    phase.seconds += waited  # the report's time, wherever its inputs were loaded
    phase.data["waited_for_loads_s"] = round(waited, 3)
    result.phases.append(phase)
    progress.done(phase)
    result.finished = time.time()
    write_diagnose_json(result)
    return result
