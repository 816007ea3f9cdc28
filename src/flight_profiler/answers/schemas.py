"""The shapes of the agent's answers, per handler: results and streamed events.

Written from what the agent's handlers return (agent/commands/*) and from what the renderers
(cli/agent_commands), diagnose and the rank views read. tests/fixtures/answers/answers.json holds
real answers of every handler; a test checks that each one passes.
"""

from __future__ import annotations

from flight_profiler.answers.shapes import (
    ANY,
    BOOL,
    FINITE,
    INT,
    NEVER,
    NUM,
    STR,
    Either,
    ListOf,
    MapOf,
    Obj,
    Opt,
    Pair,
    Rule,
    Shape,
    Tree,
)

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any

TEXT = Either(STR, NUM, BOOL)  # a field shown as text; the agent may send a number there
FIGURE = Either(NUM, STR)  # a measurement: a number, or "nan"/"inf" the agent spelt out
SIZE = Either(NUM, STR)  # bytes; "?" when unknown

_FILE = {"path": STR, "size": SIZE}  # what every file-writing command adds

# armed triggers (`arm`, `disarm`, and `status` lists them)
TRIGGER = Obj(required={"kind": STR}, optional={
    "state": STR, "params": MapOf(ANY), "fires": INT, "max_fires": INT, "dropped": INT,
    "events": ListOf(STR), "errors": ListOf(TEXT), "expires_in_s": NUM, "stalled_s": NUM,
    "left_behind": ListOf(TEXT), "checks": INT, "every": INT, "rss_peak": INT})
ARMORY = Obj(optional={"armed": ListOf(TRIGGER), "disarmed": ListOf(TRIGGER),
                       "step_clock": MapOf(ANY), "hooks_pending_removal": INT, "watcher": BOOL})

# -- status, stack, detach ---------------------------------------------------------------------
STATUS = Obj(optional={
    "agent_version": TEXT, "pid": INT, "uptime_s": NUM,
    "python": Obj(optional={"version": TEXT, "implementation": TEXT, "executable": TEXT,
                            "argv": ListOf(STR)}),
    "threads": Obj(optional={"total": INT, "agent": INT}),
    "torch": Obj(optional={"imported": BOOL, "importing": BOOL, "version": TEXT, "cuda_available": BOOL,
                           "cuda_version": TEXT, "device_count": INT, "cuda_error": TEXT}),
    "active_hooks": ListOf(STR),
    "arm": ARMORY,
})

FRAME = Obj(required={"file": STR, "function": STR}, optional={"line": INT})
STACK = Obj(required={"threads": ListOf(Obj(
    required={"frames": ListOf(FRAME)},
    optional={"ident": INT, "native_id": INT, "name": TEXT, "daemon": BOOL, "main": BOOL,
              "agent": BOOL, "progress": Obj(optional={"switches": INT, "cpu_ticks": INT})}))},
    optional={"hidden_agent_threads": INT})

DETACH = Obj(optional={"detached": BOOL, "hooks_removed": INT, "reason": TEXT})

# -- progress events of the torch commands ------------------------------------------------------
PROGRESS = Obj(optional={"event": STR, "message": TEXT, "what": TEXT, "calls": INT,
                         "calls_done": INT, "target": TEXT})

# -- torch memory ------------------------------------------------------------------------------
_CALLS = {"calls_recorded": INT, "calls_requested": INT, "timed_out": BOOL, "cancelled": BOOL,
          "in_flight": BOOL, "target": TEXT, "budget_s": NUM}
MEMORY = Obj(required={"mode": STR}, optional={
    **_FILE, **_CALLS,
    "rss_bytes": SIZE, "cuda": ANY,
    "devices": ListOf(Obj(required={"device": TEXT, "allocated": NUM, "reserved": NUM,
                                    "peak_allocated": NUM, "fragmentation": NUM},
                          optional={"peak_reserved": NUM})),
    "allocator_settings": MapOf(TEXT),
    "tensors_by_device": MapOf(Obj(required={"count": INT, "bytes": NUM})),
    "recording": BOOL, "note": TEXT, "device_type": TEXT, "segments": INT,
    "reserved_bytes": SIZE, "active_bytes": SIZE, "trace_entries": INT,
    "summary": TEXT, "surviving_bytes": SIZE, "allocated_bytes": SIZE, "allocations": INT,
    "top_sites": ListOf(Obj(required={"site": TEXT, "count": INT, "bytes": NUM})),
    "notes": ListOf(TEXT),
})

# -- torch tensors -----------------------------------------------------------------------------
_HOLDER = Obj(required={"path": TEXT, "example": TEXT, "kind": TEXT, "count": INT, "bytes": NUM,
                        "with_grad_fn": INT, "graph_bytes": NUM})
_GROUP = Obj(required={"device": TEXT, "dtype": TEXT, "shape": ListOf(INT), "count": INT,
                       "bytes": NUM, "with_grad_fn": INT})
