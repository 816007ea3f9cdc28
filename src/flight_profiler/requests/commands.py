"""The command grammar: click commands whose callbacks hand what was typed to the builders.

The commands' docstrings and option help are the help users read (`help CMD`, `CMD --help`).
An option left at its default reaches the builder as None, so the request's line shows only
what was typed.
"""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from flight_profiler.requests import basic, hooks, torch
from flight_profiler.requests.arm import arm_command, disarm_command
from flight_profiler.requests.base import AgentRequest
from flight_profiler.requests.hooks import EXPR_NAMES
from flight_profiler.requests.params import FiniteFloatRange

__all__ = ["arm_command", "disarm_command"]  # the grammar finds them here


def _given(ctx: click.Context) -> dict[str, Any]:
    given: dict[str, Any] = {}
    for param in ctx.command.params:
        name = param.name
        if name is None:
            continue
        value = ctx.params.get(name)
        if (isinstance(param, click.Option) and not param.is_flag
                and ctx.get_parameter_source(name) is ParameterSource.DEFAULT):
            value = None
        given[name] = value
    return given


@click.command(name="status", context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def status(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """Agent, interpreter, torch/CUDA and active instrumentation."""
    return basic.status()


@click.command(name="stack", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-a", "--all", "show_all", is_flag=True,
              help="Also show the agent's own threads.")
@click.option("--limit", type=click.IntRange(1, 10000), default=200, show_default=True,
              help="At most this many frames per thread (innermost kept).")
@click.option("--progress", is_flag=True,
              help="Also each thread's context switches and CPU time from the kernel: two "
                   "stacks alike with rising switches are a loop passing the same line, not a hang.")
@click.pass_context
def stack(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """Python stacks of all threads, innermost frame last."""
    return basic.stack(**_given(ctx))


@click.command(name="detach", context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def detach(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """Remove all instrumentation and stop the agent.

    A later attach injects afresh.
    """
    return basic.detach()


@click.command("torch fr", context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def fr(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """Flight Recorder: the last collectives of each process group.

    Needs a job started with TORCH_FR_BUFFER_SIZE.

    \b
    With --all-ranks, the rank whose sequence id is lower than the others' is behind.
    """
    return basic.fr()


@click.command(name="watch", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", nargs=-1, required=True, metavar="MODULE [CLASS] METHOD")
@click.option("--expr", "expr", metavar="EXPRS",
              help=f"Comma list of what to show, over {EXPR_NAMES}, or any Python expression of "
                   "them, e.g. --expr 'params[0].shape, cost'. Default: params, return_obj, cost.")
@click.option("-f", "--filter", "condition", metavar="CONDITION",
              help="Only calls where this expression is true, e.g. -f 'cost > 10' or "
                   "-f 'params[0] == 3'. A filter on params/kwargs/target only is decided "
                   "before the call and is the cheapest.")
@click.option("-e", "--exceptions", is_flag=True, help="Only calls that raised.")
@click.option("-x", "--expand", type=click.IntRange(0, 8), default=1, show_default=True,
              help="Depth to which containers and objects are expanded.")
@click.option("-n", "--count", type=click.IntRange(1), metavar="COUNT",
              help="Stop after COUNT matching calls (calls the filter rejects do not count).")
@click.option("--timeout", type=FiniteFloatRange(0, min_open=True), metavar="S",
              help="Stop after S seconds.")
@click.option("-nm", "--nested", metavar="NAME",
              help="Watch the function NAME defined inside METHOD (dotted for deeper).")
@click.pass_context
def watch(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """Each call of MODULE [CLASS] METHOD: args, return, cost.

    Arguments, return value, exception and cost of each call, live.

    \b
    Examples:
      watch __main__ Trainer train_step -n 3
      watch __main__ train_step --expr 'params[0].shape, cost' -f 'cost > 50'
      watch mypkg.data Loader __next__ -e
    Stops at -n, --timeout or Ctrl-C; the hook is removed in every case.
    """
    return hooks.watch(**_given(ctx))


@click.command(name="trace", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", nargs=-1, required=True, metavar="MODULE [CLASS] METHOD")
@click.option("-i", "--min-ms", type=FiniteFloatRange(0), default=0.1, show_default=True,
              help="Hide subtrees faster than this many ms (summarised as one line with a count).")
@click.option("-d", "--depth", type=click.IntRange(0), default=0,
              help="Show at most this many levels below the traced call (0: all).")
@click.option("-n", "--count", type=click.IntRange(1), default=1, show_default=True,
              help="Stop after COUNT matching calls.")
@click.option("-f", "--filter", "condition", metavar="CONDITION",
              help="Only calls where this expression is true (names as in watch: params, kwargs, "
                   "target, return_obj, throw_exp, cost).")
@click.option("--timeout", type=FiniteFloatRange(0, min_open=True), metavar="S",
              help="Stop after S seconds.")
@click.option("--c-calls", is_flag=True,
              help="Include C functions (builtins, torch ops such as torch._C._nn.linear).")
@click.option("-nm", "--nested", metavar="NAME",
              help="Trace the function NAME defined inside METHOD.")
@click.pass_context
def trace(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """The call tree below MODULE [CLASS] METHOD, timed.

    The call tree below each call, with inclusive times.

    \b
    Examples:
      trace __main__ Trainer train_step
      trace __main__ Trainer train_step -i 1 -d 4 --c-calls
      trace mypkg.model Model forward -f 'cost > 100' -n 3
    Only the traced thread pays, and only while the traced call runs.
    """
    return hooks.trace(**_given(ctx))


@click.command("torch memory", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", nargs=-1)
@click.option("-s", "--snapshot", is_flag=True, help="Write a memory snapshot pickle (PyTorch's schema).")
@click.option("-r", "--record", is_flag=True, help="Record allocations during the next call(s) of TARGET.")
@click.option("--record-history", type=click.Choice(["on", "off"]), help="Start/stop CUDA allocation history recording.")
@click.option("--max-entries", type=click.IntRange(1), help="History ring buffer size (CUDA).")
@click.option("-n", "--calls", type=click.IntRange(1), default=1, show_default=True, help="Calls to record (-r).")
@click.option("-f", "--file", "file", help="Output file (default: fp-<pid>-memory-<time>.pickle in this directory).")
@click.option("--timeout", type=FiniteFloatRange(0.1), default=60.0, show_default=True, help="Seconds to wait for the calls (-r).")
@click.option("--budget", type=FiniteFloatRange(0.1), help="-r: stop recording once the recorded calls took this many seconds in all (at least 2 calls).")
@click.option("--label", default="", help="Label stored in the file.")
@click.pass_context
def memory(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """Allocator state; -s snapshot; -r record a method.

    -r records a method's allocations; --record-history on|off.

    \b
    torch memory                         per-device allocated/reserved/peak, RSS, live tensors
    torch memory -s [-f snap.pickle]     snapshot (CUDA allocator, or live storages on CPU)
    torch memory --record-history on     CUDA: later snapshots carry allocation stacks
    torch memory -r __main__ train_step -n 2   allocations and frees with Python stacks
    """
    return torch.memory(**_given(ctx))


@click.command("torch tensors", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", nargs=-1)
@click.option("--top", type=click.IntRange(1), default=10, show_default=True, help="Rows per table.")
@click.option("--by", type=click.Choice(["holder", "shape", "site"]), default="holder", show_default=True,
              help="Which table comes first (sites are only known to `torch memory -r`).")
@click.option("--diff", "diff", type=click.Path(dir_okay=False), help="A previous census JSON: show what grew.")
@click.option("-f", "--file", "file", help="Output JSON (default: fp-<pid>-census-<time>.json in this directory).")
@click.option("--label", default="", help="Label stored in the census.")
@click.option("--budget", type=FiniteFloatRange(0.1), default=5.0, show_default=True, help="Time budget in seconds.")
@click.option("--timeout", type=FiniteFloatRange(0.1), help="With a method: seconds to wait for its call (default 30).")
@click.pass_context
def tensors(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """Live tensors and who holds them (leak finder).

    --diff PREVIOUS.json for growth. With a method, the census is taken right after its next
    call returns (the same point of every step).

    \b
    torch tensors -f before.json
    torch tensors -f after.json --diff before.json    what grew, by holder and by shape
    torch tensors __main__ Trainer step -f c2.json --diff c1.json
    """
    return torch.tensors(**_given(ctx))


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
@click.option("--row-limit", type=click.IntRange(0), default=15, show_default=True,
              help="Rows of the operator table; 0: no table (the trace is copied as torch "
                   "exported it, never parsed inside the target: faster, no memory spent there).")
@click.option("--timeout", type=FiniteFloatRange(0.1), default=60.0, show_default=True, help="Seconds to wait for the calls.")
@click.option("--schedule", help="wait,warmup,active[,repeat]: ProfilerStep per call (training steps).")
@click.option("--window", is_flag=True,
              help="All threads around the next N calls: the whole steps they run in (with a method; "
                   "--duration: at most this long once the calls are in).")
@click.option("--steps", type=click.IntRange(1),
              help="With --duration alone: end the window sooner, once every optimizer stepped N "
                   "times (after 1 s at least): a fast loop's 5 s window is millions of events.")
@click.option("--budget", type=FiniteFloatRange(0.1),
              help="With a method profiled a session per call: no further call once the profiled "
                   "ones took this many seconds in all, their sessions' stops included (at least "
                   "2 calls). Not used by an all-threads --window.")
@click.option("--tensorboard", type=click.Path(file_okay=False), help="Write DIR/plugins/profile/<run>/<host>_<pid>.<ts>.pt.trace.json.gz.")
@click.option("--label", default="", help="Trace name (and TensorBoard run name).")
@click.pass_context
def profile(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """A method's next calls (or a window) to a Chrome trace.

    Profiles a method's next calls, or all threads for --duration.

    \b
    torch profile __main__ train_step -n 3 --with-stack
    torch profile mypkg.trainer Trainer step --schedule 1,1,3
    torch profile __main__ Model forward -n 10 --window    the steps around 10 calls
    torch profile --duration 5 -f window.json.gz
    torch profile --duration 5 --steps 20    at most 5 s, less once 20 steps are in
    """
    return torch.profile(**_given(ctx))


@click.command("torch dataloader", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", nargs=-1)
@click.option("--sample", type=click.FloatRange(0, 60), default=1.0, show_default=True,
              help="Seconds of stack sampling to see what each thread waits on (0: none).")
@click.option("--sample-if-none", type=click.FloatRange(0.1, 60), default=None,
              help="Seconds to sample instead when no DataLoader is alive (default: --sample).")
@click.pass_context
def dataloader(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """Live DataLoaders: settings, workers, what the loop waits on.

    Each DataLoader alive in the target: dataset and length, batch_size, num_workers,
    pin_memory, prefetch_factor, persistent_workers; each worker's pid, state, CPU and RSS;
    batches in flight; and what the training loop is waiting on (sampled stacks).
    With TARGET (module [class] method), also whether a backward reads the graphs its
    calls build while sampling: calls with grad on whose graphs nobody reads are an
    evaluation pass written without torch.no_grad().

    \b
    torch dataloader
    torch dataloader --sample 3       a longer look at what the loop waits on
    torch dataloader __main__ Net forward --sample 3
    """
    return basic.dataloader(**_given(ctx))


@click.command("torch grads", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", nargs=-1)
@click.option("-n", "--calls", type=click.IntRange(1), default=1, show_default=True,
              help="Calls of TARGET to measure after (without TARGET: measurements, --interval apart).")
@click.option("-i", "--interval", type=click.FloatRange(0.01), default=1.0, show_default=True,
              help="Seconds between measurements without TARGET.")
@click.option("-f", "--file", "file", help="Output JSON (default: fp-<pid>-grads-<time>.json in this directory).")
@click.option("--timeout", type=click.FloatRange(0.1), default=60.0, show_default=True, help="Seconds to wait for the calls.")
@click.option("--label", default="", help="Label stored in the file.")
@click.pass_context
def grads(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """Gradient and weight health of the models the target holds.

    Per parameter, in module order: grad norm, max |grad|, NaN/Inf counts, weight norm; the
    first layer with non-finite values; whether grads are zeroed between steps (optimizer
    step() and zero_grad() calls are counted while measuring a method or -n > 1).

    \b
    torch grads                                   now, at the main thread's next safe point
    torch grads -n 5 -i 2                         5 measurements, 2 s apart
    torch grads __main__ Trainer train_step -n 3  right after each of the next 3 calls
    """
    return torch.grads(**_given(ctx))


@click.command("torch anomaly", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", nargs=-1, required=True)
@click.option("-n", "--calls", type=click.IntRange(1), default=1, show_default=True, help="Calls to run under anomaly detection.")
@click.option("--timeout", type=click.FloatRange(0.1), default=60.0, show_default=True, help="Seconds to wait for the calls.")
@click.pass_context
def anomaly(ctx: click.Context, /, **_: Any) -> AgentRequest:
    """The op and Python line of the first NaN/Inf (costly).

    Finds them in TARGET's next calls, under anomaly mode.

    COST: each call runs under torch.autograd anomaly mode (every autograd node records its
    Python stack) and every operator's output is checked for NaN/Inf until the first one: calls
    get several times slower (measured: docs/commands-torch-grads.md). Anomaly mode is
    PROCESS-WIDE: other threads pay for it too while a call runs. It is restored exactly as it
    was when each call ends (also on timeout, Ctrl-C, disconnect and detach). Unlike
    detect_anomaly, nothing is raised into the program.

    \b
    torch anomaly __main__ train_step -n 1
    torch anomaly mypkg.trainer Trainer step -n 5 --timeout 120
    """

    return torch.anomaly(**_given(ctx))
