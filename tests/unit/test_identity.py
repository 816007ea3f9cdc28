"""The pinned process identity (attach/identity.py): a changed start time, executable or uid, or
a process that is gone, is never taken for the one the pre-flight inspected."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest

from flight_profiler.attach import identity
from flight_profiler.attach.process import inspect
from flight_profiler.errors import ExitCode, ProcessNotFound

STAT = "1234 (py thon) S 1 1234 1234 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 98765 0 0"


def test_the_identity_is_read_from_stat_status_and_exe() -> None:
    seen = identity.parse(STAT, "Name:\tx\nUid:\t1000\t1001\t1002\t1003\n", "/usr/bin/python3 (deleted)")
    assert seen == identity.Seen(98765, "/usr/bin/python3", 1001)


def test_a_changed_start_time_exe_or_uid_is_a_different_process() -> None:
    seen = identity.Seen(98765, "/usr/bin/python3", 1001)
    assert identity.differs(seen, seen) is None
    assert "reused" in str(identity.differs(seen, identity.Seen(98766, "/usr/bin/python3", 1001)))
    assert "/bin/sh" in str(identity.differs(seen, identity.Seen(98765, "/bin/sh", 1001)))
    assert "uid 0" in str(identity.differs(seen, identity.Seen(98765, "/usr/bin/python3", 0)))


def test_a_pin_of_a_live_process_holds() -> None:
    target = inspect(os.getpid(), check_permissions=False)
    with identity.Pin(target) as pin:
        pin.check()
        pin.check()


def test_the_pin_refuses_a_start_time_other_than_the_preflights() -> None:
    # GIVEN the pre-flight's view of a process, whose pid now belongs to a later process
    target = inspect(os.getpid(), check_permissions=False)
    stale = copy.copy(target)
    stale.start_time -= 1
    # WHEN the injector pins it, THEN it says so and touches nothing
    with pytest.raises(ProcessNotFound, match="reused") as info:
        identity.Pin(stale)
    assert info.value.exit_code == ExitCode.PROCESS_NOT_FOUND
    assert "nothing was injected" in info.value.message


def test_a_pinned_process_that_exits_fails_every_later_check() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        target = inspect(child.pid, check_permissions=False)
        pin = identity.Pin(target)
        pin.check()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)
    # reaped: its pid may go to anyone now; the pidfd and the /proc descriptor know better
    with pytest.raises(ProcessNotFound, match="exited"):
        pin.check()
    pin.close()
