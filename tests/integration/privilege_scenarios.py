"""Issue 19's privilege and file-safety attacks, each run for real in a private mount namespace.

Every scenario runs in its own ``unshare -m`` namespace with a fresh tmpfs on /tmp (so nothing
planted here reaches the machine's /tmp, where other test runs keep their agents), with a real
second user (uid 65534) as the attacker and root running the CLI. Each returns
``{"tried": n, "held": m, "notes": [...]}``: ``tried`` attacks, ``held`` the ones the tool
withstood. ``tests/integration/test_privilege.py`` asserts tried == held per scenario;
``bench/probe_privilege.py`` prints the counts per class.

Run one by hand (as root): ``python tests/integration/privilege_scenarios.py mixed_uid_socket``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

from privilege_harness import (
    BEAT_DIR,
    HERE,
    REPO,
    SETEUID_PRELUDE,
    TMPFS_SIZE,
    USER,
    Beater,
    Tally,
    agent_socket_paths,
    as_user,
    attach_meets,
    beater,
    cli,
    fill_tmp,
    hello_answered,
    one_clean_line,
    root_only_dir,
    user_dir,
)


# -- scenarios ------------------------------------------------------------------------------------
def mixed_uid_socket() -> dict[str, Any]:
    """A root job that called seteuid(65534): after root attaches, uid 65534 must not reach the
    agent (nor a root process acting with effective uid 65534), root must, the job runs on."""
    t = Tally()
    with beater(SETEUID_PRELUDE) as target:
        before = target.uid_line()
        proc = cli(str(target.pid), "--cmd", "status", "--json", "--timeout", "30")
        t.check("root attaches to the seteuid'd job", proc.returncode == 0, proc.stderr[-400:])
        paths = agent_socket_paths(target.pid)
        reached = hello_answered(paths)
        t.check("uid 65534 gets no hello from the agent", not reached, f"answered at {reached}")
        reached = hello_answered(paths, fs_root=True)
        t.check("a client with effective uid 65534 (fsuid 0) gets no hello", not reached,
                f"answered at {reached}")
        logs = "".join(p.read_text(errors="replace") for p in Path("/tmp").glob(
            f"flight_profiler-*/agent-*-{target.pid}.log"))
        t.check("the agent itself refused uid 65534 (not only the file system)",
                f"refused a connection from uid {USER}" in logs, logs[-300:])
        private = Path(f"/tmp/flight_profiler-{USER}")
        left = sorted(p.name for p in private.iterdir()) if private.is_dir() else []
        t.check("nothing of the agent in uid 65534's directory", not [n for n in left if "agent" in n],
                f"{left}")
        proc = cli(str(target.pid), "--cmd", "status", "--json", "--timeout", "30")
        t.check("root reconnects", proc.returncode == 0 and '"pid"' in proc.stdout, proc.stderr[-300:])
        t.check("the job's uids are unchanged", target.uid_line() == before,
                f"{before} -> {target.uid_line()}")
        t.check("the job runs on", target.beating())
        cli(str(target.pid), "--cmd", "detach", "--timeout", "30")
    return t.result()


def planted_staged_code() -> dict[str, Any]:
    """uid 65534 plants the staged agent directory (agent-<hash>/pkg) before root attaches to
    (a) a seteuid'd root job and (b) that user's own job: the planted code must never run."""
    from flight_profiler.attach import staging

    t = Tally()
    proof = root_only_dir()
    name = staging.STAGED_PREFIX + staging._digest(staging._agent_files(), None)
    private = f"/tmp/flight_profiler-{USER}"
    planted = textwrap.dedent(f"""
        import os
        try:
            os.setresuid(0, 0, 0)
        except OSError:
            pass
        try:
            open(os.path.join({str(proof)!r}, "ran-as-" + str(os.geteuid())), "w").close()
        except OSError:
            pass
        open("/tmp/fp-planted-ran-" + str(os.getpid()), "w").close()
    """)
    plant = f"""
        import os
        os.makedirs({private!r}, 0o700, exist_ok=True)
        pkg = os.path.join({private!r}, {name!r}, "pkg")
        os.makedirs(pkg, exist_ok=True)
        open(os.path.join(pkg, "__init__.py"), "w").write({planted!r})
        open(os.path.join({private!r}, {name!r}, "in-use"), "w").close()
    """
    for label, prelude, user in (("seteuid'd root job", SETEUID_PRELUDE, None),
                                 ("uid 65534's own job", "", USER)):
        with beater(prelude, user=user) as target:
            done = as_user(plant)
            if done.returncode != 0:
                raise RuntimeError(done.stderr)
            proc = cli(str(target.pid), "--cmd", "status", "--json", "--timeout", "30")
            ran = [p.name for p in Path("/tmp").glob(f"fp-planted-ran-{target.pid}")]
            t.check(f"{label}: planted code did not run", not ran and not list(proof.iterdir()),
                    f"{ran} {list(proof.iterdir())}")
            t.check(f"{label}: root attached with its own copy", proc.returncode == 0,
                    proc.stderr[-300:])
            t.check(f"{label}: the job runs on", target.beating())
            cli(str(target.pid), "--cmd", "detach", "--timeout", "30")
        shutil.rmtree(private, ignore_errors=True)
    return t.result()


def tampered_copy() -> dict[str, Any]:
    """A staged copy whose content no longer matches its name is never loaded again."""
    t = Tally()
    with beater() as target:
        proc = cli(str(target.pid), "--cmd", "status", "--json", "--timeout", "30")
        t.check("first attach", proc.returncode == 0, proc.stderr[-300:])
        cli(str(target.pid), "--cmd", "detach", "--timeout", "30")
    copies = [p for p in Path("/tmp").glob("flight_profiler-*/agent-*") if (p / "pkg").is_dir()]
    t.check("a staged copy exists", bool(copies), f"{list(Path('/tmp').iterdir())}")
    for copy in copies:
        init = copy / "pkg" / "__init__.py"
        init.write_text(init.read_text() + "\nopen('/tmp/fp-tampered-ran', 'w').close()\n")
    with beater() as target:  # a fresh process: it imports the agent from the copy
        proc = cli(str(target.pid), "--cmd", "status", "--json", "--timeout", "30")
        t.check("second attach works", proc.returncode == 0, proc.stderr[-300:])
        t.check("the tampered copy was not loaded", not Path("/tmp/fp-tampered-ran").exists())
        t.check("the job runs on", target.beating())
        cli(str(target.pid), "--cmd", "detach", "--timeout", "30")
    return t.result()


SWAPPER = r"""
import ctypes, os, struct, sys
d, victim, stop = sys.argv[1], sys.argv[2], sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
libc.inotify_add_watch(fd, d.encode(), 0x100)  # IN_CREATE: swap the temp file the moment it appears
os.set_blocking(fd, True)
print("watching", flush=True)
while not os.path.exists(stop):
    data = os.read(fd, 65536)
    i = 0
    while i < len(data):
        _wd, _mask, _cookie, n = struct.unpack_from("iIII", data, i)
        name = data[i + 16:i + 16 + n].rstrip(b"\0").decode()
        i += 16 + n
        if name.endswith(".tmp"):
            try:
                os.unlink(os.path.join(d, name))
                os.symlink(victim, os.path.join(d, name))
            except OSError:
                pass
