"""The inputs under a directory: a bounded walk that follows links at most once.

``glob("DIR/**/*.json", recursive=True)`` follows directory symlinks without remembering where
it has been: two links to the directory itself make it walk 2^depth paths (issue 19: `report
DIR` hung). Here every directory is entered once, known by (device, inode), whatever path or
link leads to it; directories deeper than ``MAX_DEPTH`` levels are not entered, and the walk
stops after ``MAX_ENTRIES`` entries or ``MAX_INPUTS`` inputs, saying which cap it met.

Which files count, as before: names ending in ``.json``, ``.json.gz``, ``.pickle`` or ``.pkl``
(traces, censuses, snapshots, stacks, grads; read by content), hidden ones (``.name``) and
hidden directories left out, as glob does.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

SUFFIXES = (".json", ".json.gz", ".pickle", ".pkl")
# A TensorBoard log directory is 4 levels deep (logdir/plugins/profile/run/file), one gathered
# from many nodes a few more; a diagnose directory holds ~20 files.
MAX_DEPTH = 32
MAX_ENTRIES = 200_000
MAX_INPUTS = 10_000


def walk_inputs(top: str) -> tuple[list[str], str | None]:
    """The input files under ``top`` (sorted), and why the walk stopped early (None: it did not)."""
    found: list[str] = []
    seen: set[tuple[int, int]] = set()
    try:
        st = os.stat(top)
    except OSError:
        return [], None
    seen.add((st.st_dev, st.st_ino))
    pending = [(top, 0)]
    entries = 0
    stopped: str | None = None
    too_deep = False
    while pending and stopped is None:
        directory, depth = pending.pop()
        try:
            with os.scandir(directory) as it:
                listing = list(_bounded(it, MAX_ENTRIES - entries + 1))
        except OSError:
            continue  # unreadable: the others still count
        entries += len(listing)
        if entries > MAX_ENTRIES:
            stopped = f"more than {MAX_ENTRIES:,} entries under it"
            listing = listing[: len(listing) - (entries - MAX_ENTRIES)]
        for entry in listing:
            if entry.name.startswith("."):
                continue
            try:
                # Follows a link (stat, not lstat): a link to a run directory is an input
                # too; the (device, inode) check below enters each directory once.
                est = entry.stat()
            except OSError:
                continue  # a dangling link, or a file gone since the listing
            if stat.S_ISDIR(est.st_mode):
                key = (est.st_dev, est.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                if depth + 1 >= MAX_DEPTH:
                    too_deep = True  # not entered; the walk goes on elsewhere
                    continue
                pending.append((entry.path, depth + 1))
            elif entry.name.endswith(SUFFIXES):
                found.append(entry.path)
                if len(found) >= MAX_INPUTS:
                    stopped = f"more than {MAX_INPUTS:,} input files under it"
                    break
    if stopped:
        stopped = (f"{stopped}: only the first inputs found were read; pass the run's own "
                   "directory or the files")
    elif too_deep:
        stopped = (f"directories nested more than {MAX_DEPTH} deep under it were not looked "
                   "into; pass the run's own directory or the files")
    return sorted(found), stopped


def _bounded(it: Iterator[os.DirEntry[str]], n: int) -> list[os.DirEntry[str]]:
    out = []
    for entry in it:
        out.append(entry)
        if len(out) >= n:
            break
    return out
