"""The target user's private directory seen by a root CLI: every name in it is that user's to
swap, so root must act only through descriptors it opened without following links.

Attacks run as a real second uid (65534, via setpriv) on a fake target root (``ROOT/tmp``), so
nothing of the machine's /tmp is touched.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flight_profiler.agent import protocol
from flight_profiler.attach import cleanup, staging
from flight_profiler.attach.agent_dir import AgentDir
from flight_profiler.errors import AttachTimeout, PermissionDenied
from support import other_user_can_run_us

USER = 65534
needs_root = pytest.mark.skipif(not other_user_can_run_us(USER),
                                reason="needs root, setpriv, and a checkout uid 65534 can read "
                                       "(not under a root-only directory) to act as a second user")


def as_user(code: str) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` as uid 65534: the owner of the target's directory."""
    return subprocess.run(
        ["setpriv", "--reuid", str(USER), "--regid", str(USER), "--clear-groups",
         sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, cwd="/", check=True,
    )


@pytest.fixture
def fake_root() -> Iterator[Path]:
    """A directory standing for the target's filesystem root, with a sticky world-writable tmp."""
    base = Path(tempfile.mkdtemp(prefix="fp-root-"))
    base.chmod(0o755)
    (base / "tmp").mkdir()
    (base / "tmp").chmod(0o1777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def victim(fake_root: Path) -> Path:
    """A root-only directory, as /etc or /root would be: nothing may appear in it or change."""
    path = fake_root / "victim"
    path.mkdir(mode=0o700)
    return path


def _untouched(victim: Path) -> None:
    st = victim.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
    assert list(victim.iterdir()) == []


@needs_root
def test_private_dir_is_created_for_the_user_and_a_planted_symlink_refused(fake_root, victim) -> None:
    with AgentDir.open(USER, str(fake_root)) as directory:
        st = os.fstat(directory.fd)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (USER, 0o700)
        assert directory.inner == f"/tmp/flight_profiler-{USER}"
    shutil.rmtree(fake_root / "tmp" / f"flight_profiler-{USER}")
    # GIVEN the user planted a symlink where the directory goes
    as_user(f"import os; os.symlink({str(victim)!r}, {str(fake_root / 'tmp' / f'flight_profiler-{USER}')!r})")
    # WHEN root opens it THEN it refuses with the fix, and the victim keeps its owner
    with pytest.raises(PermissionDenied, match="symlink"):
        AgentDir.open(USER, str(fake_root))
    _untouched(victim)


@needs_root
def test_symlink_planted_at_the_attach_lock_creates_nothing(fake_root, victim) -> None:
    with AgentDir.open(USER, str(fake_root)) as directory:
        lock = protocol.lock_name(4242, 77)
        # GIVEN the user pointed the lock's name at a file root would create (think /etc/nologin)
        as_user(f"import os; os.symlink({str(victim / 'nologin')!r}, "
                f"{os.path.join(directory.path, lock)!r})")
        # WHEN root takes the attach lock THEN it refuses and creates nothing
        with pytest.raises(PermissionDenied, match="not a regular file"), \
                directory.lock(lock, time.monotonic() + 1, "process 4242"):
            pass
        _untouched(victim)
        # a hard link to one of root's files is refused too (would be opened read-write)
        secret = fake_root / "secret"
        secret.write_text("root only")
        os.link(secret, os.path.join(directory.path, ".attach-1.lock"))
        with pytest.raises(PermissionDenied, match="hard link"), \
                directory.lock(".attach-1.lock", time.monotonic() + 1, "process 1"):
            pass
        assert secret.read_text() == "root only"


@needs_root
def test_attach_lock_excludes_and_leaves_no_file(fake_root) -> None:
    with AgentDir.open(USER, str(fake_root)) as directory:
        lock = protocol.lock_name(4242, 77)
        with directory.lock(lock, time.monotonic() + 1, "process 4242"):
            assert os.path.exists(os.path.join(directory.path, lock))
            with AgentDir.open(USER, str(fake_root)) as other, \
                    pytest.raises(AttachTimeout, match="another flight_profiler"), \
                    other.lock(lock, time.monotonic() + 0.2, "process 4242"):  # a second CLI
                pass
        assert not os.path.exists(os.path.join(directory.path, lock))


SWAPPER = r"""
import os, sys, time
private, victim, mode = sys.argv[1], sys.argv[2], sys.argv[3]
deadline = time.time() + 20
while time.time() < deadline:
    for name in os.listdir(private):
        if name.startswith(".staging-"):
            try:
                os.rename(os.path.join(private, name), os.path.join(private, "moved-" + name))
                os.symlink(victim, os.path.join(private, name))
            except PermissionError:
                print("refused", name, flush=True)
                sys.exit(0)
            except OSError:
                continue
            print("swapped", name, flush=True)
            sys.exit(0)
"""


@needs_root
@pytest.mark.parametrize("when", ["before_open", "while_copying"])
def test_staging_directory_swapped_for_a_symlink_never_reaches_the_victim(
        fake_root, victim, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    # GIVEN the user tries to swap root's fresh .staging-* directory for a symlink to a
    # root-only directory, at the two moments the race used (deterministically: the
    # swap runs, as uid 65534, from inside the staging steps)
    with AgentDir.open(USER, str(fake_root)) as directory:
        private = directory.path
    with AgentDir.open_code_dir(str(fake_root)) as directory:
        code = directory.path

    def swap() -> None:
        done = as_user(SWAPPER.replace("sys.argv[1], sys.argv[2], sys.argv[3]",
                                       f"{code!r}, {str(victim)!r}, {when!r}"))
        # root stages in its own directory: the user cannot rename anything there
        assert done.stdout.startswith("refused"), done

    if when == "before_open":
        real_open = staging._open_new_dir

        def open_after_swap(agent_dir: AgentDir, tmp: str) -> int:
            swap()
            return real_open(agent_dir, tmp)

        monkeypatch.setattr(staging, "_open_new_dir", open_after_swap)
    else:
        real_build = staging._build

        def build_during_swap(top_fd: int, *args: object) -> None:
            swap()
            real_build(top_fd, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(staging, "_build", build_during_swap)
    # WHEN root stages the agent
    try:
        staged = staging.stage(USER, 4242, str(fake_root), None, 77)
    except PermissionDenied as exc:
        assert "replaced" in exc.message
        staged = None
    # THEN nothing was written into the victim, nor chowned to the user
    _untouched(victim)
    # and nothing was staged where the user writes; the copy is root's own, in root's directory
    assert not [e for e in os.listdir(private) if e.startswith((".staging", staging.STAGED_PREFIX))]
    assert staged is not None
    st = os.lstat(os.path.join(code, staged.name))
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0
    assert os.path.isfile(os.path.join(code, staged.name, "pkg", "server.py"))


@needs_root
def test_roots_staged_copy_is_roots_and_only_readable_by_others(fake_root) -> None:
    # GIVEN root staging the agent for uid 65534's job
    staged = staging.stage(USER, 4242, str(fake_root), None, 77)
    outer = fake_root / "tmp" / "flight_profiler-code" / staged.name
    assert staged.pkg == f"/tmp/flight_profiler-code/{staged.name}/pkg"
    assert staged.log == f"/tmp/flight_profiler-{USER}/agent-77-4242.log"
    assert staged.sock == "agent-77-4242.sock"
    # THEN every directory and file of the copy (and the directory above) is root's, and no
    # one else may write it
    for path in [outer.parent, outer, *outer.rglob("*")]:
        st = path.lstat()
        assert st.st_uid == 0 and not stat.S_IMODE(st.st_mode) & 0o022, path
    # the user (the target) can read its agent, and cannot change or add a byte of it
    as_user(f"open({str(outer / 'pkg' / 'server.py')!r}).read()")
    done = subprocess.run(
        ["setpriv", "--reuid", str(USER), "--regid", str(USER), "--clear-groups",
         sys.executable, "-c",
         "import os, sys\n"
         "for p in sys.argv[1:]:\n"
         "    try:\n"
         "        open(p, 'a').close(); print('wrote', p)\n"
         "    except PermissionError:\n"
         "        pass\n",
         str(outer / "pkg" / "server.py"), str(outer / "pkg" / "evil.py"),
         str(outer / "pkg" / "__pycache__" / "server.cpython-311.pyc"), str(outer / "x")],
        capture_output=True, text=True, timeout=60, cwd="/", check=True)
    assert done.stdout == "", done.stdout
    # staging again reuses the copy (one per version), after checking it
    assert staging.stage(USER, 4243, str(fake_root), None, 77).name == staged.name
    assert len([p for p in outer.parent.iterdir() if p.name.startswith("agent-")]) == 1


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_sweep_removes_what_dead_processes_left_and_keeps_the_living() -> None:
    # a short root: the socket path bound below must fit AF_UNIX's 108 bytes
    root = Path(tempfile.mkdtemp(prefix="fp-sw-"))
    (root / "tmp").mkdir()
    uid = os.geteuid()
    ns = protocol.pid_namespace()
    try:
        with AgentDir.open(uid, str(root)) as directory:
            private = Path(directory.path)
            dead, alive = _dead_pid(), os.getpid()
            names = {pid: [protocol.socket_name(pid, ns), protocol.log_name(pid, ns),
                           protocol.lock_name(pid, ns), f"agent-{pid}.log", f".attach-{pid}.lock"]
                     for pid in (dead, alive)}
            for pid_names in names.values():
                for name in pid_names:
                    (private / name).write_text("")
            # a socket of another pid namespace whose agent is gone: connect is refused
            import socket

            foreign = protocol.socket_name(1, ns + 1)
            s = socket.socket(socket.AF_UNIX)
            s.bind(str(private / foreign))
            s.close()  # bound, never listening: ECONNREFUSED
            (private / protocol.log_name(1, ns + 1)).write_text("")
            removed = cleanup.sweep(directory)
            left = set(os.listdir(private))
            assert set(names[dead]) <= set(removed) and not set(names[dead]) & left
            assert set(names[alive]) <= left
            assert foreign not in left and protocol.log_name(1, ns + 1) not in left
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_old_staged_copies_go_unless_an_agent_holds_them(tmp_path, monkeypatch) -> None:
    import fcntl

    (tmp_path / "tmp").mkdir()
    uid = os.geteuid()
    with staging.code_dir(str(tmp_path)) as directory:  # where this CLI stages
        private = Path(directory.path)
        for name in ("agent-0000000000000001", "agent-0000000000000002"):
            (private / name / "pkg").mkdir(parents=True)
            (private / name / staging.IN_USE).write_text("")
        held = os.open(private / "agent-0000000000000002" / staging.IN_USE, os.O_RDONLY)
        fcntl.flock(held, fcntl.LOCK_SH)  # what a running agent does
        try:
            monkeypatch.setattr(staging, "SETTLE_SECONDS", -1.0)
            staged = staging.stage(uid, 4242, str(tmp_path), None, 77)
            left = set(os.listdir(private))
            assert staged.name in left and "agent-0000000000000002" in left
            assert "agent-0000000000000001" not in left
        finally:
            os.close(held)


@needs_root
def test_another_user_never_creates_or_enters_the_targets_directory(fake_root) -> None:
    # GIVEN no directory yet for uid 0's target; WHEN uid 65534 opens it THEN it is refused
    # without creating one (a directory of 65534's under root's name would lock root out)
    code = ("from flight_profiler.attach.agent_dir import AgentDir\n"
            "from flight_profiler.errors import PermissionDenied\n"
            "try:\n"
            f"    AgentDir.open(0, {str(fake_root)!r})\n"
            "except PermissionDenied as exc:\n"
            "    print('refused', exc.message)\n")
    src = str(Path(__file__).resolve().parents[2] / "src")
    done = as_user(f"import sys; sys.path.insert(0, {src!r})\n" + code)
    assert done.stdout.startswith("refused") and "not yours" in done.stdout, done
    assert not (fake_root / "tmp" / "flight_profiler-0").exists()
    # and root's existing one (0700) is refused the same way
    AgentDir.open(0, str(fake_root)).close()
    done = as_user(f"import sys; sys.path.insert(0, {src!r})\n" + code)
    assert done.stdout.startswith("refused"), done


def test_a_containers_symlinked_tmp_is_refused(tmp_path) -> None:
    # GIVEN a target's root whose /tmp is a symlink: absolute, it would resolve against OUR root
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "tmp").symlink_to(outside)
    # WHEN the CLI opens the target's private directory THEN it refuses and creates nothing
    with pytest.raises(PermissionDenied, match="not a plain directory"):
        AgentDir.open(os.geteuid(), str(root))
    assert list(outside.iterdir()) == []


RACER = r"""
import os, sys, time
private, victim, flags = sys.argv[1], sys.argv[2], sys.argv[3]
os.write(1, b"racing\n")
seen = set()
deadline = time.time() + 60
while time.time() < deadline and not os.path.exists(os.path.join(flags, "stop")):
    try:
        names = os.listdir(private)
    except OSError:
        continue
    for name in names:
        if name.startswith(".staging-") and name not in seen:
            seen.add(name)
            try:
                os.rename(os.path.join(private, name), os.path.join(private, "moved" + name))
                os.symlink(victim, os.path.join(private, name))
            except OSError:
                pass
"""


@needs_root
def test_staging_against_a_live_racer_of_the_second_uid(fake_root, victim) -> None:
    # GIVEN uid 65534 racing every .staging-* directory root creates (rename it away, put a
    # symlink to a root-only directory in its place), as the attack did
    with AgentDir.open(USER, str(fake_root)) as directory:
        private = directory.path
    with AgentDir.open_code_dir(str(fake_root)) as directory:
        code = directory.path
    racer = subprocess.Popen(
        ["setpriv", "--reuid", str(USER), "--regid", str(USER), "--clear-groups",
         sys.executable, "-c", RACER, code, str(victim), private],
        stdout=subprocess.PIPE, cwd="/")
    try:
        assert racer.stdout is not None and racer.stdout.readline() == b"racing\n"
        outcomes = []
        for _ in range(12):
            # WHEN root stages (a fresh copy each time)
            with AgentDir.open_code_dir(str(fake_root)) as directory:
                for entry in os.listdir(directory.fd):
                    if entry.startswith(staging.STAGED_PREFIX):
                        staging.remove_tree(directory, entry)
            try:
                staging.stage(USER, 4242, str(fake_root), None, 77)
                outcomes.append("staged")
            except PermissionDenied:
                outcomes.append("refused")
            # THEN the victim is never written to nor handed to the user
            _untouched(victim)
        assert set(outcomes) <= {"staged", "refused"}
    finally:
        as_user(f"open({os.path.join(private, 'stop')!r}, 'w').close()")
        racer.wait(30)
