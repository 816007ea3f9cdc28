"""The command group: ``flight_profiler <pid> [--cmd "..."]`` plus the offline subcommands.

Subcommands are imported on first use so that ``--help`` and a reconnect stay fast (no torch, no
rich tables they do not need).
"""

from __future__ import annotations

import importlib

import click

from flight_profiler import __version__
from flight_profiler.errors import EXIT_CODE_SUMMARIES

# name -> ("module:attribute" of a click command, imported lazily; its one-line summary).
# The summary lives here, not in the command's module, so that `--help` imports no subcommand;
# get_command gives it to the command as its short_help, so there is one text for both.
_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "attach": ("flight_profiler.cli.attach_cmd:attach",
               "Attach to PID and run --cmd, or open a shell (same as `flight_profiler PID`)."),
    "report": ("flight_profiler.cli.report_cmd:report",
               "Diagnose traces, memory snapshots and tensor censuses."),
    "diagnose": ("flight_profiler.cli.diagnose_cmd:diagnose",
                 "Run the whole diagnosis workflow against a live process."),
    "demo": ("flight_profiler.cli.demo_cmd:demo",
             "Start a bundled sample workload, diagnose it and show the report."),
    "ps": ("flight_profiler.cli.ps_cmd:ps",
           "List Python processes to attach to; torchrun ranks grouped by job."),
    "job": ("flight_profiler.cli.job_cmd:job",
            "Diagnose every node of a SLURM job (job srun JOBID -- diagnose --all-ranks)."),
}


class _Group(click.Group):
    """A group whose first argument may be a pid: ``flight_profiler 1234 ...`` means attach."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0].isdigit():
            args = ["attach", *args]
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = _SUBCOMMANDS.get(cmd_name)
        if entry is None:
            return None
        target, summary = entry
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            return None
        command: click.Command = getattr(module, attr)
        command.short_help = summary
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help from a table, so that `--help` does not import every subcommand.
        rows = [(name, summary) for name, (_, summary) in _SUBCOMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=(
        "Examples:\n\n"
        '  flight_profiler 1234 --cmd "stack"\n\n'
        '  flight_profiler 1234 --cmd "torch memory -s -f snap.pickle"\n\n'
        "  flight_profiler 1234            (interactive shell; type `help`)\n\n"
        "  flight_profiler report trace.json.gz snap.pickle\n\n"
        "  flight_profiler diagnose 1234 train train_step --out diag/\n\n"
        "Exit codes (docs/exit-codes.md): "
        + ", ".join(f"{code} {what}" for code, what in EXIT_CODE_SUMMARIES.items()) + "."
    ),
)
@click.version_option(__version__, prog_name="flight_profiler")
def cli() -> None:
    """Look inside a running PyTorch job without restarting it.

    flight_profiler PID [--cmd "COMMAND"] attaches a small agent to the live Python process PID
    and runs COMMAND (stack, watch, trace, torch memory, torch tensors, torch profile, status,
    detach); without --cmd it opens an interactive shell.
    """