"""


def atomic_write_symlink_race(rounds: int = 100) -> dict[str, Any]:
    """Root writes a report into a directory uid 65534 can write while that user swaps the temp
    file for a symlink to root's 0600 file: the file's mode and content must not change."""
    from flight_profiler.atomic_files import write_text_atomic

    t = Tally()
    secret_dir = root_only_dir()
    victim = secret_dir / "secret"
    victim.write_text("root's secret\n")
    victim.chmod(0o600)
    shared = user_dir()
    shared.chmod(0o777)
    flags = Path(tempfile.mkdtemp(prefix="fp-flags-"))
    flags.chmod(0o755)
    stop = flags / "stop"
    swapper = subprocess.Popen(["setpriv", "--reuid", str(USER), "--regid", str(USER),
                                "--clear-groups", sys.executable, "-c", SWAPPER, str(shared),
                                str(victim), str(stop)], stdout=subprocess.PIPE)
    try:
        assert swapper.stdout is not None
        swapper.stdout.readline()
        for i in range(rounds):
            with contextlib.suppress(OSError):
                # a big report (2 MB): the write takes long enough for the swap to land
                write_text_atomic(str(shared / "report.md"), f"report {i}\n" + "x" * (2 << 20))
    finally:
        stop.touch()
        (shared / "wake").touch()  # an event, so that the swapper sees the stop file
        try:
            swapper.wait(30)
        except subprocess.TimeoutExpired:
            swapper.kill()
            swapper.wait(10)
    mode = stat.S_IMODE(victim.stat().st_mode)
    t.check("root's 0600 file keeps its mode", mode == 0o600, oct(mode))
    t.check("root's file keeps its content", victim.read_text() == "root's secret\n")
    return t.result()


def out_dir_not_chowned() -> dict[str, Any]:
    """``diagnose --out`` on root's existing empty directory for uid 65534's job: the directory
    stays root's; the refusal (the user cannot write there) is one line."""
    t = Tally()
    with beater(user=USER) as target:
        existing = root_only_dir()
        existing.chmod(0o755)
        proc = cli("diagnose", str(target.pid), "--out", str(existing), "--duration", "1",
                   "--timeout", "20", timeout=120)
        st = existing.stat()
        t.check("the existing directory is not handed to uid 65534", st.st_uid == 0,
                f"owner {st.st_uid}")
        t.check("refused in one line", one_clean_line(proc) or proc.returncode in (0, 12),
                (proc.stderr or proc.stdout)[-400:])
        t.check("the job runs on", target.beating())
        cli(str(target.pid), "--cmd", "detach", "--timeout", "30")
    return t.result()


