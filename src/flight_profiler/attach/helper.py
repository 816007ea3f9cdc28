"""Where the native helper library (helper/fp_inject.c) comes from.

1. built at install time by setup.py as ``flight_profiler/attach/_fp_inject*.so`` (optional: an
   install without a compiler still succeeds);
2. otherwise compiled on first use with ``cc`` into ~/.cache/flight_profiler (keyed by the
   source's hash, written atomically);
3. otherwise None: the injector then uses pending calls only, and says so.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(_HERE, "helper", "fp_inject.c")


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "flight_profiler")


def _source_hash() -> str:
    with open(SOURCE, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def prebuilt() -> str | None:
    hits = sorted(glob.glob(os.path.join(_HERE, "_fp_inject*.so")))
    return hits[0] if hits else None


def compile_helper(dest_dir: str | None = None) -> str:
    """Compile the helper with the system C compiler; raises OSError/CalledProcessError."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise FileNotFoundError("no C compiler (cc) found")
    dest_dir = dest_dir or cache_dir()
    os.makedirs(dest_dir, mode=0o700, exist_ok=True)
    dest = os.path.join(dest_dir, f"fp_inject-{_source_hash()}.so")
    if os.path.exists(dest):
        return dest
    fd, tmp = tempfile.mkstemp(prefix=".fp_inject-", suffix=".so", dir=dest_dir)
    os.close(fd)
    try:
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", tmp, SOURCE, "-pthread", "-ldl"],
            check=True, capture_output=True, timeout=60,
        )
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def find_helper() -> tuple[str | None, str]:
    """(path or None, how it was found or why there is none)."""
    built = prebuilt()
    if built is not None:
        return built, "built at install time"
    cached = os.path.join(cache_dir(), f"fp_inject-{_source_hash()}.so")
    if os.path.exists(cached):
        return cached, "compiled earlier into the cache"
    try:
        return compile_helper(), "compiled now with cc"
    except (OSError, subprocess.SubprocessError) as exc:
        return None, (f"no helper library ({exc}); only pending calls can be used, so a target "
                      "whose main thread sleeps in a system call may take long to answer")
