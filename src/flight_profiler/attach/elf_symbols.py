"""Find the run-time addresses of exported functions in a live process, from its ELF files.

Reads ``/proc/PID/maps`` for where each object is loaded and the object's own symbol tables
(``.dynsym``, which even Debian's stripped builds keep, then ``.symtab`` when present). The file
is opened through ``/proc/PID/map_files`` (the exact mapped inode, even inside a container or
after the file was replaced on disk) or else through ``/proc/PID/root``; its inode must match the
one the kernel lists in the maps, so a file swapped on disk is never trusted.
"""

from __future__ import annotations

import os
import re
import struct

from flight_profiler.records import FrozenRecord, Record

_MAPS_LINE = re.compile(
    r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) ([0-9a-f]+):([0-9a-f]+) (\d+)\s+(.*)$")
_LIBC = re.compile(r"/(libc(\.so\.6|-2\.\d+\.so)|ld-musl-[^/]*\.so\.1)$")

STT_FUNC = 2
STT_GNU_IFUNC = 10
SHT_SYMTAB = 2
SHT_DYNSYM = 11
SHT_GNU_VERSYM = 0x6FFFFFFF
PT_LOAD = 1
_MAX_SECTION = 256 << 20  # no symbol table is this big; a larger one is a corrupt file


class SymbolError(Exception):
    """A symbol or an object could not be found or read; the text says which and why."""


class Mapping(FrozenRecord):
    """One line of /proc/PID/maps (frozen; records.py says why it is not a dataclass)."""

    FIELDS = ("start", "end", "perms", "offset", "inode", "path")
    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str

    def __init__(self, start: int, end: int, perms: str, offset: int, inode: int,
                 path: str) -> None:
        self._set("start", start)
        self._set("end", end)
        self._set("perms", perms)
        self._set("offset", offset)
        self._set("inode", inode)
        self._set("path", path)


class LoadedObject(Record):
    """An ELF object mapped in the target."""

    FIELDS = ("path", "inode", "base", "first")

    def __init__(self, path: str, inode: int, base: int, first: Mapping) -> None:
        self.path = path  # as the target sees it
        self.inode = inode
        self.base = base  # lowest address of its offset-0 mapping
        self.first = first


def parse_maps(text: str) -> list[Mapping]:
    out = []
    for line in text.splitlines():
        m = _MAPS_LINE.match(line)
        if m:
            out.append(Mapping(int(m.group(1), 16), int(m.group(2), 16), m.group(3),
                               int(m.group(4), 16), int(m.group(7)), m.group(8).strip()))
    return out


def loaded_objects(maps: list[Mapping]) -> dict[str, LoadedObject]:
    """Every file-backed object mapped at offset 0, by path (the lowest such mapping)."""
    objects: dict[str, LoadedObject] = {}
    for m in maps:
        if m.inode == 0 or m.offset != 0 or not m.path.startswith("/"):
            continue
        path = m.path.removesuffix(" (deleted)")
        if path not in objects or m.start < objects[path].base:
            objects[path] = LoadedObject(path, m.inode, m.start, m)
    return objects


def find_libc(objects: dict[str, LoadedObject]) -> LoadedObject:
    for path, obj in objects.items():
        if _LIBC.search(path):
            return obj
    raise SymbolError("no C library (libc.so.6 or musl) is mapped in the process")


def _open_object(pid: int, obj: LoadedObject, root: str) -> int:
    m = obj.first
    candidates = [f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}"]
    candidates.append(os.path.join(root, obj.path.lstrip("/")) if root != "/" else obj.path)
    last: OSError | None = None
    for path in candidates:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            last = exc
            continue
        if os.fstat(fd).st_ino == obj.inode:
            return fd
        os.close(fd)
        last = OSError(f"{path} is no longer the file the process mapped (inode changed)")
    raise SymbolError(f"cannot read {obj.path} of process {pid}: {last}")


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    if size < 0 or size > _MAX_SECTION:
        raise SymbolError(f"implausible section size {size}")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise SymbolError("file truncated")
    return data


