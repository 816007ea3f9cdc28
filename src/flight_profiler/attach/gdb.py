"""Inject with gdb without ever letting gdb wait for the GIL (docs/attach.md, injection design).

One gdb run, a few cast calls (stripped distro Pythons have no debug info, so every call needs
its type spelled out), each step in its own script file so that a failing step (a missing
symbol) is reported and the next step still runs:

1. probe the stopped main thread: ``$orig_rax`` (the syscall it is parked in, -1 when it runs
   user code) and ``PyGILState_Check()`` (does it hold the GIL);
2. ``mmap`` a private page and ``restore`` the payload (helper path, bootstrap texts) into it,
   so the target's malloc is never called from gdb (the main thread may be inside malloc);
3. parked in a syscall without the GIL: ``dlopen`` the helper and call ``fp_inject_start``:
   a new native thread takes the GIL itself, gdb returns at once;
4. otherwise (running Python, or holding the GIL; or no helper): queue a pending call running
   ``PyRun_SimpleString`` at the next eval-breaker check (3.12+: ``_PyEval_AddPendingCall`` on
   the main interpreter, which any thread running Python serves);
5. detach.

gdb runs in its own session (a terminal Ctrl-C never reaches it mid-call) and is never killed
while attached: an aborted inferior call kills the target later.
"""

from __future__ import annotations

import os
import re
import shutil
import time

from flight_profiler.attach.outcome import Outcome
from flight_profiler.errors import (
    AttachFailed,
    PermissionDenied,
    ProcessNotFound,
    already_traced,
    gdb_missing,
)

# payload layout (offsets in the mmap'ed page run)
HELPER_OFF = 0
SYMBOL_OFF = 4096
FOREIGN_OFF = 4352
_PAGE = 4096

_LINE = re.compile(r"^FP (\w+)=(-?\w+)\s*$")


GdbOutcome = Outcome  # the gdb recipe reports what the ptrace injector reports


def gdb_path() -> str | None:
    """The gdb to use: $FLIGHT_PROFILER_GDB if set, else the one on PATH (or None)."""
    named = os.environ.get("FLIGHT_PROFILER_GDB")
    if named:
        return named if os.access(named, os.X_OK) else None
    return shutil.which("gdb")


def find_gdb() -> str:
    path = gdb_path()
    if path is None:
        raise gdb_missing("--method gdb")
    return path


def build_payload(helper: str | None, foreign_text: str, pending_text: str) -> tuple[bytes, int]:
    """The bytes gdb restores into the mmap'ed region, and the offset of the pending text."""
    def cstr(text: str) -> bytes:
        data = text.encode("utf-8")
        if b"\0" in data:
            raise ValueError("payload text contains a NUL byte")
        return data + b"\0"

    head = cstr(helper or "").ljust(SYMBOL_OFF, b"\0")
    if len(head) > SYMBOL_OFF:
        raise ValueError("helper path too long")
    symbol = cstr("fp_inject_start").ljust(FOREIGN_OFF - SYMBOL_OFF, b"\0")
    foreign = cstr(foreign_text)
    pending_off = FOREIGN_OFF + len(foreign)
    return head + symbol + foreign + cstr(pending_text), pending_off


def _mapped_size(n: int) -> int:
    return (n + _PAGE - 1) // _PAGE * _PAGE


