"""Issue 19's privilege rules, piece by piece: who an agent serves and where its files live
(from the process's real, effective, saved and file-system uids), the agent's own switch to
root's directory in a seteuid'd root job, checked copies of staged code, an atomic writer that
acts through descriptors only, bounded removal of any tree, an output directory never handed
over, artefacts read through descriptors."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flight_profiler.agent import protocol
from flight_profiler.atomic_files import NotRegularFile, write_text_atomic
from flight_profiler.attach import process, staging
from flight_profiler.attach.agent_dir import AgentDir
from flight_profiler.errors import PermissionDenied, UsageError, cannot_write
from support import REPO, other_user_can_run_us, temp_dir

USER = 65534
needs_root = pytest.mark.skipif(not other_user_can_run_us(USER),
                                reason="needs root, setpriv and a checkout uid 65534 can read")


# -- who an agent serves, and where its socket lives ---------------------------------------------
@pytest.mark.parametrize("uids, owner, peer, served", [
    ((1000, 1000, 1000, 1000), 1000, 1000, True),    # a user's job: that user
    ((1000, 1000, 1000, 1000), 1000, 0, True),       # and root
    ((1000, 1000, 1000, 1000), 1000, 1001, False),   # nobody else
    ((1000, 1000, 1000, 1000), 0, 1000, False),      # not dumpable: the kernel says root only
    ((0, 65534, 0, 65534), 0, 65534, False),         # a seteuid'd root job: not that user
    ((0, 65534, 0, 65534), 0, 0, True),              # root
    ((1000, 0, 0, 0), 0, 1000, False),               # a set-user-ID-root program: root only
    ((0, 0, 0, 0), 0, 0, True),
])
def test_an_agent_serves_whom_the_kernel_lets_ptrace_the_process(uids, owner, peer, served) -> None:
    assert protocol.serves(peer, uids, owner) is served


def test_a_mixed_uid_process_keeps_its_agent_in_roots_directory() -> None:
    assert protocol.home_uid((1000, 1000, 1000, 1000)) == 1000
    assert protocol.home_uid((0, 65534, 0, 65534)) == 0
    assert protocol.home_uid((0, 0, 0, 65534)) == 0  # even only a file-system uid apart
    assert protocol.home_uid((0, 0, 0, 0)) == 0


def test_a_mixed_uid_process_without_root_is_refused_in_one_line() -> None:
    status = process.parse_status("Uid:\t1000\t1001\t1001\t1001\n")
    with pytest.raises(PermissionDenied, match=r"mixed uids .* none of them is root"):
        process.check_mixed_uids(42, status)
    process.check_mixed_uids(42, process.parse_status("Uid:\t0\t65534\t0\t65534\n"))


@pytest.mark.parametrize("uid_map, uid, identity", [
    ("         0          0 4294967295\n", 0, True),      # the initial namespace
    ("         0      65534          1\n", 65534, False),  # `unshare -Ur` by uid 65534
    ("         0      65534          1\n", 0, False),      # root outside is not mapped
    ("         0          0          1\n", 0, True),       # `unshare -Ur` by root
    ("  1000  1000  10\n0 100000 1000\n", 1005, True),
    ("garbage\n", 0, False),
])
def test_user_namespace_maps(uid_map, uid, identity) -> None:
    assert process.identity_mapped(uid_map, uid) is identity


SETEUID_AGENT = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from flight_profiler.agent import credentials
import ctypes  # what the helper needs, loaded while the interpreter's files are readable
os.setegid(65534); os.seteuid(65534)
root_only = sys.argv[2]
def fsuid():
    with open("/proc/thread-self/status") as f:
        return int(next(l for l in f if l.startswith("Uid:")).split()[4])
tasks = lambda: len(os.listdir("/proc/self/task"))
before = tasks()
out = {"home": credentials.home_uid(), "serves_user": credentials.may_connect(65534),
       "serves_root": credentials.may_connect(0)}
try:
    open(os.path.join(root_only, "direct"), "w").close()
    out["direct"] = "written"
except PermissionError:
    out["direct"] = "refused"
def write():
    open(os.path.join(root_only, "via-home"), "w").close()
    return fsuid()
out["helper_fsuid"] = credentials.as_home(0, write)
out["caller_fsuid_after"] = fsuid()
deadline = time.monotonic() + 5
while tasks() > before and time.monotonic() < deadline:  # the helper thread ends with its fsuid
    time.sleep(0.01)
out["threads_left"] = tasks() - before
out["uids_after"] = list(os.getresuid())
print(json.dumps(out))
"""


