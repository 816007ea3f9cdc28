"""Target programs for the attach tests: one per state the main thread can be in.

Every target prints ``hb N`` heartbeats from the thread that does the work, stops when the file
named by argv[2] exists, then checks that ``threading.main_thread()`` is right (the agent may have
imported ``threading`` from a foreign thread) and exits 0.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

TARGET = r'''
import os
import sys
import time

STATE, STOP = sys.argv[1], sys.argv[2]
count = [0]
last = [time.monotonic()]


def say(line):
    os.write(1, (line + "\n").encode())  # one write: threads never interleave a line


def beat(force=False):
    now = time.monotonic()
    if force or now - last[0] >= 0.1:
        last[0] = now
        count[0] += 1
        say(f"hb {count[0]}")


def stopping():
    return os.path.exists(STOP)


def finish():
    import threading
    main = threading.main_thread()
    say(f"main_ok {main.ident == threading.get_ident()} "
        f"{getattr(main, 'native_id', os.getpid()) == os.getpid()}")
    sys.exit(0)


def fp_sleeping_main():
    say("READY")
    while not stopping():
        time.sleep(0.1)
        beat(True)
    finish()


def fp_busy_main():
    # Python code holding the GIL; the stop file is checked every 10 ms, not every few hundred
    # microseconds: a loop of short GIL-releasing system calls is another state (syscall_loop)
    say("READY")
    x = 0
    checked = time.monotonic()
    while True:
        for i in range(5000):
            x += i
        beat()
        now = time.monotonic()
        if now - checked >= 0.01:
            checked = now
            if stopping():
                break
    finish()


def fp_syscall_loop_main():
    # releases and retakes the GIL every few hundred microseconds (a stat() per 5000 additions)
    say("READY")
    x = 0
    while not stopping():
        for i in range(5000):
            x += i
        beat()
    finish()


def fp_join_worker():
    while not stopping():
        time.sleep(0.1)
        beat(True)


def fp_join_main():
    import threading
    t = threading.Thread(target=fp_join_worker, name="fp-worker")
    t.start()
    say("READY")
    t.join()
    finish()


def fp_accept_main():
    import socket
    import threading
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]

    def fp_accept_worker():
        fp_join_worker()
        socket.create_connection(("127.0.0.1", port)).close()  # wake accept()

    threading.Thread(target=fp_accept_worker, name="fp-worker").start()
    say("READY")
    conn, _ = server.accept()
    conn.close()
    finish()


def fp_asyncio_main():
    import asyncio

    async def fp_asyncio_task():
        say("READY")
        while not stopping():
            await asyncio.sleep(0.1)
            beat(True)

    asyncio.run(fp_asyncio_task())
    finish()


def fp_gil_hog_worker():
    # sum() over a range is one C call that keeps the GIL for its whole duration
    while not stopping():
        sum(range(5_000_000))
        beat(True)


def fp_gil_hog_main():
    import threading
    t = threading.Thread(target=fp_gil_hog_worker, name="fp-hog")
    t.start()
    say("READY")
    while not stopping():
        time.sleep(0.05)
    t.join()
    finish()


def fp_malloc_worker():
    # allocator calls in a tight loop, the GIL released around each one (ctypes does that):
    # the injector's own allocations in the main thread meet this thread inside malloc
    import ctypes
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    while not stopping():
        for _ in range(2000):
            libc.free(libc.malloc(4096))
        beat()


def fp_malloc_main():
    import threading
    t = threading.Thread(target=fp_malloc_worker, name="fp-malloc")
    t.start()
    say("READY")
    while not stopping():
        time.sleep(0.05)
    t.join()
    finish()


globals()["fp_" + STATE + "_main"]()
'''

# state -> (function expected in `stack`, thread that must show it)
STATES: dict[str, str] = {
    "sleeping": "fp_sleeping_main",
    "busy": "fp_busy_main",
    "syscall_loop": "fp_syscall_loop_main",
    "join": "fp_join_worker",
    "accept": "fp_accept_main",
    "asyncio": "fp_asyncio_main",  # suspended coroutines are not on any thread stack
    "gil_hog": "fp_gil_hog_worker",
    "malloc": "fp_malloc_worker",
}


def beats(out: str) -> int:
    """The last heartbeat number a target printed (0 before the first)."""
    found = re.findall(r"^hb (\d+)$", out, re.M)
    return int(found[-1]) if found else 0


def finish(t: Any, stop: Path) -> None:
    """The target beats on, stops when asked, exits 0 with its main thread intact."""
    start = beats(t.stdout)
    deadline = time.monotonic() + 20
    while beats(t.stdout) < start + 3:
        assert t.alive(), t.stderr[-2000:]
        assert time.monotonic() < deadline, "target stopped beating"
        time.sleep(0.05)
    stop.touch()
    assert t.popen.wait(30) == 0, t.stderr[-2000:]
    assert "main_ok True True" in t.stdout
    assert t.stderr == ""