def build_scripts(
    payload_file: str, size: int, pending_off: int, version: tuple[int, int], use_helper: bool,
) -> list[str]:
    """gdb command files, one per step (an error in one does not stop the next)."""
    x86 = os.uname().machine in ("x86_64", "amd64")  # platform.machine(), unimported
    # Symbols only from the libraries the calls need: reading all of them costs seconds in a
    # torch process (libtorch_cpu alone has hundreds of thousands of symbols).
    symbols = [
        "sharedlibrary libpython",
        "sharedlibrary /libc[.]so",
        "sharedlibrary /libdl[.]so",
    ]
    init = [
        "set $fp_sys = -2", "set $fp_gil = -1", "set $fp_buf = 0", "set $fp_h = 0",
        "set $fp_done = 0", "set $fp_mode = 0",
    ]
    probe = []
    if x86:
        probe.append("set $fp_sys = $orig_rax")
    probe += [
        "printf \"FP sys=%ld\\n\", (long)$fp_sys",
        "set $fp_gil = ((int(*)(void))PyGILState_Check)()",
        "printf \"FP gil=%d\\n\", $fp_gil",
    ]
    mmap = [
        f"set $fp_buf = ((void*(*)(void*,unsigned long,int,int,int,long))mmap)(0, {size}, 3, 34, -1, 0)",
        "if (long)$fp_buf == -1",
        "  set $fp_buf = 0",
        "end",
        "printf \"FP buf=%lu\\n\", (unsigned long)$fp_buf",
        "if $fp_buf != 0",
        f"  restore {payload_file} binary $fp_buf",
        "  printf \"FP restored=1\\n\"",
        "end",
    ]
    helper_ok = "1" if use_helper else "0"
    helper = [
        f"if $fp_buf != 0 && {helper_ok} && $fp_sys >= 0 && $fp_gil == 0",
        "  set $fp_mode = 1",
        "  set $fp_h = ((void*(*)(char*,int))dlopen)((char*)$fp_buf, 2)",
        "  printf \"FP dlopen=%lu\\n\", (unsigned long)$fp_h",
        "end",
    ]
    # glibc < 2.34 keeps dlopen in libdl, which the target may not have loaded.
    helper_old_glibc = [
        "if $fp_mode == 1 && $fp_h == 0",
        "  set $fp_h = ((void*(*)(char*,int))__libc_dlopen_mode)((char*)$fp_buf, 0x80000002)",
        "  printf \"FP libc_dlopen=%lu\\n\", (unsigned long)$fp_h",
        "end",
    ]
    helper_start = [
        "if $fp_mode == 1 && $fp_h != 0",
        f"  set $fp_start = ((void*(*)(void*,char*))dlsym)($fp_h, (char*)$fp_buf + {SYMBOL_OFF})",
        "  if $fp_start != 0",
        f"    set $fp_rc = ((int(*)(char*))$fp_start)((char*)$fp_buf + {FOREIGN_OFF})",
        "    printf \"FP helper_rc=%d\\n\", $fp_rc",
        "    if $fp_rc == 0",
        "      set $fp_done = 1",
        "    end",
        "  end",
        "end",
    ]
    if version >= (3, 12):
        add = (
            "((int(*)(void*,void*,void*,int))_PyEval_AddPendingCall)"
            "(((void*(*)(void))PyInterpreterState_Main)(), (void*)PyRun_SimpleString, "
            f"(char*)$fp_buf + {pending_off}, 0)"
        )
    else:
        add = (
            "((int(*)(void*,void*))Py_AddPendingCall)"
            f"((void*)PyRun_SimpleString, (char*)$fp_buf + {pending_off})"
        )
    pending = [
        "if $fp_buf != 0 && $fp_done == 0",
        f"  set $fp_prc = {add}",
        "  printf \"FP pending_rc=%d\\n\", $fp_prc",
        "  if $fp_prc == 0",
        "    set $fp_done = 2",
        "  end",
        "end",
    ]
    # The helper copied the text: give the page back. (A pending call still needs it.)
    unmap = [
        "if $fp_done == 1",
        f"  set $fp_un = ((int(*)(void*,unsigned long))munmap)($fp_buf, {size})",
        "  printf \"FP munmap=%d\\n\", $fp_un",
        "end",
    ]
    final = ["printf \"FP done=%d\\n\", $fp_done", "detach", "quit"]
    return ["\n".join(s) + "\n" for s in
            (symbols, init, probe, mmap, helper, helper_old_glibc, helper_start, pending, unmap,
             final)]