def report_onto_device_node() -> dict[str, Any]:
    """``report -o`` onto a device node (a private tmpfs: never the machine's /dev) or a FIFO
    is refused in one line and the node is left as it was."""
    t = Tally()
    d = root_only_dir()
    trace = d / "trace.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"name": "aten::mm", "ph": "X", "ts": i * 10, "dur": 8, "pid": 1, "tid": 1, "cat": "cpu_op"}
        for i in range(100)]}))
    inputs = [trace]
    node = d / "null-like"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    fifo = d / "fifo"
    os.mkfifo(fifo)
    link = d / "link.md"
    os.symlink(node, link)
    for target, what, check in ((node, "a character device", stat.S_ISCHR),
                                (fifo, "a FIFO", stat.S_ISFIFO),
                                (link, "a symlink", stat.S_ISLNK)):
        proc = cli("report", str(inputs[0]), "-o", str(target), timeout=120)
        mode = os.lstat(target).st_mode
        t.check(f"-o {what}: left as it was", check(mode), oct(mode))
        t.check(f"-o {what}: one clear line", one_clean_line(proc), proc.stderr[-300:])
    t.check("the device behind the link is untouched", stat.S_ISCHR(os.lstat(node).st_mode))
    return t.result()


def artefact_swapped_for_symlink() -> dict[str, Any]:
    """Diagnosing uid 65534's job, an artefact the agent wrote is swapped for a symlink to a
    root-only file before the report reads it: no byte of that file reaches the report."""
    from flight_profiler.diagnose.model import DiagnoseOptions, DiagnoseResult, PhaseResult
    from flight_profiler.diagnose.outputs import build_report

    t = Tally()
    secret_dir = root_only_dir()
    secret = secret_dir / "secret.json"
    secret.write_text("ROOT-SECRET-0123456789abcdef and more\n")
    secret.chmod(0o600)
    out = user_dir()
    good = out / "census-before.json"
    good.write_text(json.dumps({"format": "flight_profiler.census", "version": 1}))
    os.chown(good, USER, USER)
    swapped = out / "census-after.json"
    as_user(f"import os; os.symlink({str(secret)!r}, {str(swapped)!r})")
    hard = out / "snapshot.pickle"
    try:
        os.link(secret, hard)  # protected_hardlinks stops the user; root's own link stands in
    except OSError:
        hard = None
    result = DiagnoseResult(DiagnoseOptions(pid=1, target=None, out_dir=str(out)))
    phase = PhaseResult("census-after", "Census", started=time.time())
    phase.files = [str(good), str(swapped)] + ([str(hard)] if hard else [])
    result.phases.append(phase)
    build_report(result)
    texts = ""
    for p in out.iterdir():
        if p.name.startswith("report") and p.is_file() and not p.is_symlink():
            texts += p.read_text(errors="replace")
    if result.report is not None:
        texts += json.dumps(result.report.to_dict(), default=str)
    t.check("no byte of the root-only file in the report", "ROOT-SECRET" not in texts
            and "0123456789" not in texts)
    t.check("the report was written", (out / "report.md").is_file(), str(list(out.iterdir())))
    return t.result()


