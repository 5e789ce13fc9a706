"""fdtrace's ELF reader on a real binary, and on binaries damaged as another user could: every
name it gives is the one nm gives, and whatever the bytes, it raises only ElfError or OSError."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from fdtrace.procfs.elf import ElfError, ElfFile, demangled, read_module

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")

SOURCE = """
int helper_one(int x) { return x * 3 + 1; }
int helper_two(int x) { return helper_one(x) - 2; }
int main(int argc, char **argv) { (void)argv; return helper_two(argc); }
"""


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("elf")
    (folder / "p.c").write_text(SOURCE)
    out = folder / "p"
    subprocess.run(["gcc", "-O0", "-o", str(out), str(folder / "p.c")], check=True, timeout=60)
    return out


def nm_functions(path: Path) -> dict[str, int]:
    lines = subprocess.run(["nm", "--defined-only", str(path)], capture_output=True, text=True, check=True).stdout
    return {parts[2]: int(parts[0], 16) for parts in (line.split() for line in lines.splitlines())
            if len(parts) == 3 and parts[1] in "Tt"}


def test_names_and_offsets_are_nm_s(binary: Path) -> None:
    module = read_module(str(binary))
    assert module.symbols is not None
    for name, vaddr in nm_functions(binary).items():
        if name not in ("helper_one", "helper_two", "main"):
            continue
        with ElfFile.open(str(binary)) as elf:
            offset = elf.offset_of_vaddr(vaddr + 4)
        assert offset is not None
        assert module.resolve(offset) == (name, 4)
        assert module.symbols.address_of(name) == vaddr


def test_damaged_binaries_raise_only_elf_or_os_errors(binary: Path, tmp_path: Path) -> None:
    data = binary.read_bytes()
    rng = random.Random(7)
    damaged = tmp_path / "damaged"
    for case in range(300):
        raw = bytearray(data)
        if case % 3 == 0:
            raw = raw[: rng.randrange(len(raw))]
        for _ in range(rng.randrange(1, 40)):
            at = rng.randrange(min(len(raw), 4096) if case % 2 else len(raw)) if raw else 0
            if raw:
                raw[at] = rng.randrange(256)
        damaged.write_bytes(bytes(raw))
        try:
            module = read_module(str(damaged))
            if module.symbols is not None:
                module.resolve(rng.randrange(len(raw) or 1))
        except (ElfError, OSError):
            pass


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError):
        read_module(str(fifo))


def test_cxx_names_are_demangled() -> None:
    assert demangled("_ZN3foo3barEi") == "foo::bar(int)"
    assert demangled("main.main") == "main.main"


def test_a_table_in_a_sparse_tail_is_refused_and_a_budget_is_shared(binary: Path, tmp_path: Path) -> None:
    """Issue 37 B: a table is read only where the file holds its bytes on disk (a 64 MiB hole is
    not), and a budget shared across files stops reads past it without judging the file."""
    import struct

    from fdtrace.procfs.elf import BudgetSpentError, ReadBudget

    copy = tmp_path / "sparse"
    data = bytearray(binary.read_bytes())
    shoff, = struct.unpack_from("<Q", data, 0x28)
    entry, count = struct.unpack_from("<HH", data, 0x3A)
    for index in range(count):
        at = shoff + index * entry
        if struct.unpack_from("<I", data, at + 4)[0] == 2:  # .symtab: its strings to the tail
            strings = shoff + struct.unpack_from("<I", data, at + 0x28)[0] * entry
            struct.pack_into("<QQ", data, strings + 0x18, 64 << 20, 64 << 20)
    copy.write_bytes(data)
    os.truncate(copy, 128 << 20)
    assert os.stat(copy).st_blocks * 512 < 1 << 20
    with pytest.raises(ElfError, match="sparse"):
        read_module(str(copy))
    budget = ReadBudget(1 << 20)
    assert read_module(str(binary), budget).symbols is not None and 0 < budget.spent < 1 << 20
    budget.spent = budget.limit - 1
    with pytest.raises(BudgetSpentError):
        read_module(str(binary), budget)
    budget.renew()
    assert read_module(str(binary), budget).symbols is not None


def test_code_mapped_from_a_file_that_is_not_elf_is_no_shortfall(binary: Path, tmp_path: Path) -> None:
    """JIT code and libffi's trampolines run from files that are not ELF: nothing to read, nothing
    counted; a truncated ELF mapped the same way is counted as a binary left unread."""
    import mmap

    from fdtrace.kernel.stacks import Symbolizer

    trampoline = tmp_path / "ffi-trampoline"
    trampoline.write_bytes(b"\xc3" * mmap.PAGESIZE)  # ret, ret, ...: code, but no ELF header
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(binary.read_bytes()[:mmap.PAGESIZE])  # its section headers cut away
    symbolizer = Symbolizer()
    mapped = []
    for path in (trampoline, truncated):
        with open(path, "rb") as file:
            mapped.append(mmap.mmap(file.fileno(), mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_EXEC))
    try:
        symbolizer.begin()
        starts = {path: start for start, _end, _offset, _dev, _ino, path in symbolizer.executable_maps(os.getpid())}
        assert str(trampoline) in starts and str(truncated) in starts
        symbolizer.frame(os.getpid(), starts[str(trampoline)] + 4)
        assert symbolizer.unread["unreadable"] == 0
        symbolizer.frame(os.getpid(), starts[str(truncated)] + 4)
        assert symbolizer.unread["unreadable"] == 1
    finally:
        for area in mapped:
            area.close()