def parse_output(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            values[m.group(1)] = m.group(2)
    return values


def classify_failure(text: str, pid: int) -> Exception | None:
    """gdb could not attach at all: the error a user can act on."""
    from flight_profiler.attach.process import in_container, permission_hint, ptrace_scope

    if "Operation not permitted" in text:
        try:
            with open(f"/proc/{pid}/status") as f:
                tracer = int(f.read().split("TracerPid:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            tracer = 0
        if tracer:
            return already_traced(pid, tracer)
        return PermissionDenied(f"the kernel refused to let gdb attach to process {pid}",
                                permission_hint(ptrace_scope(), in_container()))
    if "ptrace: No such process" in text or "No such process" in text:
        return ProcessNotFound(f"process {pid} exited during attach")
    return None


def inject(
    pid: int, version: tuple[int, int], helper: str | None, foreign_text: str,
    pending_text: str, gdb_timeout: float = 60.0, verbose: bool = False, readnever: bool = True,
) -> GdbOutcome:
    """Run the gdb recipe once. gdb is waited for, never killed (see module docstring)."""
    import subprocess  # here: only an injection by gdb pays for them (issue 23)
    import tempfile

    gdb = find_gdb()
    payload, pending_off = build_payload(helper, foreign_text, pending_text)
    work = tempfile.mkdtemp(prefix="flight_profiler-gdb-")
    try:
        payload_file = os.path.join(work, "payload.bin")
        with open(payload_file, "wb") as f:
            f.write(payload)
        files = []
        for i, text in enumerate(build_scripts(payload_file, _mapped_size(len(payload)),
                                               pending_off, version, helper is not None)):
            path = os.path.join(work, f"step{i}.gdb")
            with open(path, "w") as f:
                f.write(text)
            files.append(path)
        # -readnever: skip DWARF (a debug build's libpython has 20+ MB of it); every call is
        # cast, so ELF symbols are all we need. Cuts gdb's own time from ~0.35 s to ~0.12 s.
        # auto-solib-add off: see the `symbols` step (3-8 s -> 0.2 s on a torch process).
        argv = [gdb, "-nx", "-batch", *(["-readnever"] if readnever else []),
                "-iex", "set auto-load off", "-iex", "set auto-solib-add off",
                "-iex", "set debuginfod enabled off", "-iex", "set pagination off",
                "-iex", "set confirm off", "-iex", "set unwindonsignal on",
                "-iex", "set print thread-events off", "-p", str(pid)]
        for path in files:
            argv += ["-x", path]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["LC_ALL"] = "C"
        started = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=gdb_timeout)
            if readnever and proc.returncode != 0 and b"readnever" in out and b"FP " not in out:
                # gdb < 8.2 does not know -readnever; it stopped before attaching
                return inject(pid, version, helper, foreign_text, pending_text, gdb_timeout,
                              verbose, readnever=False)
        except subprocess.TimeoutExpired:
            # Never kill an attached gdb: it would leave the target to die later.
            raise AttachFailed(
                f"gdb (pid {proc.pid}) is still attached to {pid} after {gdb_timeout:.0f}s",
                "it was left running on purpose (killing it mid-call would crash the target); "
                "it detaches by itself when its call returns",
            ) from None
        elapsed = time.monotonic() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = out.decode("utf-8", "replace")
    values = parse_output(text)
    if "sys" not in values and "buf" not in values:
        err = classify_failure(text, pid)
        if err is not None:
            raise err
        last = [ln for ln in text.splitlines() if ln.strip()][-3:]
        raise AttachFailed(f"gdb could not attach to {pid}: {' | '.join(last) or 'no output'}",
                           "rerun with -v to see gdb's output")
    sys_nr = int(values["sys"]) if values.get("sys", "-2") != "-2" else None
    gil = {"1": True, "0": False}.get(values.get("gil", ""))
    done = values.get("done", "0")
    method = {"1": "thread", "2": "pending"}.get(done, "none")
    helper_error = None
    if helper is not None and values.get("dlopen") == "0" and values.get("libc_dlopen", "0") == "0":
        helper_error = "dlopen of the helper library failed in the target"
    outcome = GdbOutcome(method=method, syscall=sys_nr, holds_gil=gil, helper_error=helper_error,
                         elapsed=elapsed, values=values, output=text)
    if method == "none":
        if values.get("buf") == "0":
            raise AttachFailed(f"gdb could not map memory in process {pid}",
                               "rerun with -v to see gdb's output")
        if "gil" not in values:
            raise AttachFailed(
                f"process {pid} does not export the CPython C API (PyGILState_Check not found)",
                "is it an embedded or stripped interpreter? rerun with -v to see gdb's output",
            )
        raise AttachFailed(f"gdb could not schedule the agent in process {pid}",
                           "rerun with -v to see gdb's output")
    return outcome
