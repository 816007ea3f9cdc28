"""One node's output directory carried over a launcher's stdout (``job srun`` without a shared
filesystem), and unpacked without trusting it.

Framing: srun (or ssh, kubectl exec) carries a byte stream that other things may write into too
(a prolog's message, a library's warning on the node's stdout), so the archive is a tar.gz in
base64 lines between two marker lines; the end line carries its decoded length and SHA-256:

    FP-ARCHIVE 1 <node>
    <base64, 76 characters a line>
    FP-END <bytes> <sha256> <the node's diagnose exit code>

Lines outside the markers are kept apart as the node's other output. A stream cut short (the
node died, srun was killed at --timeout) has no end line or a wrong digest, and is refused.

Unpacking: the archive comes from a process on another machine, so each member is checked
before anything is written: regular files and directories only, relative names without ``..``,
at most ``MAX_MEMBERS`` members and ``MAX_BYTES`` in all. A hard link is accepted only to a
regular file this same archive already unpacked (diagnose's ``traces/`` links each rank's
profile: packing them as copies would double the biggest files); a symbolic link, a device, a
FIFO is refused. Files are created with O_EXCL | O_NOFOLLOW in a directory made here.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO

HEADER = "FP-ARCHIVE 1"
END = "FP-END"
LINE_CHARS = 76
MAX_MEMBERS = 100_000
MAX_BYTES = 64 << 30  # what one node's diagnose may write (traces, snapshots): far above it
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ArchiveError(Exception):
    """The stream or the archive is truncated, corrupt or unsafe (the message says which)."""


def safe_node_name(name: str) -> str:
    """A node name used as a directory name: a host name, nothing a path could be made of."""
    if not _NODE_NAME.match(name) or name in (".", ".."):
        raise ArchiveError(f"node name {name!r} is not a host name")
    return name


# -- packing (on the node) ----------------------------------------------------------------------

def pack(directory: str, out: IO[str], node: str, exit_code: int) -> None:
    """Write ``directory`` as one framed archive on ``out`` (text, line by line)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        # Relative names; add() stores a second name of a file as a hard link, as wanted.
        for root, dirs, files in os.walk(directory, followlinks=False):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(root, name)
                if os.path.islink(path):
                    continue  # nothing diagnose writes; never carried
                try:
                    tar.add(path, arcname=os.path.relpath(path, directory), recursive=False)
                except FileNotFoundError:
                    # an interrupted diagnosis: a rank's agent still finishing a temporary file
                    # (renamed or removed by now); the finished files are what is carried
                    continue
    data = buf.getvalue()
    out.write(f"{HEADER} {safe_node_name(node)}\n")
    text = base64.b64encode(data).decode("ascii")
    for i in range(0, len(text), LINE_CHARS):
        out.write(text[i:i + LINE_CHARS] + "\n")
    out.write(f"{END} {len(data)} {hashlib.sha256(data).hexdigest()} {exit_code}\n")
    out.flush()


# -- reading the stream (on the submitting host) ------------------------------------------------

@dataclass
class Received:
    """What one node's stdout held: the archive (verified) and everything else it printed."""

    node: str | None = None
    sink: IO[bytes] | None = None  # the archive's bytes, verified, rewound
    exit_code: int | None = None
    other: list[str] = field(default_factory=list)

    @property
    def archive(self) -> bytes | None:
        if self.sink is None:
            return None
        data = self.sink.read()
        self.sink.seek(0)
        return data


def read_stream(lines: Iterable[str], max_bytes: int = MAX_BYTES,
                sink: IO[bytes] | None = None) -> Received:
    """Find the one framed archive in ``lines``, its bytes written to ``sink`` (a temporary file
    for a real node: memory stays bounded; in memory by default); raises ArchiveError when it is
    cut short or corrupt."""
    got = Received()
    out = sink if sink is not None else io.BytesIO()
    digest = hashlib.sha256()
    size = 0
    inside = False
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not inside:
            if line.startswith(HEADER + " ") and got.sink is None:
                got.node = safe_node_name(line[len(HEADER) + 1:].strip())
                inside = True
            elif len(got.other) < 1000:
                got.other.append(line[:1000])
            continue
        if line.startswith(END + " "):
            got.exit_code = _finish(line, size, digest.hexdigest())
            out.flush()
            out.seek(0)
            got.sink = out
            inside = False
            continue
        try:
            chunk = base64.b64decode(line.strip(), validate=True)
        except ValueError:
            raise ArchiveError("the archive holds a line that is not base64 "
                               "(another output was written into it)") from None
        size += len(chunk)
        if size > max_bytes:
            raise ArchiveError(f"the archive is larger than {max_bytes} bytes")
        digest.update(chunk)
        out.write(chunk)
    if inside:
        raise ArchiveError(f"the archive was cut short after {size} bytes (no end line)")
    if got.sink is None:
        raise ArchiveError("the node sent no archive")
    return got


