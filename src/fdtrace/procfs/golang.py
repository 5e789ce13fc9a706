"""Telling a Go binary: its build info, which every Go program since 1.13 carries."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

#: The magic that starts the .go.buildinfo section.
BUILDINFO_MAGIC = b"\xff Go buildinf:"
#: Go's default limit on OS threads (runtime/debug.SetMaxThreads); past it the program dies.
GO_DEFAULT_MAX_THREADS = 10_000
_ELF_MAGIC = b"\x7fELF"


def elf_sections(exe: Path) -> dict[str, tuple[int, int]] | None:
    """The sections of an ELF executable, {name: (file offset, size)}; None if it is not ELF or
    has no section table (then only a scan of its bytes can tell). Reads the headers, not the
    whole file."""
    try:
        with open(exe, "rb") as binary:
            ident = binary.read(64)
            if len(ident) < 64 or not ident.startswith(_ELF_MAGIC):
                return None
            wide, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
            if wide:
                shoff, = struct.unpack_from(order + "Q", ident, 0x28)
                shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", ident, 0x3A)
            else:
                shoff, = struct.unpack_from(order + "I", ident, 0x20)
                shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", ident, 0x2E)
            if shoff == 0 or shnum == 0 or shstrndx >= shnum or shnum > 4096 or not 40 <= shentsize <= 256:
                return None
            if shentsize * shnum > os.fstat(binary.fileno()).st_blocks * 512 + (64 << 10):
                return None  # a table the file does not hold (a sparse file's zeros)
            binary.seek(shoff)
            table = binary.read(shentsize * shnum)
            if len(table) < shentsize * shnum:
                return None

            def header(index: int) -> tuple[int, int, int]:
                """(name offset, file offset, size) of a section header."""
                at = index * shentsize
                if wide:
                    name, = struct.unpack_from(order + "I", table, at)
                    offset, size = struct.unpack_from(order + "QQ", table, at + 0x18)
                else:
                    name, = struct.unpack_from(order + "I", table, at)
                    offset, size = struct.unpack_from(order + "II", table, at + 0x10)
                return name, offset, size

            _, strings_at, strings_size = header(shstrndx)
            binary.seek(strings_at)
            strings = binary.read(min(strings_size, 1 << 20, os.fstat(binary.fileno()).st_blocks * 512 + (64 << 10)))
    except (OSError, struct.error):
        return None
    found = {}
    for index in range(shnum):
        start, offset, size = header(index)
        end = strings.find(b"\0", start)
        found[strings[start:end if end >= 0 else None].decode("ascii", "replace")] = (offset, size)
    return found


def is_go_binary(exe: Path, scan_bytes: int = 64 << 20) -> bool:
    """Whether the executable carries Go build info: its ``.go.buildinfo`` section when the ELF
    section table can be read, else a scan of at most ``scan_bytes`` for the build info magic (and
    never past the bytes the file holds on disk)."""
    sections = elf_sections(exe)
    if sections is not None:
        return ".go.buildinfo" in sections
    try:
        with open(exe, "rb") as binary:
            # no more than the file holds on disk: a sparse file's gigabytes of zeros are no scan
            scan_bytes = min(scan_bytes, os.fstat(binary.fileno()).st_blocks * 512 + (64 << 10))
            tail = b""
            read = 0
            while read < scan_bytes:
                chunk = binary.read(1 << 20)
                if not chunk:
                    return False
                if BUILDINFO_MAGIC in tail + chunk:
                    return True
                tail = chunk[-len(BUILDINFO_MAGIC):]
                read += len(chunk)
    except OSError:
        return False
    return False


def go_version(exe: Path) -> str | None:
    """The Go version a binary was built with ("go1.19.8"), from the build info section of Go 1.18
    and later, which holds the version inline; None for other binaries and older Go (whose build
    info holds pointers into the binary instead)."""
    sections = elf_sections(exe) or {}
    if ".go.buildinfo" not in sections:
        return None
    offset, _ = sections[".go.buildinfo"]
    try:
        with open(exe, "rb") as binary:
            binary.seek(offset)
            head = binary.read(32 + 1 + 64)
    except OSError:
        return None
    if not head.startswith(BUILDINFO_MAGIC) or len(head) < 34 or not head[15] & 2:  # 2: strings inline
        return None
    length = head[32]  # a varint; a version is far shorter than 128 bytes
    text = head[33:33 + length] if length < 128 else b""
    return text.decode("ascii", "replace") if text.startswith(b"go") else None


def go_register_abi(version: str | None) -> bool:
    """Whether a Go version passes arguments in registers on every architecture fdtrace watches
    Go on (amd64 from 1.17, arm64 from 1.18): 1.18 and later."""
    match = re.match(r"go1\.(\d+)", version or "")
    return match is not None and int(match[1]) >= 18