_HOLDER_DELTA = Obj(required={"path": TEXT, "count_before": INT, "count_after": INT,
                              "bytes_delta": NUM, "graph_bytes_delta": NUM})
_GROUP_DELTA = Obj(required={"device": TEXT, "dtype": TEXT, "shape": ListOf(INT),
                             "count_before": INT, "count_after": INT, "bytes_delta": NUM})
TENSORS = Obj(optional={
    **_FILE, "by": TEXT, "elapsed_s": NUM, "note": TEXT,
    "totals": Obj(optional={"count": INT, "bytes": NUM, "with_grad_fn": INT, "graph_bytes": NUM}),
    "holders": ListOf(_HOLDER), "groups": ListOf(_GROUP),
    "diff": Obj(optional={
        "seconds_between": NUM, "same_process": BOOL,
        "totals": Obj(optional={"count_delta": INT, "bytes_delta": NUM, "graph_bytes_delta": NUM}),
        "holders": ListOf(_HOLDER_DELTA), "groups": ListOf(_GROUP_DELTA)}),
    "skipped": Obj(optional={"reason": TEXT}),
})

# -- torch profile -----------------------------------------------------------------------------
_OP_ROW = Obj(required={"name": TEXT, "count": NUM, "self_cpu": NUM, "cpu_total": NUM},
              optional={"self_cuda": NUM, "cuda_total": NUM, "kernels": NUM})
PROFILE = Obj(optional={
    **_FILE, **_CALLS, "mode": TEXT, "all_threads": BOOL, "duration_s": NUM, "note": TEXT,
    "window_s": NUM, "stop_s": NUM, "export_s": NUM, "ended_by_steps": INT,
    "top_ops": Obj(optional={"has_cuda": BOOL, "sort_by": TEXT, "operators": INT,
                             "rows": ListOf(_OP_ROW)}),
})

# -- torch dataloader --------------------------------------------------------------------------
_WORKER = Obj(optional={"worker_id": INT, "pid": INT, "state": TEXT, "cpu_percent": NUM,
                        "rss_bytes": SIZE})
_ITERATOR = Obj(optional={"type": TEXT, "batches_yielded": INT, "epoch_batches": INT,
                          "distributed_shuffle": BOOL, "batches_in_flight": INT,
                          "batches_ready": INT, "batches_in_window": INT, "batches_per_s": NUM,
                          "ended_during_window": BOOL, "workers": ListOf(_WORKER)})
DATALOADER = Obj(optional={
    "note": TEXT, "sampled_s": NUM, "waited_for_start_s": NUM, "cpus": INT, "ranks_here": INT,
    "loaders": ListOf(Obj(optional={
        "type": TEXT, "dataset": Obj(optional={"type": TEXT, "length": INT}),
        "sampler": Obj(optional={
            "type": TEXT, "distributed": BOOL, "shuffle": TEXT, "epoch": TEXT,
            "num_replicas": TEXT, "rank": TEXT, "starts_seen": INT,
            "epochs_at_starts": ListOf(INT), "unchanged_at_starts": INT, "backward_passes": INT}),
        "batch_size": TEXT, "num_workers": TEXT, "pin_memory": TEXT, "prefetch_factor": TEXT,
        "persistent_workers": TEXT, "iterators": ListOf(_ITERATOR)})),
    "threads": ListOf(Obj(optional={
        "thread": TEXT, "shares": MapOf(NUM),
        "top": ListOf(Obj(required={"share": NUM, "where": TEXT}))})),
    "graph_use": Obj(optional={
        "target": TEXT, "window_s": NUM, "calls": INT, "grad_calls": INT, "no_grad_calls": INT,
        "judged": INT, "used": INT, "unused": INT, "longest_unused_run": INT,
        "unused_saved_bytes_per_call": SIZE, "capped": BOOL,
        "unused_where": ListOf(Obj(optional={"file": TEXT, "line": INT, "function": TEXT,
                                             "calls": INT}))}),
})

# -- torch fr ----------------------------------------------------------------------------------
FR = Obj(optional={
    "enabled": BOOL, "reason": TEXT, "last_enqueued": MapOf(INT),
    "entries": ListOf(Obj(optional={"seq": INT, "pg_id": TEXT, "op": TEXT, "state": TEXT})),
})

# -- torch grads, torch anomaly ----------------------------------------------------------------
_LAYER_ROW = ListOf(Opt(FIGURE), min_items=4)  # grad norm, max |grad|, NaN, Inf
_MODEL_FIGURES = Obj(optional={"grad_norm": FIGURE, "weight_norm": FIGURE, "elapsed_s": FIGURE,
                               "layers": ListOf(Opt(_LAYER_ROW)),
                               "weight_norms": ListOf(Opt(FIGURE)),
                               "nonfinite_grad_layers": INT, "nonfinite_weight_layers": INT})
def _measurements_cover_models(grads: dict[str, Any]) -> str | None:
    models = len(grads.get("models") or [])
    for i, m in enumerate(grads.get("measurements") or []):
        if len(m["models"]) != models:
            return f"measurements[{i}].models: {len(m['models'])} entries for {models} models"
    return None


