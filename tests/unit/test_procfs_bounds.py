"""Every /proc read is bounded in bytes, whatever the file holds: a system-wide file, a process's
file, its maps and its memory (ProcFS over a tree the test makes, and fdtrace's own memory)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from fdtrace.procfs import ProcFS
from fdtrace.procfs import reader as reader_module
from tests.fakeproc import write_files


def test_a_system_file_is_read_up_to_its_bound(tmp_path: Path) -> None:
    write_files(tmp_path, {"loadavg": "0.5 " * 1000, "sys/fs/file-nr": "4096\t0\t9223372036854775807\n"})
    procfs = ProcFS(tmp_path)
    assert procfs.system_text("loadavg", 100) == ("0.5 " * 25)
    assert len(procfs.system_text("loadavg") or "") == 4000  # under the default bound: whole
    assert procfs.system_number("sys/fs/file-nr") == 4096
    assert procfs.system_text("missing") is None


def test_a_process_file_is_read_up_to_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = "00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/dbus-daemon\n"
    write_files(tmp_path, {"42/status": "Name:\tx\n" + "Pad:\t" + "y" * 5000 + "\nUid:\t1000\t0\t0\t0\n",
                           "42/maps": line * 100})
    procfs = ProcFS(tmp_path)
    assert procfs.real_uid(42) is None  # its Uid line lies past the 4 KiB read for it
    assert len(procfs.read_bytes(42, "status", 10)) == 10
    monkeypatch.setattr(reader_module, "MAX_MAPS_BYTES", 10 * len(line))
    assert len(procfs.executable_maps(42)) == 10  # the maps past the bound are not seen


def test_a_memory_read_is_bounded_and_fails_quietly() -> None:
    buffer = ctypes.create_string_buffer(b"fdtrace" * 1000, 7000)
    address = ctypes.addressof(buffer)
    procfs = ProcFS()
    assert procfs.read_memory(os.getpid(), address, 7) == b"fdtrace"
    with procfs.memory(os.getpid()) as memory:
        assert memory.read(address, 1 << 30)[:14] == b"fdtracefdtrace"  # asked 1 GiB: given at most the bound
        assert len(memory.read(address, 1 << 30)) <= reader_module.MAX_MEMORY_READ
        assert memory.read(-1, 8) == b"" and memory.read(1 << 63, 8) == b"" and memory.read(address, 0) == b""
    assert procfs.read_memory(2 ** 22 + 7, address, 8) == b""  # no such process: nothing, no error