# -- tracebacks ------------------------------------------------------------------------------------
def odd_names() -> dict[str, Any]:
    """A directory or non-directory at a staged or dead pid's file name in the private dir."""
    from flight_profiler.agent import protocol
    from flight_profiler.attach import staging

    t = Tally()
    private = Path(f"/tmp/flight_profiler-{USER}")
    staged = staging.STAGED_PREFIX + staging._digest(staging._agent_files(), None)
    dead = subprocess.Popen(["true"])
    dead.wait()
    ns = protocol.pid_namespace()
    cases: list[tuple[str, Callable[[Beater], str]]] = [
        ("a directory at a dead pid's socket name", lambda b: f"mkdir:agent-{ns}-{dead.pid}.sock"),
        ("a directory at a dead pid's log name", lambda b: f"mkdir:agent-{ns}-{dead.pid}.log"),
        ("a directory at a dead pid's lock name", lambda b: f"mkdir:.attach-{ns}-{dead.pid}.lock"),
        ("a directory at the target's lock name", lambda b: f"mkdir:.attach-{ns}-{b.pid}.lock"),
        ("a directory at the target's socket name", lambda b: f"mkdir:agent-{ns}-{b.pid}.sock"),
        ("a directory at the target's log name", lambda b: f"mkdir:agent-{ns}-{b.pid}.log"),
        ("a file at the staged copy's name", lambda b: f"file:{staged}"),
        ("a file at the staged package's name", lambda b: f"file:{staged}/pkg"),
        ("a symlink at the staged copy's name", lambda b: f"link:{staged}"),
        ("a file at the private directory's name", lambda b: "file:."),
    ]
    for what, make in cases:
        with beater(user=USER) as target:
            kind, _, name = make(target).partition(":")
            shutil.rmtree(private, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                private.unlink()
            code = ("import os\n"
                    + (f"open({str(private)!r}, 'w').close()\n" if name == "." else
                       f"os.makedirs({str(private)!r}, 0o700, exist_ok=True)\n"
                       f"p = os.path.join({str(private)!r}, {name!r})\n"
                       "os.makedirs(os.path.dirname(p), exist_ok=True)\n"
                       + {"mkdir": "os.mkdir(p)\n", "file": "open(p, 'w').close()\n",
                          "link": "os.symlink('/etc', p)\n"}[kind]))
            done = as_user(code)
            if done.returncode != 0:
                raise RuntimeError(done.stderr)
            attach_meets(t, what, target, ok_codes=(0,))
        shutil.rmtree(private, ignore_errors=True)
        with contextlib.suppress(OSError):
            private.unlink()
    return t.result()


def deep_staging_tree(depth: int = 1500) -> dict[str, Any]:
    """An abandoned .staging tree 1,500 levels deep: swept without a traceback, bounded."""
    t = Tally()
    private = f"/tmp/flight_profiler-{USER}"
    code = f"""
        import os
        os.makedirs({private!r}, 0o700, exist_ok=True)
        fd = os.open({private!r}, os.O_RDONLY)
        top = ".staging-0123456789abcdef"
        os.mkdir(top, dir_fd=fd)
        cur = os.open(top, os.O_RDONLY, dir_fd=fd)
        for i in range({depth}):
            os.mkdir("d", dir_fd=cur)
            nxt = os.open("d", os.O_RDONLY, dir_fd=cur)
            os.close(cur)
            cur = nxt
        open("/proc/self/fd/%d/f" % cur, "w").close()
        os.close(cur)
        os.utime(top, (1, 1), dir_fd=fd)
    """
    with beater(user=USER) as target:
        done = as_user(code)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        started = time.monotonic()
        attach_meets(t, f"a {depth}-deep .staging tree", target)
        seconds = time.monotonic() - started
        left = os.path.exists(os.path.join(private, ".staging-0123456789abcdef"))
        t.check("the abandoned tree is gone", not left)
        t.check("in bounded time", seconds < 60, f"{seconds:.1f}s")
    return t.result()


def full_tmp() -> dict[str, Any]:
    """/tmp full (a tiny private tmpfs filled up): one line, the job untouched."""
    t = Tally()
    with beater(user=USER) as target:
        fill_tmp()
        attach_meets(t, "/tmp is full", target)
    return t.result()


def readonly_tmp() -> dict[str, Any]:
    """/tmp read-only (a private read-only remount): one line, the job untouched."""
    t = Tally()
    with beater(user=USER) as target:
        subprocess.run(["mount", "--bind", "/tmp", "/tmp"], check=True)
        subprocess.run(["mount", "-o", "remount,ro,bind", "/tmp"], check=True)
        try:
            attach_meets(t, "/tmp is read-only", target)
        finally:
            subprocess.run(["umount", "/tmp"], check=True)
    return t.result()


def user_namespace_target() -> dict[str, Any]:
    """A job in an unprivileged user namespace (``unshare -Ur``, as a rootless container runs
    it, with or without a /tmp of its own): root's CLI refuses it at once in one line naming
    the cause, leaves nothing in /tmp (no directory under root's name owned by someone else),
    and still serves root's own job in a user namespace that maps root to itself."""
    t = Tally()
    own_tmp = ["sh", "-c", "mount -t tmpfs fp-ns-tmp /tmp && exec \"$0\" \"$@\""]
    as_65534 = ["setpriv", "--reuid", str(USER), "--regid", str(USER), "--clear-groups"]
    for label, wrap in (("uid 65534's job in its own user namespace", [*as_65534, "unshare", "-Ur"]),
                        ("uid 65534's rootless container with its own /tmp",
                         [*as_65534, "unshare", "-Urm", *own_tmp])):
        with beater(wrap=wrap) as target:
            started = time.monotonic()
            proc = cli(str(target.pid), "--cmd", "status", "--timeout", "30")
            seconds = time.monotonic() - started
            t.check(f"{label}: refused in one line naming the user namespace",
                    one_clean_line(proc) and "user namespace" in proc.stderr and seconds < 15,
                    f"rc {proc.returncode} after {seconds:.1f}s: {proc.stderr[-300:]}")
            squat = [str(p) for p in Path("/tmp").glob("flight_profiler-*")
                     if p.stat().st_uid != int(p.name.rsplit("-", 1)[1] if p.name[-1].isdigit() else 0)]
            t.check(f"{label}: nothing squats a directory name in /tmp", not squat, f"{squat}")
            t.check(f"{label}: the job runs on", target.beating())
    for label, wrap in (("root's job in a user namespace", ["unshare", "-Ur"]),
                        ("root's job in a user namespace with its own /tmp",
                         ["unshare", "-Urm", *own_tmp])):
        with beater(wrap=wrap) as target:
            proc = cli(str(target.pid), "--cmd", "status", "--timeout", "30")
            t.check(f"{label}: status works", proc.returncode == 0 and "Traceback" not in proc.stderr,
                    f"rc {proc.returncode}: {proc.stderr[-300:]}")
            t.check(f"{label}: the job runs on", target.beating())
            cli(str(target.pid), "--cmd", "detach", "--timeout", "30")
    return t.result()


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "mixed_uid_socket": mixed_uid_socket,
    "planted_staged_code": planted_staged_code,
    "tampered_copy": tampered_copy,
    "atomic_write_symlink_race": atomic_write_symlink_race,
    "out_dir_not_chowned": out_dir_not_chowned,
    "report_onto_device_node": report_onto_device_node,
    "artefact_swapped_for_symlink": artefact_swapped_for_symlink,
    "odd_names": odd_names,
    "deep_staging_tree": deep_staging_tree,
    "full_tmp": full_tmp,
    "readonly_tmp": readonly_tmp,
    "user_namespace_target": user_namespace_target,
}

