"""What the top-level ``--help`` says, as data without click: the group's help, its epilog and
the subcommands' one-line summaries. cli/app.py builds the click group from it, and
cli/quick_help.py prints the same help without importing click (tests/unit/test_quick_help.py
holds the two texts equal)."""

from __future__ import annotations

from flight_profiler.errors import EXIT_CODE_SUMMARIES

# name -> ("module:attribute" of a click command, imported lazily; its one-line summary).
# The summary lives here, not in the command's module, so that `--help` imports no subcommand;
# get_command gives it to the command as its short_help, so there is one text for both.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
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

GROUP_HELP = """Look inside a running PyTorch job without restarting it.

flight_profiler PID [--cmd "COMMAND"] attaches a small agent to the live Python process PID
and runs COMMAND (stack, watch, trace, torch memory, torch tensors, torch profile, status,
detach); without --cmd it opens an interactive shell."""

EPILOG = (
    "Examples:\n\n"
    '  flight_profiler 1234 --cmd "stack"\n\n'
    '  flight_profiler 1234 --cmd "torch memory -s -f snap.pickle"\n\n'
    "  flight_profiler 1234            (interactive shell; type `help`)\n\n"
    "  flight_profiler report trace.json.gz snap.pickle\n\n"
    "  flight_profiler diagnose 1234 train train_step --out diag/\n\n"
    "Exit codes (docs/exit-codes.md): "
    + ", ".join(f"{code} {what}" for code, what in EXIT_CODE_SUMMARIES.items()) + "."
)

# The group's own options, as click lists them (click.version_option and the help option).
OPTIONS: list[tuple[str, str]] = [
    ("--version", "Show the version and exit."),
    ("-h, --help", "Show this message and exit."),
]
