"""ELF files read as untrusted data: the function symbols of a mapped binary, its load segments,
its build id, found without trusting one byte of it (every offset and size is checked against
the file and bounded), so a binary another user made can neither crash nor flood the reader.

fdtrace symbolizes with this rather than bcc's symbol caches: bcc 0.26 frees each cache with a
``close()`` of a descriptor number it never opened (``ProcSyms::ModulePath`` leaves its ``fd_``
unset for /tmp/perf-PID.map; fixed in bcc 0.33), which closed fdtrace's own program and file
descriptors at random.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat
import struct
from dataclasses import dataclass

import numpy as np

#: Bytes of symbol and string tables read from one file at most.
MAX_TABLE_BYTES = 64 << 20
#: Section headers and program headers considered at most.
MAX_HEADERS = 4096
#: A table may claim this many bytes more than the file holds on disk (blocks allocated): a small
#: file's bytes can live in its inode, a filesystem's compression can store fewer than it reads.
ON_DISK_SLACK = 256 << 10
#: Where Debian's -dbgsym packages put separate debug files, by build id.
DEBUG_ROOT = "/usr/lib/debug"

_ELF_MAGIC = b"\x7fELF"
_SHT_SYMTAB, _SHT_NOTE, _SHT_DYNSYM = 2, 7, 11
_PT_LOAD = 1
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_NT_GNU_BUILD_ID = 3


class ElfError(ValueError):
    """Not an ELF file this reader takes, or one whose tables do not fit in it."""


class NotElfError(ElfError):
    """The file is not ELF at all: code a JIT or libffi maps from a memfd or a temporary file has no
    symbols to read, which is no shortfall of the reader's."""


class BudgetSpentError(ElfError):
    """The bytes a caller allowed for reading ELF tables (``ReadBudget``) are spent: the file was
    not judged, only left for later."""


