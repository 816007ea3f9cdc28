"""Issue 19's privilege and file-safety classes, attacked for real: root's CLI, a real second
uid (65534), a root job that dropped its effective uid with seteuid, device nodes and a full or
read-only /tmp, each scenario in a private mount namespace with its own tmpfs on /tmp (nothing
touches the machine's /tmp or /dev). The scenarios live in ``privilege_scenarios.py``; each
counts the attacks it tried and those the tool withstood, and every one must hold.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

from support import other_user_can_run_us

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not other_user_can_run_us(65534) or not shutil.which("unshare"),
                       reason="needs root, setpriv, unshare and a checkout uid 65534 can read"),
]


def _run(name: str) -> dict[str, Any]:
    import privilege_scenarios

    result = privilege_scenarios.run_private(name)
    notes = [str(n) for n in result["notes"]]
    assert result["tried"] == result["held"], "\n".join(notes)
    assert not [n for n in notes if n.startswith("FAILED")], "\n".join(notes)
    return result


# -- privilege: another user never gets root, nor root's files -----------------------------------
def test_a_seteuid_root_job_is_served_to_root_alone_from_roots_directory() -> None:
    # GIVEN a root job that called seteuid(65534) (real and saved uid 0), attached by root
    # THEN uid 65534 gets no hello, nor does a root process acting with effective uid 65534;
    # the agent itself refuses that uid; nothing of the agent is in 65534's directory; root
    # reconnects; the job's uids are unchanged and it runs on
    result = _run("mixed_uid_socket")
    assert result["tried"] == 8


def test_planted_staged_code_never_runs() -> None:
    # GIVEN uid 65534 planted agent-<hash>/pkg in its directory, for a seteuid'd root job and
    # for its own job; WHEN root attaches THEN the planted code never runs (as root or at all)
    result = _run("planted_staged_code")
    assert result["tried"] == 6


def test_a_staged_copy_that_does_not_hash_right_is_never_loaded() -> None:
    result = _run("tampered_copy")
    assert result["tried"] == 5


def test_the_atomic_writer_never_chmods_through_a_swapped_symlink() -> None:
    # GIVEN uid 65534 swapping every temp file root creates for a symlink to root's 0600 file
    # (inotify: the moment it appears); WHEN root writes 100 reports there THEN that file
    # keeps its mode and content
    _run("atomic_write_symlink_race")


def test_an_existing_out_directory_is_never_handed_to_the_targets_user() -> None:
    _run("out_dir_not_chowned")


def test_report_output_onto_a_device_node_fifo_or_symlink_is_refused() -> None:
    _run("report_onto_device_node")


def test_an_artefact_swapped_for_a_symlink_puts_no_byte_in_the_report() -> None:
    _run("artefact_swapped_for_symlink")


# -- tracebacks: one line, the job unharmed --------------------------------------------------------
def test_odd_things_at_the_private_directorys_names() -> None:
    result = _run("odd_names")
    assert result["tried"] == 20


def test_a_1500_deep_abandoned_staging_tree_is_swept() -> None:
    _run("deep_staging_tree")


def test_a_full_tmp_is_one_line() -> None:
    _run("full_tmp")


def test_a_read_only_tmp_is_one_line() -> None:
    _run("readonly_tmp")


@pytest.mark.skipif(not os.path.exists("/proc/self/ns/user"), reason="no user namespaces")
def test_a_job_in_an_unprivileged_user_namespace() -> None:
    _run("user_namespace_target")
