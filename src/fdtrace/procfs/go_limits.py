"""A Go program's real thread limit, read from its memory: ``runtime.sched.maxmcount``, what
``debug.SetMaxThreads`` sets (10000 by default), so that a lower limit is seen before the program
dies of it.

The address of ``runtime.sched`` comes from the binary's symbol table, the offset of
``maxmcount`` in ``runtime.schedt`` from its DWARF (Go writes both unless built with ``-s -w``):
found once per binary, the value then read with one 4-byte read of /proc/PID/mem per sample.
Everything read is bounded and checked; a binary without them says so (``unreadable_because``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from fdtrace.procfs.elf import BudgetSpentError, ElfError, ElfFile, ReadBudget
from fdtrace.procfs.reader import ProcFS

_DW_TAG_STRUCTURE, _DW_TAG_MEMBER = 0x13, 0x0D
_DW_AT_NAME, _DW_AT_LOCATION = 0x03, 0x38
_DW_FORM_STRING, _DW_OP_PLUS_UCONST = 0x08, 0x23
#: Bytes of DWARF read from one binary at most.
MAX_DWARF_BYTES = 256 << 20


@dataclass(frozen=True)
class GoLimitAddress:
    """Where a binary keeps its thread limit: ``runtime.sched``'s address (as linked) and the
    offset of ``maxmcount`` in it; ``position_independent``: add the load address."""

    sched: int
    offset: int
    position_independent: bool
    text_delta: int = 0  # its executable segment's address less its file offset (PIE: the load bias' base)


def _uleb(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ElfError("a LEB128 number runs on")


def _skip(form: int, data: bytes, at: int, address_size: int) -> int:
    """The offset past one attribute value of ``form`` (DWARF 2 to 4, 32-bit)."""
    fixed = {0x01: address_size, 0x05: 2, 0x06: 4, 0x07: 8, 0x0B: 1, 0x0C: 1, 0x0E: 4, 0x10: 4, 0x11: 1, 0x12: 2,
             0x13: 4, 0x14: 8, 0x17: 4, 0x19: 0, 0x20: 8}
    if form in fixed:
        return at + fixed[form]
    if form == _DW_FORM_STRING:
        end = data.index(b"\0", at)
        return end + 1
    if form in (0x0D, 0x0F, 0x15):  # sdata, udata, ref_udata
        return _uleb(data, at)[1]
    if form in (0x09, 0x18):  # block, exprloc
        size, at = _uleb(data, at)
        return at + size
    if form == 0x0A:
        return at + 1 + data[at]
    if form == 0x03:
        return at + 2 + int(struct.unpack_from("<H", data, at)[0])
    if form == 0x04:
        return at + 4 + int(struct.unpack_from("<I", data, at)[0])
    if form == 0x16:  # indirect
        real, at = _uleb(data, at)
        return _skip(real, data, at, address_size)
    raise ElfError(f"DWARF form {form:#x} is not read")


def _abbreviations(abbrev: bytes, at: int) -> dict[int, tuple[int, bool, list[tuple[int, int]]]]:
    table = {}
    while at < len(abbrev):
        code, at = _uleb(abbrev, at)
        if code == 0:
            break
        tag, at = _uleb(abbrev, at)
        children = abbrev[at] == 1
        at += 1
        attributes = []
        while True:
            name, at = _uleb(abbrev, at)
            form, at = _uleb(abbrev, at)
            if name == 0 and form == 0:
                break
            attributes.append((name, form))
        table[code] = (tag, children, attributes)
    return table


def _member_offset(info: bytes, abbrev: bytes, struct_name: str, member: str) -> int | None:
    """The offset of ``member`` in the structure type ``struct_name`` of a DWARF .debug_info."""
    needle = struct_name.encode() + b"\0"
    at = info.find(needle)
    while at >= 0:
        found = _member_at(info, abbrev, at, member)
        if found is not None:
            return found
        at = info.find(needle, at + 1)
    return None


def _unit_of(info: bytes, position: int) -> tuple[int, int, int] | None:
    """(where its DIEs start, its abbreviation table's offset, its address size) of the unit
    holding ``position``."""
    at = 0
    while at + 11 <= len(info):
        length, version = struct.unpack_from("<IH", info, at)
        if length >= 0xFFFFFFF0 or version not in (2, 3, 4):
            return None  # 64-bit DWARF or version 5: not read
        end = at + 4 + length
        if at <= position < end:
            abbrev_offset, address_size = struct.unpack_from("<IB", info, at + 6)
            return at + 11, abbrev_offset, address_size
        at = end
    return None


def _member_at(info: bytes, abbrev: bytes, name_at: int, member: str) -> int | None:
    unit = _unit_of(info, name_at)
    if unit is None:
        return None
    _first, abbrev_offset, address_size = unit
    table = _abbreviations(abbrev, abbrev_offset)
    for code_size in (1, 2):  # the DIE starts with its abbreviation code, then its name
        start = name_at - code_size
        try:
            code, at = _uleb(info, start)
        except (IndexError, ElfError):
            continue
        entry = table.get(code)
        if at != name_at or entry is None or entry[0] != _DW_TAG_STRUCTURE or not entry[1] \
                or entry[2][:1] != [(_DW_AT_NAME, _DW_FORM_STRING)]:
            continue
        for _name, form in entry[2]:
            at = _skip(form, info, at, address_size)
        while at < len(info):  # the structure's children: its members
            code, at = _uleb(info, at)
            if code == 0:
                return None
            tag, children, attributes = table.get(code, (0, False, []))
            if not attributes and tag == 0:
                return None
            name, location = None, None
            for attribute, form in attributes:
                if attribute == _DW_AT_NAME and form == _DW_FORM_STRING:
                    end = info.index(b"\0", at)
                    name = info[at:end].decode("utf-8", "replace")
                elif attribute == _DW_AT_LOCATION:
                    location = _location(form, info, at)
                at = _skip(form, info, at, address_size)
            if tag == _DW_TAG_MEMBER and name == member and location is not None:
                return location
            if children:
                return None  # a member with children: not a layout this reader follows
    return None


def _location(form: int, data: bytes, at: int) -> int | None:
    if form == 0x0B:
        return data[at]
    if form == 0x05:
        return int(struct.unpack_from("<H", data, at)[0])
    if form == 0x06:
        return int(struct.unpack_from("<I", data, at)[0])
    if form == 0x0F:
        return _uleb(data, at)[0]
    if form in (0x09, 0x18):  # an expression: DW_OP_plus_uconst N
        size, at = _uleb(data, at)
        if size and data[at] == _DW_OP_PLUS_UCONST:
            return _uleb(data, at + 1)[0]
    return None


def limit_address(path: str, budget: ReadBudget | None = None) -> GoLimitAddress | str:
    """Where the Go binary at ``path`` keeps its thread limit, or why that cannot be known.
    ``budget``: the bytes its tables and DWARF (as inflated) may take of what is shared with
    other binaries; BudgetSpentError (not a verdict on the file) when they are spent."""
    try:
        with ElfFile.open(path, budget) as elf:
            sched = elf.object_address("runtime.sched")
            if sched is None:
                return "no runtime.sched symbol (a stripped binary)"
            info, abbrev = elf.section_data(".debug_info", MAX_DWARF_BYTES), elf.section_data(".debug_abbrev")
            if info is None or abbrev is None:
                return "no DWARF (built with -w)"
            offset = _member_offset(info, abbrev, "runtime.schedt", "maxmcount")
            if offset is None:
                return "no runtime.schedt.maxmcount in its DWARF"
            text = next((seg for seg in elf.segments if seg.flags & 1), None)  # PF_X
            delta = text.vaddr - text.offset if text is not None else 0
            return GoLimitAddress(sched, offset, elf.kind != 2, delta)
    except BudgetSpentError:
        raise
    except (OSError, ElfError, ValueError, IndexError, struct.error) as exc:
        return f"its binary could not be read ({exc})"


def read_limit(procfs: ProcFS, pid: int, where: GoLimitAddress, load_bias: int = 0) -> int | None:
    """The thread limit in force in the Go process ``pid`` now, one 4-byte read of its memory
    through ``procfs`` (None: unreadable, or not a plausible limit)."""
    address = where.sched + where.offset + (load_bias if where.position_independent else 0)
    raw = procfs.read_memory(pid, address, 4)
    if len(raw) != 4:
        return None
    value = int.from_bytes(raw, "little", signed=True)
    return value if 0 < value < 1 << 30 else None