def _finish(line: str, size: int, digest: str) -> int:
    parts = line.split()
    if len(parts) != 4 or not parts[1].isdigit() or not re.fullmatch(r"-?\d+", parts[3]):
        raise ArchiveError(f"malformed end line {line[:80]!r}")
    if size != int(parts[1]) or digest != parts[2]:
        raise ArchiveError(f"the archive is corrupt: {size} bytes received, "
                           f"{parts[1]} sent, digest differs")
    return int(parts[3])


# -- unpacking ------------------------------------------------------------------------------------

def _member_path(name: str) -> str:
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        raise ArchiveError(f"archive member {name!r} has an absolute or odd name")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts) or not all(p.isprintable() for p in parts):
        raise ArchiveError(f"archive member {name!r} names a path outside its directory")
    return "/".join(parts)


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    total = 0
    for count, member in enumerate(tar, 1):
        if count > MAX_MEMBERS:
            raise ArchiveError(f"the archive has more than {MAX_MEMBERS} members")
        total += max(member.size, 0)
        if total > MAX_BYTES:
            raise ArchiveError(f"the archive unpacks to more than {MAX_BYTES} bytes")
        yield member


def unpack(data: bytes | IO[bytes], dest: str) -> list[str]:
    """Unpack ``data`` (a tar.gz, or a file of one) into ``dest``, which must not exist;
    returns the files made.

    An unsafe member stops the unpacking with ArchiveError; what was unpacked before it stays
    (it passed the same checks) so that the caller can say what is missing.
    """
    os.mkdir(dest, 0o755)
    made: list[str] = []
    regular: set[str] = set()
    try:
        src = io.BytesIO(data) if isinstance(data, bytes) else data
        tar = tarfile.open(fileobj=src, mode="r:gz")  # noqa: SIM115 (closed below)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveError(f"not a tar.gz archive: {exc}") from None
    try:
        for member in _members(tar):
            rel = _member_path(member.name)
            path = os.path.join(dest, rel)
            _make_parents(dest, rel)
            if member.isdir():
                if not os.path.isdir(path):
                    os.mkdir(path, 0o755)
            elif member.isfile():
                body = tar.extractfile(member)
                if body is None:
                    raise ArchiveError(f"archive member {rel!r} has no data")
                _write_new(path, body)
                regular.add(rel)
                made.append(rel)
            elif member.islnk():
                target = _member_path(member.linkname)
                if target not in regular:
                    raise ArchiveError(f"archive member {rel!r} is a hard link to {target!r}, "
                                       "which is not a file of this archive")
                os.link(os.path.join(dest, target), path, follow_symlinks=False)
                made.append(rel)
            else:
                kind = "a symbolic link" if member.issym() else "a device, FIFO or other special file"
                raise ArchiveError(f"archive member {rel!r} is {kind}: refused")
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, FileExistsError):
            raise ArchiveError(f"archive member {exc.filename!r} is given twice") from None
        raise ArchiveError(f"the archive is truncated or corrupt: {exc}") from None
    finally:
        tar.close()
    return made


def _make_parents(dest: str, rel: str) -> None:
    path = dest
    for part in rel.split("/")[:-1]:
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise ArchiveError(f"archive path {rel!r} goes through a link")
        if not os.path.isdir(path):
            os.mkdir(path, 0o755)


def _write_new(path: str, src: IO[bytes]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as out:
        while True:
            chunk = src.read(1 << 20)
            if not chunk:
                break
            out.write(chunk)
