"""A node's directory over srun's stdout: framing round trip, streams cut or corrupted, and
hostile archives (names outside the directory, links, devices) refused before anything lands."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from flight_profiler.diagnose.node_archive import ArchiveError, pack, read_stream, unpack


def _tree(root: Path) -> Path:
    (root / "rank1").mkdir(parents=True)
    (root / "traces").mkdir()
    (root / "rank1" / "profile.json.gz").write_bytes(os.urandom(300_000))
    os.link(root / "rank1" / "profile.json.gz", root / "traces" / "rank1.pt.trace.json.gz")
    (root / "report.md").write_text("# report\n")
    return root


def _framed(tmp_path: Path, code: int = 0) -> str:
    out = io.StringIO()
    pack(str(_tree(tmp_path / "src")), out, "n2", code)
    return out.getvalue()


def test_round_trip_keeps_files_and_hard_links_amid_other_output(tmp_path: Path) -> None:
    text = "srun: a prolog line\n" + _framed(tmp_path, 12) + "a late warning\n"
    got = read_stream(io.StringIO(text))
    assert (got.node, got.exit_code) == ("n2", 12)
    assert got.other == ["srun: a prolog line", "a late warning"]
    dest = tmp_path / "dest"
    made = unpack(got.archive or b"", str(dest))
    assert sorted(made) == ["rank1/profile.json.gz", "report.md", "traces/rank1.pt.trace.json.gz"]
    src = tmp_path / "src" / "rank1" / "profile.json.gz"
    assert (dest / "rank1" / "profile.json.gz").read_bytes() == src.read_bytes()
    assert (dest / "traces" / "rank1.pt.trace.json.gz").stat().st_ino == \
        (dest / "rank1" / "profile.json.gz").stat().st_ino


def test_cut_stream_is_refused(tmp_path: Path) -> None:
    lines = _framed(tmp_path).splitlines(keepends=True)
    with pytest.raises(ArchiveError, match="cut short"):
        read_stream(io.StringIO("".join(lines[:-3])))  # srun killed mid-stream
    with pytest.raises(ArchiveError, match="sent no archive"):
        read_stream(io.StringIO("error: no rank of SLURM job 5 on node n1\n"))


def test_corrupted_or_interleaved_stream_is_refused(tmp_path: Path) -> None:
    lines = _framed(tmp_path).splitlines(keepends=True)
    swapped = [*lines[:2], lines[3], lines[2], *lines[4:]]  # same bytes, wrong order
    with pytest.raises(ArchiveError, match="corrupt"):
        read_stream(io.StringIO("".join(swapped)))
    mixed = [*lines[:3], "another task's line!\n", *lines[3:]]
    with pytest.raises(ArchiveError, match="not base64"):
        read_stream(io.StringIO("".join(mixed)))
    with pytest.raises(ArchiveError, match="larger than 1000 bytes"):
        read_stream(io.StringIO("".join(lines)), max_bytes=1000)


def _hostile(members: list[tarfile.TarInfo], data: bytes = b"x") -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for m in members:
            if m.isfile():
                m.size = len(data)
                tar.addfile(m, io.BytesIO(data))
            else:
                tar.addfile(m)
    raw = buf.getvalue()
    body = base64.b64encode(raw).decode()
    return f"FP-ARCHIVE 1 n1\n{body}\nFP-END {len(raw)} {hashlib.sha256(raw).hexdigest()} 0\n"


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type = kind
    m.linkname = link
    return m


@pytest.mark.parametrize(("members", "said"), [
    ([_info("../evil")], "outside its directory"),
    ([_info("a/../../evil")], "outside its directory"),
    ([_info("/etc/evil")], "absolute"),
    ([_info("link", tarfile.SYMTYPE, "/etc/passwd")], "symbolic link"),
    ([_info("hard", tarfile.LNKTYPE, "/etc/passwd")], "absolute"),
    ([_info("hard", tarfile.LNKTYPE, "never")], "not a file of this archive"),
    ([_info("dev", tarfile.CHRTYPE)], "special file"),
    ([_info("fifo", tarfile.FIFOTYPE)], "special file"),
    ([_info("a"), _info("a")], "given twice"),
])
def test_hostile_archives_are_refused(tmp_path: Path, members: list[tarfile.TarInfo],
                                      said: str) -> None:
    got = read_stream(io.StringIO(_hostile(members)))
    with pytest.raises(ArchiveError, match=said):
        unpack(got.archive or b"", str(tmp_path / "dest"))
    outside = [p for p in tmp_path.rglob("*") if not str(p).startswith(str(tmp_path / "dest"))]
    assert outside == [] and not Path("/tmp/evil").exists()


def test_a_symlink_in_the_way_is_not_followed(tmp_path: Path) -> None:
    # A member under a directory the archive made a link of is refused (never written through).
    got = read_stream(io.StringIO(_hostile([_info("d", tarfile.SYMTYPE, str(tmp_path)),
                                            _info("d/evil")])))
    with pytest.raises(ArchiveError, match="symbolic link"):
        unpack(got.archive or b"", str(tmp_path / "dest"))
    assert not (tmp_path / "evil").exists()


def test_truncated_archive_and_bad_node_name(tmp_path: Path) -> None:
    got = read_stream(io.StringIO(_framed(tmp_path)))
    data = got.archive or b""
    with pytest.raises(ArchiveError, match=r"truncated or corrupt|not a tar\.gz"):
        unpack(data[: len(data) // 2], str(tmp_path / "dest"))
    with pytest.raises(ArchiveError, match="is not a host name"):
        read_stream(io.StringIO("FP-ARCHIVE 1 ../x\n"))


def test_stream_into_a_file_sink(tmp_path: Path) -> None:
    # run_node streams each node into a temporary file: memory stays bounded by the line
    with (tmp_path / "sink").open("w+b") as sink:
        got = read_stream(io.StringIO(_framed(tmp_path)), sink=sink)
        assert got.sink is sink and sink.tell() == 0
        made = unpack(sink, str(tmp_path / "dest"))
    assert "report.md" in made and (tmp_path / "dest" / "report.md").read_text() == "# report\n"


def test_pack_skips_a_file_gone_while_packing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    # an interrupted diagnosis: a rank's agent removes its temporary file during the walk
    src = _tree(tmp_path / "src")
    real_walk = os.walk

    def walk(top: str, **kw: object) -> object:
        for root, dirs, files in real_walk(top, **kw):  # type: ignore[arg-type]
            yield root, dirs, [*files, ".fp-trace-gone.json"]

    monkeypatch.setattr(os, "walk", walk)
    out = io.StringIO()
    pack(str(src), out, "n1", 130)
    got = read_stream(io.StringIO(out.getvalue()))
    made = unpack(got.archive or b"", str(tmp_path / "dest"))
    assert "report.md" in made and not any("gone" in m for m in made)
    assert got.exit_code == 130
