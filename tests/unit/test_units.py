"""The CLI side's formatters (report/units.py) say what the agent's own copies say."""

from __future__ import annotations

import pytest

from flight_profiler.agent.torch_support import fmt_bytes as agent_fmt_bytes
from flight_profiler.agent.values import fmt_ms as agent_fmt_ms
from flight_profiler.report.units import fmt_bytes, fmt_ms

MS = [0.0, 0.0004, 0.0099, 0.01, 0.4123, 0.999, 1.0, 12.345, 99.99, 100.0, 5_000.5, 3.6e6]


@pytest.mark.parametrize("ms", MS)
def test_durations_read_the_same_from_the_agent_and_the_cli(ms: float) -> None:
    assert fmt_ms(ms) == agent_fmt_ms(ms)


# (the agent stops at GiB; the CLI goes on to TiB)
@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 1536, 10 * 2**20, 3 * 2**30 + 7])
def test_sizes_read_the_same_from_the_agent_and_the_cli(n: int) -> None:
    assert fmt_bytes(n) == agent_fmt_bytes(n)


def test_the_shell_tables_show_unknown_sizes_as_a_question_mark() -> None:
    from flight_profiler.cli.agent_commands.torch import _size

    assert [_size(None), _size("n/a"), _size(-2048), _size(2**20)] == ["?", "?", "-2.0 KiB", "1.0 MiB"]
