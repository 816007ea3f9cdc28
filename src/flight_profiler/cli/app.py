"""The command group: ``flight_profiler <pid> [--cmd "..."]`` plus the offline subcommands.

Subcommands are imported on first use so that ``--help`` and a reconnect stay fast (no torch, no
rich tables they do not need).
"""

from __future__ import annotations

import importlib

import click

from flight_profiler import __version__
from flight_profiler.cli.commands_table import EPILOG, GROUP_HELP, SUBCOMMANDS


class _Group(click.Group):
    """A group whose first argument may be a pid: ``flight_profiler 1234 ...`` means attach."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0].isdigit():
            args = ["attach", *args]
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = SUBCOMMANDS.get(cmd_name)
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
        rows = [(name, summary) for name, (_, summary) in SUBCOMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    help=GROUP_HELP,
    epilog=EPILOG,
)
@click.version_option(__version__, prog_name="flight_profiler")
def cli() -> None:
    """The command group (its help: cli/commands_table.py, printed by cli/quick_help.py)."""
