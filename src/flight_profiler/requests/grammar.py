"""Command lines as typed after ``--cmd`` or at the shell prompt -> :class:`AgentRequest`.

:func:`parse` is the one reader of the grammar: the CLI, the shell, ``Session.run`` and a
re-run of a diagnose phase's recorded line all go through it. Limits that protect the target
(the size of the line, of each expression) are checked here, before anything is attached.
"""

from __future__ import annotations

import shlex

import click

from flight_profiler.agent.limits import MAX_REQUEST_BYTES
from flight_profiler.errors import UsageError
from flight_profiler.requests.base import AgentRequest

# command name as typed -> attribute of flight_profiler.requests.commands (the click command).
COMMANDS: dict[str, str] = {
    "status": "status",
    "stack": "stack",
    "detach": "detach",
    "watch": "watch",
    "trace": "trace",
    "torch memory": "memory",
    "torch tensors": "tensors",
    "torch profile": "profile",
    "torch fr": "fr",
    "torch dataloader": "dataloader",
    "torch grads": "grads",
    "torch anomaly": "anomaly",
    "arm": "arm_command",
    "disarm": "disarm_command",
}

def summary(name: str) -> str:
    """The command's one-line summary: the first sentence of its own docstring (one source)."""
    return load(name).get_short_help_str(limit=100).rstrip(".")


class HelpShown(Exception):
    """The command string asked for --help; click already printed it."""

    def __init__(self, code: int = 0) -> None:
        super().__init__("help shown")
        self.code = code


def load(name: str) -> click.Command:
    from flight_profiler.requests import commands

    command: click.Command = getattr(commands, COMMANDS[name])
    return command


def split_name(words: list[str]) -> tuple[str, list[str]]:
    """Find the command name (one or two words) at the start of ``words``."""
    if len(words) >= 2 and f"{words[0]} {words[1]}" in COMMANDS:
        return f"{words[0]} {words[1]}", words[2:]
    if words and words[0] in COMMANDS:
        return words[0], words[1:]
    typed = " ".join(words[:2]) if words else ""
    known = ", ".join(COMMANDS)
    raise UsageError(f"unknown command {typed!r}", f"known commands: {known}")


def help_text(topic: str | None = None) -> str:
    """`help` lists the commands; `help CMD` shows that command's --help."""
    if topic:
        if topic == "torch":
            names = [n for n in COMMANDS if n.startswith("torch ")]
            width = max(len(n) for n in names)
            return "\n".join(["torch commands (`help torch memory` etc. for details):"]
                             + [f"  {n.ljust(width)}  {summary(n)}" for n in names])
        if topic not in COMMANDS:
            raise UsageError(f"no command {topic!r}", "type `help` for the list")
        command = load(topic)
        with click.Context(command, info_name=topic) as ctx:
            return command.get_help(ctx)
    width = max(len(name) for name in COMMANDS)
    lines = ["Commands (`help CMD` or `CMD --help` for details):"]
    for name in COMMANDS:
        lines.append(f"  {name.ljust(width)}  {summary(name)}")
    lines.append(f"  {'help'.ljust(width)}  this list")
    lines.append(f"  {'quit'.ljust(width)}  leave the shell (the agent stays until `detach`)")
    return "\n".join(lines)


def parse(command_line: str) -> AgentRequest:
    """Parse ``"watch __main__ train_step -n 3"`` into the request to send to the agent."""
    if len(command_line) > MAX_REQUEST_BYTES // 4:
        # before shlex, whose cost grows with the text: the agent would refuse it anyway
        raise UsageError(f"command of {len(command_line)} characters (limit "
                         f"{MAX_REQUEST_BYTES // 4})", "shorten it: fewer or shorter expressions")
    try:
        words = shlex.split(command_line)
    except ValueError as exc:
        hint = "close the quote" if "quotation" in str(exc) else "check the quoting"
        raise UsageError(f"cannot parse command {command_line!r}: {exc}", hint) from None
    if not words:
        raise UsageError("empty command", "try `stack` or `status`; `help` lists all commands")
    # `help`, `help CMD`, `torch` and `torch --help` print help, as in the shell.
    if words[0] in ("help", "?") or words == ["torch"] or words[:2] in (["torch", "--help"], ["torch", "-h"]):
        topic = " ".join(words[1:]) if words[0] in ("help", "?") else "torch"
        click.echo(help_text(topic or None))
        raise HelpShown(0)
    name, rest = split_name(words)
    command = load(name)
    try:
        with command.make_context(name, rest, resilient_parsing=False) as ctx:
            request = command.invoke(ctx)
    except click.exceptions.Exit as exc:  # --help inside the command string
        raise HelpShown(exc.exit_code) from None
    except click.ClickException as exc:
        raise UsageError(f"{name}: {exc.format_message()}", f"see `{name} --help`") from None
    if not isinstance(request, AgentRequest):
        raise UsageError(f"{name}: command built no request")
    return request