def _section_symbols(fd: int, names: set[bytes]) -> dict[bytes, tuple[int, int]]:
    """name -> (st_value, st_info) of defined symbols among ``names`` (and the ELF type)."""
    head = _pread_exact(fd, 64, 0)
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        raise SymbolError("not a 64-bit little-endian ELF file")
    e_shoff, = struct.unpack_from("<Q", head, 40)
    e_shentsize, e_shnum = struct.unpack_from("<HH", head, 58)
    if e_shoff == 0 or e_shentsize != 64 or e_shnum == 0:
        raise SymbolError("the file has no section headers")
    sections = [struct.unpack_from("<IIQQQQIIQQ", _pread_exact(fd, 64 * e_shnum, e_shoff), i * 64)
                for i in range(e_shnum)]
    found: dict[bytes, tuple[int, int, bool]] = {}
    for kind in (SHT_DYNSYM, SHT_SYMTAB):
        for index, sh in enumerate(sections):
            if sh[1] != kind or sh[9] != 24:
                continue
            strtab_sh = sections[sh[6]] if sh[6] < len(sections) else None
            if strtab_sh is None:
                continue
            symbols = _pread_exact(fd, sh[5], sh[4])
            strtab = _pread_exact(fd, strtab_sh[5], strtab_sh[4])
            versym = b""
            if kind == SHT_DYNSYM:
                for vs in sections:
                    if vs[1] == SHT_GNU_VERSYM and vs[6] == index:
                        versym = _pread_exact(fd, vs[5], vs[4])
            _scan(symbols, strtab, versym, names, found)
        if names <= found.keys():
            break
    return {name: (value, info) for name, (value, info, _hidden) in found.items()}


def _scan(symbols: bytes, strtab: bytes, versym: bytes, names: set[bytes],
          found: dict[bytes, tuple[int, int, bool]]) -> None:
    # Offsets in the string table where a wanted name (or a longer name ending with it, as
    # linkers merge tails) is stored: only symbols pointing there need their name compared.
    wanted: dict[int, bytes] = {}
    for name in names:
        needle = name + b"\0"
        at = strtab.find(needle)
        while at >= 0:
            wanted[at] = name
            at = strtab.find(needle, at + 1)
    if not wanted:
        return
    for i, (st_name, st_info, _other, st_shndx, st_value, _size) in enumerate(
            struct.iter_unpack("<IBBHQQ", symbols)):
        if st_name not in wanted or st_shndx == 0 or st_value == 0:
            continue
        name = wanted[st_name]
        hidden = bool(versym) and len(versym) >= 2 * i + 2 and bool(
            struct.unpack_from("<H", versym, 2 * i)[0] & 0x8000)
        if name in found and (hidden or not found[name][2]):
            continue  # keep the default version of a versioned symbol
        found[name] = (st_value, st_info, hidden)


def _load_bias(fd: int, base: int) -> int:
    head = _pread_exact(fd, 64, 0)
    e_phoff, = struct.unpack_from("<Q", head, 32)
    e_phentsize, e_phnum = struct.unpack_from("<HH", head, 54)
    if e_phentsize != 56:
        raise SymbolError("unexpected program header size")
    table = _pread_exact(fd, 56 * e_phnum, e_phoff)
    for i in range(e_phnum):
        p_type, _flags, p_offset, p_vaddr = struct.unpack_from("<IIQQ", table, i * 56)
        if p_type == PT_LOAD and p_offset == 0:
            return int(base - (p_vaddr & ~0xFFF))
    for i in range(e_phnum):  # first PT_LOAD, whatever its offset
        p_type, _flags, p_offset, p_vaddr = struct.unpack_from("<IIQQ", table, i * 56)
        if p_type == PT_LOAD:
            return int(base - ((p_vaddr - p_offset) & ~0xFFF))
    raise SymbolError("no loadable segment")


def resolve(pid: int, obj: LoadedObject, names: list[str], root: str = "/") -> dict[str, int]:
    """Run-time addresses of the functions ``names`` that ``obj`` defines (missing ones omitted)."""
    fd = _open_object(pid, obj, root)
    try:
        bias = _load_bias(fd, obj.base)
        raw = _section_symbols(fd, {n.encode() for n in names})
    finally:
        os.close(fd)
    out: dict[str, int] = {}
    for name, (value, info) in raw.items():
        if info & 0xF == STT_GNU_IFUNC:
            continue  # the address of a resolver, not of the function: never call it
        out[name.decode()] = bias + value
    return out