# /tmp sizes per scenario (a full /tmp needs a small one that fills quickly)
_TMPFS = {"full_tmp": "4m,nr_inodes=64"}


def run_private(name: str, timeout: float = 600.0, src: str | None = None) -> dict[str, Any]:
    """Run scenario ``name`` in a new mount namespace with its own tmpfs on /tmp, against the
    flight_profiler in ``src`` (default: this checkout's; e.g. an older tree, to compare)."""
    src = os.path.abspath(src) if src else str(REPO / "src")
    size = _TMPFS.get(name, TMPFS_SIZE)
    script = (f"mount --make-rprivate / && mount -t tmpfs -o size={size},mode=1777 fp-private-tmp "
              f"/tmp && mount -t tmpfs -o size=16m,mode=1777 fp-private-beat {BEAT_DIR}"
              " && exec \"$0\" \"$@\"")
    env = dict(os.environ, FP_SCENARIO_SRC=src, PYTHONPATH=os.pathsep.join(
        [src, str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                           sys.executable, str(Path(__file__).resolve()), name],
                          capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"scenario {name} failed to run (rc {proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in SCENARIOS:
        print(f"usage: {argv[0]} {{{','.join(SCENARIOS)}}}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("run as root", file=sys.stderr)
        return 2
    # inside the private namespace: /tmp is ours alone
    result = SCENARIOS[argv[1]]()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.environ.get("FP_SCENARIO_SRC") or str(REPO / "src"))
    sys.exit(main(sys.argv))