class ReadBudget:
    """Bytes of ELF tables that readers may take, shared across files (one round's worth): a
    thousand files each within its own bound cannot add up past it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spent = 0

    def renew(self) -> None:
        """A new round: the whole budget again."""
        self.spent = 0

    def take(self, size: int) -> None:
        """Count ``size`` bytes about to be read; raises BudgetSpentError (reading nothing) past the limit."""
        if self.spent + size > self.limit:
            raise BudgetSpentError(f"the {self.limit >> 20} MiB of ELF tables allowed a round are read")
        self.spent += size


@dataclass(frozen=True)
class Section:
    """One section header: its name, type, file offset, size, linked section, entry size and
    flags."""

    name: str
    kind: int
    offset: int
    size: int
    link: int
    entry_size: int
    flags: int = 0


@dataclass(frozen=True)
class Segment:
    """One PT_LOAD program header: where its bytes lie in the file and in memory."""

    offset: int
    vaddr: int
    file_size: int
    flags: int


class FunctionSymbols:
    """Function symbols sorted by address, names decoded only when asked for."""

    def __init__(self, starts: np.ndarray, sizes: np.ndarray, names: np.ndarray, strings: bytes) -> None:
        order = np.argsort(starts, kind="stable")
        self.starts = starts[order]
        self.sizes = sizes[order]
        self._names = names[order]
        self._strings = strings

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def nbytes(self) -> int:
        """The memory its tables hold."""
        return len(self._strings) + self.starts.nbytes + self.sizes.nbytes + self._names.nbytes

    def name_at(self, index: int) -> str:
        """The name of the symbol at ``index``."""
        begin = int(self._names[index])
        end = self._strings.find(b"\0", begin)
        return self._strings[begin:end if end >= 0 else None].decode("utf-8", "replace")

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        """(function, offset in it) of an address, or None where no symbol covers it (a symbol of
        size 0 covers what follows it up to the next symbol)."""
        i = int(np.searchsorted(self.starts, vaddr, side="right")) - 1
        while i >= 0:
            start, size = int(self.starts[i]), int(self.sizes[i])
            if size == 0 or vaddr < start + size:
                return self.name_at(i), vaddr - start
            if i == 0 or int(self.starts[i - 1]) != start:  # aliases of one start share it
                return None
            i -= 1
        return None

    def address_of(self, name: str) -> int | None:
        """The address of the first function symbol named ``name``."""
        wanted = name.encode() + b"\0"
        at = self._strings.find(wanted)
        while at >= 0:
            if at == 0 or self._strings[at - 1] == 0:
                hits = np.flatnonzero(self._names == at)
                if len(hits):
                    return int(self.starts[hits[0]])
            at = self._strings.find(wanted, at + 1)
        return None


class ElfFile:
    """An open ELF file's headers (64 or 32 bit, either byte order), read with bounds checks."""

    def __init__(self, fd: int, budget: ReadBudget | None = None) -> None:
        self.fd = fd
        info = os.fstat(fd)
        self.size = info.st_size
        # What the file really holds: a sparse file claims gigabytes of zeros it never stored,
        # which a read would make real in fdtrace's memory.
        self.on_disk = info.st_blocks * 512
        self.budget = budget
        ident = self._read(0, 64)
        if len(ident) < 52 or not ident.startswith(_ELF_MAGIC) or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise NotElfError("not an ELF file")
        self.wide = ident[4] == 2
        self.order = "<" if ident[5] == 1 else ">"
        o = self.order
        self.kind = struct.unpack_from(o + "H", ident, 16)[0]  # ET_EXEC 2: not position independent
        if self.wide:
            phoff, shoff = struct.unpack_from(o + "QQ", ident, 0x20)
            phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from(o + "HHHHH", ident, 0x36)
        else:
            phoff, shoff = struct.unpack_from(o + "II", ident, 0x1C)
            phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from(o + "HHHHH", ident, 0x2A)
        self.segments = self._segments(phoff, phentsize, min(phnum, MAX_HEADERS))
        self.sections = self._sections(shoff, shentsize, min(shnum, MAX_HEADERS), shstrndx)

    @classmethod
    def open(cls, path: str, budget: ReadBudget | None = None) -> ElfFile:
        """Open a regular file without blocking (a FIFO planted under the name cannot hang the
        reader); raises OSError or ElfError. ``budget``: what its tables may take of bytes shared
        with other files."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, f"{path}: not a regular file")
            return cls(fd, budget)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        """Close the file (once)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> ElfFile:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _read(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise ElfError("a table lies outside the file")
        if size > self.on_disk + ON_DISK_SLACK:
            raise ElfError(f"a table of {size} bytes in a file holding {self.on_disk} on disk (a sparse file)")
        if self.budget is not None:
            self.budget.take(size)
        return os.pread(self.fd, size, offset)

    def _segments(self, offset: int, entry: int, count: int) -> list[Segment]:
        need = 56 if self.wide else 32
        if not count or entry < need:
            return []
        raw = self._read(offset, entry * count)
        found = []
        for i in range(count):
            at = i * entry
            if self.wide:
                kind, flags, file_offset, vaddr, _paddr, file_size = struct.unpack_from(self.order + "IIQQQQ", raw, at)
            else:
                kind, file_offset, vaddr, _paddr, file_size, _mem, flags = struct.unpack_from(
                    self.order + "IIIIIII", raw, at)
            if kind == _PT_LOAD:
                found.append(Segment(file_offset, vaddr, file_size, flags))
        return found

    def _sections(self, offset: int, entry: int, count: int, names_index: int) -> list[Section]:
        need = 64 if self.wide else 40
        if not count or entry < need or names_index >= count:
            return []
        raw = self._read(offset, entry * count)
        headers = []
        for i in range(count):
            at = i * entry
            if self.wide:
                name, kind, flags, _addr, file_offset, size, link, _info, _align, entry_size = struct.unpack_from(
                    self.order + "IIQQQQIIQQ", raw, at)
            else:
                name, kind, flags, _addr, file_offset, size, link, _info, _align, entry_size = struct.unpack_from(
                    self.order + "IIIIIIIIII", raw, at)
            headers.append((name, kind, file_offset, size, link, entry_size, flags))
        names_at, names_size = headers[names_index][2], min(headers[names_index][3], 1 << 20)
        names = self._read(names_at, names_size) if names_at + names_size <= self.size else b""
        sections = []
        for name, kind, file_offset, size, link, entry_size, flags in headers:
            end = names.find(b"\0", name)
            text = names[name:end].decode("ascii", "replace") if 0 <= name < len(names) and end >= 0 else ""
            sections.append(Section(text, kind, file_offset, size, link, entry_size, flags))
        return sections

    def section(self, name: str) -> Section | None:
        """The first section of that name."""
        return next((s for s in self.sections if s.name == name), None)

    def section_data(self, name: str, limit: int = MAX_TABLE_BYTES) -> bytes | None:
        """A section's bytes, uncompressed when it is (SHF_COMPRESSED zlib, or a legacy .z
        section), at most ``limit`` of them; None when the file has no such section."""
        import zlib

        section = self.section(name)
        legacy = section is None and self.section(".z" + name.lstrip(".")) is not None
        if legacy:
            section = self.section(".z" + name.lstrip("."))
        if section is None:
            return None
        if section.size > limit:
            raise ElfError(f"{name} too large")
        raw = self._read(section.offset, section.size)
        asked = limit
        if self.budget is not None:  # what it inflates to counts too (a zlib bomb is small on disk)
            limit = max(0, min(limit, self.budget.limit - self.budget.spent))
        try:
            if section.flags & 0x800:  # SHF_COMPRESSED: a header, then zlib
                header = 24 if self.wide else 12
                kind, = struct.unpack_from(self.order + "I", raw, 0)
                if kind != 1:
                    raise ElfError(f"{name}: compressed with an unknown method {kind}")
                return self._inflated(zlib.decompressobj().decompress(raw[header:], limit), limit < asked)
            if legacy and raw.startswith(b"ZLIB"):
                return self._inflated(zlib.decompressobj().decompress(raw[12:], limit), limit < asked)
        except zlib.error as exc:
            raise ElfError(f"{name}: {exc}") from None
        return raw

    def _inflated(self, data: bytes, cut_by_budget: bool) -> bytes:
        if self.budget is not None:
            if cut_by_budget and len(data) >= self.budget.limit - self.budget.spent:
                self.budget.spent = self.budget.limit  # it needs more than is left: a later round's
                raise BudgetSpentError(f"the {self.budget.limit >> 20} MiB of ELF tables allowed a round are read")
            self.budget.take(len(data))
        return data

    def object_address(self, name: str, dynamic: bool = False) -> int | None:
        """The address of a data symbol (a variable) of .symtab, or of .dynsym with ``dynamic``
        (what a stripped binary still exports)."""
        kind = _SHT_DYNSYM if dynamic else _SHT_SYMTAB
        table = next((s for s in self.sections if s.kind == kind), None)
        if table is None or not 0 <= table.link < len(self.sections):
            return None
        strings = self.sections[table.link]
        if table.size > MAX_TABLE_BYTES or strings.size > MAX_TABLE_BYTES:
            raise ElfError("symbol table too large")
        names = self._read(strings.offset, strings.size)
        wanted = name.encode() + b"\0"
        at = names.find(wanted)
        offsets = []
        while at >= 0:
            if at == 0 or names[at - 1] == 0:
                offsets.append(at)
            at = names.find(wanted, at + 1)
        if not offsets:
            return None
        order = self.order
        dtype = (np.dtype([("name", order + "u4"), ("info", "u1"), ("other", "u1"), ("shndx", order + "u2"),
                           ("value", order + "u8"), ("size", order + "u8")]) if self.wide else
                 np.dtype([("name", order + "u4"), ("value", order + "u4"), ("size", order + "u4"),
                           ("info", "u1"), ("other", "u1"), ("shndx", order + "u2")]))
        raw = self._read(table.offset, table.size)
        symbols = np.frombuffer(raw, dtype=dtype, count=len(raw) // dtype.itemsize)
        hits = np.flatnonzero(np.isin(symbols["name"], offsets) & ((symbols["info"] & 0xF) == 1)
                              & (symbols["shndx"] != 0))  # STT_OBJECT, defined
        return int(symbols["value"][hits[0]]) if len(hits) else None

    def function_symbols(self) -> FunctionSymbols | None:
        """The defined functions of .symtab, else of .dynsym (a stripped binary keeps only the
        exported ones), or None when it has neither."""
        for kind in (_SHT_SYMTAB, _SHT_DYNSYM):
            table = next((s for s in self.sections if s.kind == kind), None)
            if table is None or not 0 <= table.link < len(self.sections):
                continue
            strings = self.sections[table.link]
            if table.size > MAX_TABLE_BYTES or strings.size > MAX_TABLE_BYTES:
                raise ElfError("symbol table too large")
            symbols = self._functions(self._read(table.offset, table.size), self._read(strings.offset, strings.size))
            if symbols is not None and len(symbols):
                return symbols
        return None

    def _functions(self, raw: bytes, strings: bytes) -> FunctionSymbols | None:
        order = self.order
        if self.wide:
            dtype = np.dtype([("name", order + "u4"), ("info", "u1"), ("other", "u1"), ("shndx", order + "u2"),
                              ("value", order + "u8"), ("size", order + "u8")])
        else:
            dtype = np.dtype([("name", order + "u4"), ("value", order + "u4"), ("size", order + "u4"),
                              ("info", "u1"), ("other", "u1"), ("shndx", order + "u2")])
        count = len(raw) // dtype.itemsize
        if not count:
            return None
        table = np.frombuffer(raw, dtype=dtype, count=count)
        kinds = table["info"] & 0xF
        keep = ((kinds == _STT_FUNC) | (kinds == _STT_GNU_IFUNC)) & (table["shndx"] != 0) & (table["value"] != 0) \
            & (table["name"] < len(strings))
        chosen = table[keep]
        return FunctionSymbols(chosen["value"].astype(np.uint64), chosen["size"].astype(np.uint64),
                               chosen["name"].astype(np.int64), strings)

    def build_id(self) -> str | None:
        """The GNU build id, as hex."""
        for section in self.sections:
            if section.kind != _SHT_NOTE or section.size > 4096:
                continue
            raw = self._read(section.offset, section.size)
            at = 0
            while at + 12 <= len(raw):
                name_size, desc_size, kind = struct.unpack_from(self.order + "III", raw, at)
                name_at = at + 12
                desc_at = name_at + (name_size + 3) // 4 * 4
                if desc_at + desc_size > len(raw):
                    break
                if kind == _NT_GNU_BUILD_ID and raw[name_at:name_at + name_size].rstrip(b"\0") == b"GNU":
                    return raw[desc_at:desc_at + desc_size].hex()
                at = desc_at + (desc_size + 3) // 4 * 4
        return None

    def vaddr_of_offset(self, file_offset: int) -> int | None:
        """The address, as the binary's own symbols count, of a byte at ``file_offset``."""
        for segment in self.segments:
            if segment.offset <= file_offset < segment.offset + segment.file_size:
                return file_offset - segment.offset + segment.vaddr
        return None

    def offset_of_vaddr(self, vaddr: int) -> int | None:
        """The file offset of an address of the binary (what a uprobe is attached at)."""
        for segment in self.segments:
            if segment.vaddr <= vaddr < segment.vaddr + segment.file_size:
                return vaddr - segment.vaddr + segment.offset
        return None


def debug_file_for(build_id: str | None) -> str | None:
    """The separate debug file installed for a build id, if any."""
    if not build_id or len(build_id) < 4 or not all(c in "0123456789abcdef" for c in build_id):
        return None
    path = os.path.join(DEBUG_ROOT, ".build-id", build_id[:2], build_id[2:] + ".debug")
    return path if os.path.isfile(path) else None


@dataclass(frozen=True)
class ModuleSymbols:
    """What symbolizing an address of one mapped file needs: its load segments (from the file
    itself) and its function symbols (from it or its debug file)."""

    elf_segments: tuple[Segment, ...]
    symbols: FunctionSymbols | None

    @property
    def nbytes(self) -> int:
        """The memory it holds (what a cache of modules counts)."""
        return 256 + (self.symbols.nbytes if self.symbols is not None else 0)

    def resolve(self, file_offset: int) -> tuple[str, int] | None:
        """(function, offset) of the byte at ``file_offset`` of the file."""
        if self.symbols is None:
            return None
        for segment in self.elf_segments:
            if segment.offset <= file_offset < segment.offset + segment.file_size:
                return self.symbols.lookup(file_offset - segment.offset + segment.vaddr)
        return None


def read_module(path: str, budget: ReadBudget | None = None) -> ModuleSymbols:
    """The symbols of one binary at ``path`` (opened as untrusted: see ``ElfFile.open``), with those
    of its separate debug file where it was stripped. Raises OSError or ElfError (BudgetSpentError when
    ``budget`` allows no more bytes: then nothing is known of the file)."""
    with ElfFile.open(path, budget) as elf:
        segments = tuple(elf.segments)
        symbols = elf.function_symbols()
        stripped = elf.section(".symtab") is None
        build_id = elf.build_id() if stripped else None
    debug = debug_file_for(build_id)
    if debug is not None:
        try:
            with ElfFile.open(debug, budget) as separate:
                symbols = separate.function_symbols() or symbols
        except BudgetSpentError:
            raise
        except (OSError, ElfError):
            pass
    return ModuleSymbols(segments, symbols)


_demangler: object = None


def demangled(name: str) -> str:
    """A C++ symbol as people write it (libstdc++'s own demangler); other names as they are."""
    global _demangler
    if not name.startswith("_Z"):
        return name
    if _demangler is None:
        try:
            library = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
            function = library.__cxa_demangle
            function.restype = ctypes.c_void_p
            function.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
            free = ctypes.CDLL(None).free
            free.argtypes = [ctypes.c_void_p]
            _demangler = (function, free)
        except (OSError, AttributeError):
            _demangler = False
    if not _demangler:
        return name
    function, free = _demangler  # type: ignore[misc]
    status = ctypes.c_int(0)
    result = function(name.encode(), None, None, ctypes.byref(status))
    if not result:
        return name
    try:
        text = ctypes.string_at(result)
    finally:
        free(result)
    return text.decode("utf-8", "replace") if status.value == 0 else name