GRADS = Rule(Obj(optional={
    **_FILE, **_CALLS,
    "models": ListOf(Obj(required={"name": TEXT, "class": TEXT, "numel": INT, "params": INT},
                         optional={"layers": ListOf(Obj(required={"name": TEXT,
                                                                  "shape": ListOf(INT)})),
                                   "unstepped_layers": ListOf(INT)})),
    "measurements": ListOf(Obj(required={"models": ListOf(_MODEL_FIGURES)},
                               optional={"autograd": Obj(optional={
                                   "grad_enabled": BOOL, "saved_bytes": INT,
                                   "saved_tensors": INT, "unpacked": INT,
                                   "unpacked_after": INT})})),
    "optimizers": ListOf(Obj(required={"class": STR}, optional={
        "lr": ANY, "model": INT, "models": ListOf(INT), "steps": INT, "zero_grad_calls": INT})),
    "zeroing": Obj(optional={"observed": BOOL, "module_zero_grad_calls": ListOf(INT),
                             "backward_calls": INT, "backward_after_calls": BOOL,
                             "waited_for_backward_s": NUM,
                             "ddp": ListOf(Obj(required={"model": INT, "forward_calls": INT},
                                               optional={"world_size": Opt(INT)}))}),
}), _measurements_cover_models)

_FIRST_NAN = Obj(required={"op": TEXT, "phase": TEXT, "call": INT, "nan": INT, "inf": INT,
                           "dtype": TEXT, "shape": ListOf(INT)},
                 optional={"backward_node": TEXT, "inputs_finite": BOOL,
                           "forward_stack": ListOf(TEXT)})
ANOMALY = Obj(optional={**_CALLS, "ops_checked": INT, "call_seconds": ListOf(FINITE),
                        "first": _FIRST_NAN, "origin": _FIRST_NAN, "note": TEXT, "anomaly_before": ANY,
                        "anomaly_after": ANY, "restore_pending": BOOL})

# -- watch, trace ------------------------------------------------------------------------------
_ENDED = Obj(optional={"reason": TEXT, "elapsed_s": NUM, "calls": INT, "matched": INT,
                       "events": INT, "dropped": INT, "filter_errors": INT,
                       "first_filter_error": TEXT, "skipped_already_profiled": INT,
                       "target": TEXT})
_FILTER_ERROR = Obj(optional={"type": STR, "message": TEXT})
WATCH_EVENT = Obj(required={"type": STR}, optional={
    "target": TEXT, "note": TEXT, "count": INT, "timeout": NUM, "filter": TEXT,
    "ts": NUM, "n": INT, "thread": TEXT, "cost_ms": NUM, "exception": TEXT,
    "values": ListOf(Pair(TEXT, TEXT)), "total": INT, "message": TEXT,
})
TRACE_NODE = Obj(optional={"name": TEXT, "file": STR, "line": INT, "count": INT, "ms": NUM,
                           "summed_over_callers": INT,
                           "hidden": Obj(optional={"count": INT, "ms": NUM, "deeper": BOOL})})
TRACE_EVENT = Obj(required={"type": STR}, optional={
    "target": TEXT, "min_ms": NUM, "depth": INT, "count": INT, "filter": TEXT, "c_calls": BOOL,
    "ts": NUM, "n": INT, "thread": TEXT, "cost_ms": NUM, "params": TEXT, "exception": TEXT,
    "tree": Tree(TRACE_NODE), "message": TEXT,
})

# -- arm, disarm --------------------------------------------------------------------------------
ARM = Obj(required={"armed": TRIGGER}, optional={"notes": ListOf(TEXT), "out": STR, "for_s": NUM,
                                                 "cap_bytes": INT, "pid": INT})
DISARM = Obj(optional={"disarmed": ListOf(TRIGGER), "still_armed": ARMORY})

# handler name -> (result shape, event shape)
ANSWERS: dict[str, tuple[Shape, Shape]] = {
    "status": (STATUS, NEVER),
    "stack": (STACK, NEVER),
    "detach": (DETACH, NEVER),
    "torch memory": (MEMORY, PROGRESS),
    "torch tensors": (TENSORS, PROGRESS),
    "torch profile": (PROFILE, PROGRESS),
    "torch dataloader": (DATALOADER, PROGRESS),
    "torch fr": (FR, NEVER),
    "torch grads": (GRADS, PROGRESS),
    "torch anomaly": (ANOMALY, PROGRESS),
    "watch": (_ENDED, WATCH_EVENT),
    "trace": (_ENDED, TRACE_EVENT),
    "arm": (ARM, NEVER),
    "disarm": (DISARM, NEVER),
}

ERROR = Obj(optional={"kind": STR, "message": TEXT, "hint": TEXT})
HELLO = Obj(required={"type": STR}, optional={"protocol": ANY, "agent_version": TEXT,
                                              "python": TEXT, "pid": ANY, "start_time": ANY})