@needs_root
def test_a_seteuid_root_job_reaches_roots_directory_only_from_a_thread_of_its_own() -> None:
    # GIVEN a root process that called seteuid(65534), and a directory only root may enter
    base = temp_dir("fp-seteuid-")
    base.chmod(0o755)
    root_only = base / "root-only"
    root_only.mkdir(mode=0o700)
    # WHEN its agent's helpers act as the directory's owner
    done = subprocess.run([sys.executable, "-c", SETEUID_AGENT, str(REPO / "src"), str(root_only)],
                          capture_output=True, text=True, timeout=60, check=True)
    out = json.loads(done.stdout)
    # THEN its socket belongs in root's directory and only root is served
    assert out["home"] == 0 and out["serves_root"] and not out["serves_user"]
    # the calling thread could not write there, the helper thread could, as root's fsuid
    assert out["direct"] == "refused" and out["helper_fsuid"] == 0
    assert (root_only / "via-home").stat().st_uid == 0
    # and the caller's credentials and the process's are exactly as before; no thread is left
    assert out["caller_fsuid_after"] == 65534 and out["uids_after"] == [0, 65534, 0]
    assert out["threads_left"] == 0


# -- staged code: verified by content ----------------------------------------------------------
@pytest.fixture
def copy(tmp_path) -> Iterator[tuple[AgentDir, staging.Manifest]]:
    (tmp_path / "tmp").mkdir(mode=0o1777)
    staging.stage(os.geteuid(), 4242, str(tmp_path), None, 77)
    with staging.code_dir(str(tmp_path)) as directory:
        yield directory, staging.manifest(None)


def test_a_fresh_copy_verifies(copy) -> None:
    directory, want = copy
    assert staging.verified(directory, want.name, want)


def test_a_fresh_copy_holds_this_interpreters_bytecode_checked_against_its_source(
        copy, monkeypatch) -> None:
    """Issue 23: a target that cannot write the copy's __pycache__ (root's) compiled every module
    of the agent on every attach. The copy holds this interpreter's .pyc of each module, made by
    the CLI (its own, 0644), checked-hash (PEP 552): the target checks it against the verified
    source beside it at each import."""
    import importlib.util

    directory, want = copy
    top = Path(directory.path) / want.name / "pkg"
    sources = sorted(top.rglob("*.py"))
    assert len(sources) == len(want.files) > 10
    tag = sys.implementation.cache_tag
    for source in sources:
        pyc = source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"
        st = pyc.lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
        assert stat.S_IMODE(st.st_mode) == 0o644
        data = pyc.read_bytes()
        assert data[:4] == importlib.util.MAGIC_NUMBER
        assert int.from_bytes(data[4:8], "little") == 0b11  # hash-based, checked
        assert data[8:16] == importlib.util.source_hash(source.read_bytes())
    assert staging.verified(directory, want.name, want)
    # a CLI of another version stages another copy, named apart, with its own bytecode
    monkeypatch.setattr(sys.implementation, "cache_tag", "cpython-399")
    assert staging.manifest(None).name != want.name


@pytest.mark.parametrize("spoil", ["edit", "missing", "group-writable", "symlink", "hard-link",
                                   "writable-pycache", "pyc-group-writable", "pyc-symlink",
                                   "pyc-hard-link"])
def test_a_spoiled_copy_does_not_verify_and_is_staged_again(copy, tmp_path, spoil) -> None:
    directory, want = copy
    top = Path(directory.path) / want.name
    server = top / "pkg" / "server.py"
    if spoil == "edit":
        server.write_text(server.read_text() + "\nimport os; os.system('id')\n")
    elif spoil == "missing":
        (top / "pkg" / "commands" / "stack.py").unlink()
    elif spoil == "group-writable":
        server.chmod(0o664)
    elif spoil == "symlink":
        server.unlink()
        server.symlink_to(tmp_path / "elsewhere.py")
    elif spoil == "hard-link":
        os.link(server, tmp_path / "another-name")
    elif spoil.startswith("pyc-"):  # the .pyc are checked without being read (issue 23)
        pyc = top / "pkg" / "__pycache__" / f"server.{sys.implementation.cache_tag}.pyc"
        if spoil == "pyc-group-writable":
            pyc.chmod(0o664)
        elif spoil == "pyc-symlink":
            pyc.unlink()
            pyc.symlink_to(tmp_path / "elsewhere.pyc")
        else:
            os.link(pyc, tmp_path / "another-pyc")
    else:  # a cache directory anyone may write: a planted .pyc would be loaded
        (top / "pkg" / "__pycache__").chmod(0o777)
    assert not staging.verified(directory, want.name, want)
    # WHEN staging again THEN the copy is replaced by a good one
    staging.stage(os.geteuid(), 4242, str(tmp_path), None, 77)
    assert staging.verified(directory, want.name, want)
    assert "os.system" not in server.read_text()


# -- bounded removal -----------------------------------------------------------------------------
def test_a_1500_deep_tree_is_removed_without_recursion(tmp_path) -> None:
    (tmp_path / "tmp").mkdir()
    with AgentDir.open(os.geteuid(), str(tmp_path)) as directory:
        os.mkdir(".staging-deep", dir_fd=directory.fd)
        cur = os.open(".staging-deep", os.O_RDONLY, dir_fd=directory.fd)
        for _ in range(1500):
            os.mkdir("d", dir_fd=cur)
            nxt = os.open("d", os.O_RDONLY, dir_fd=cur)
            os.close(cur)
            cur = nxt
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=cur))
        os.symlink("/etc", "link", dir_fd=cur)  # never followed
        os.close(cur)
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(200)  # well below the depth: recursion would fail loudly
        try:
            staging.remove_tree(directory, ".staging-deep")
        finally:
            sys.setrecursionlimit(limit)
        assert os.listdir(directory.fd) == []
    assert os.path.isdir("/etc")


# -- the atomic writer ---------------------------------------------------------------------------
def test_an_existing_files_permissions_are_kept(tmp_path) -> None:
    # root's 0600 report stays 0600 when written again (open(path, "w") would keep it too)
    report = tmp_path / "report.md"
    report.write_text("old")
    report.chmod(0o600)
    write_text_atomic(str(report), "new")
    assert stat.S_IMODE(report.stat().st_mode) == 0o600 and report.read_text() == "new"


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_a_non_regular_destination_is_refused_and_left_as_it_was(tmp_path, kind) -> None:
    dest = tmp_path / "out.md"
    if kind == "fifo":
        os.mkfifo(dest)
    elif kind == "directory":
        dest.mkdir()
    else:
        (tmp_path / "real.md").write_text("kept")
        dest.symlink_to(tmp_path / "real.md")
    before = os.lstat(dest).st_mode
    with pytest.raises(NotRegularFile) as caught:
        write_text_atomic(str(dest), "report")
    assert os.lstat(dest).st_mode == before
    assert sorted(os.listdir(tmp_path)) == sorted(["out.md"] + (["real.md"] if kind == "symlink" else []))
    err = cannot_write(str(dest), caught.value)
    assert "not a regular file" in err.message and "\n" not in err.message
    assert err.exit_code == 1 and "-o" in err.hint


# -- diagnose's output directory and artefacts ---------------------------------------------------
@pytest.fixture
def users_process() -> Iterator[int]:
    if not other_user_can_run_us(USER):
        pytest.skip("needs root, setpriv and a checkout uid 65534 can read")
    proc = subprocess.Popen(["setpriv", "--reuid", str(USER), "--regid", str(USER),
                             "--clear-groups", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while protocol.process_uids(proc.pid)[1] != USER:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_an_existing_out_directory_is_never_handed_over(tmp_path, users_process) -> None:
    from flight_profiler.diagnose.outputs import prepare_out_dir

    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    with pytest.raises(UsageError, match="cannot write its artefacts"):
        prepare_out_dir(str(existing), users_process)
    assert existing.stat().st_uid == 0
    # one the user may write is used as it is
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    prepare_out_dir(str(shared), users_process)
    assert shared.stat().st_uid == 0
    # a directory made for the job is the user's, so that its agent can write in it
    made = tmp_path / "made"
    prepare_out_dir(str(made), users_process)
    assert made.stat().st_uid == USER


@needs_root
def test_artefacts_are_read_through_descriptors_in_a_users_directory() -> None:
    from flight_profiler.diagnose.evidence import analyze_artefacts

    tmp_path = temp_dir("fp-artefacts-")  # uid 65534 must reach its directory in it
    tmp_path.chmod(0o755)
    secret = tmp_path / "secret.json"
    secret.write_text('{"traceEvents": [{"name": "ROOT-ONLY-TOKEN", "ph": "X", "ts": 1, '
                      '"dur": 1, "pid": 1, "tid": 1}]}')
    secret.chmod(0o600)
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, USER, USER)
    good = out / "census-before.json"
    good.write_text(json.dumps({"format": "flight_profiler.census", "version": 1}))
    os.chown(good, USER, USER)
    subprocess.run(["setpriv", "--reuid", str(USER), "--regid", str(USER), "--clear-groups",
                    sys.executable, "-c",
                    f"import os; os.symlink({str(secret)!r}, {str(out / 'profile.json')!r})"],
                   check=True, timeout=60)
    report = analyze_artefacts([str(good), str(out / "profile.json")], {USER})
    text = json.dumps(report.to_dict())
    assert "ROOT-ONLY-TOKEN" not in text
    by_path = {i.path: i for i in report.inputs}
    assert set(by_path) == {str(good), str(out / "profile.json")}  # their own paths, always
    assert "symbolic link" in (by_path[str(out / "profile.json")].error or "")
    assert sorted(os.listdir(out)) == ["census-before.json", "profile.json"]  # nothing left

