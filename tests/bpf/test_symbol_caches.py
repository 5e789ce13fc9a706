"""bcc's symbol caches hold a descriptor per binary their process maps: the symbolizer keeps them
within SYMBOL_CACHE_DESCRIPTORS together (real processes, bcc's own caches), so the descriptor
budget of --stacks holds however many processes it symbolizes."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdtrace.kernel.loader import BpfTracer
from fdtrace.kernel.stacks import SYMBOL_CACHE_DESCRIPTORS, Symbolizer
from fdtrace.procfs import ProcFS

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(os.geteuid() != 0, reason="reads other processes' maps")]

#: A Python that maps its libraries (about 25 binaries), then waits.
MAPPING = """
import ctypes, decimal, hashlib, json, sqlite3, ssl, sys, zlib
print("up", flush=True)
sys.stdin.readline()
"""
#: Maps COUNT copies of a library (libc), each a binary of its own, executable.
MANY = """
import mmap, os, shutil, sys
folder, count = sys.argv[1], int(sys.argv[2])
maps = []
for i in range(count):
    path = os.path.join(folder, f"copy{i}.so")
    shutil.copy(sys.argv[3], path)
    with open(path, "rb") as f:
        maps.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC, flags=mmap.MAP_PRIVATE))
print("up", flush=True)
sys.stdin.readline()
"""


class Caches:
    """The symbol-cache calls of the loader, on bcc's library (no programs loaded)."""

    symbol_cache = BpfTracer.symbol_cache
    resolve = BpfTracer.resolve
    free_symbol_cache = BpfTracer.free_symbol_cache


def own_fds() -> int:
    return len(os.listdir("/proc/self/fd")) - 1


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    running: list[subprocess.Popen[str]] = []
    yield running
    for process in running:
        process.kill()
        process.wait()


def start(running: list[subprocess.Popen[str]], argv: list[str]) -> int:
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    running.append(process)
    assert process.stdout is not None and process.stdout.readline() == "up\n"
    return process.pid


#: Functions of libc, one per process symbolized (an address seen before needs no cache).
FUNCTIONS = ("printf", "puts", "malloc", "free", "strlen", "memcpy", "socket")


def libc_address(pid: int, function: str = "printf") -> int:
    """Where a function of this process's libc (by its offset in the file) lies in the process."""
    address = ctypes.cast(getattr(ctypes.CDLL("libc.so.6"), function), ctypes.c_void_p).value or 0
    mine = next(m for m in ProcFS().executable_maps(os.getpid()) if m[0] <= address < m[1])
    at = address - mine[0] + mine[2]  # its offset in the file
    theirs = next(m for m in ProcFS().executable_maps(pid) if (m[3], m[4]) == (mine[3], mine[4]))
    return theirs[0] + at - theirs[2]


def test_the_caches_of_many_processes_hold_no_more_than_their_share(started: list[subprocess.Popen[str]]) -> None:
    pids = [start(started, [sys.executable, "-S", "-c", MAPPING]) for _ in range(6)]
    binaries = len({(d, i) for _s, _e, _o, d, i, p in ProcFS().executable_maps(pids[0]) if i and p.startswith("/")})
    assert 2 * (binaries + 2) <= SYMBOL_CACHE_DESCRIPTORS < 6 * (binaries + 1)  # all six would not fit
    symbolizer = Symbolizer(Caches())
    before = own_fds()
    try:
        for pid, name in zip(pids, FUNCTIONS, strict=False):
            symbolizer.begin()
            text, function = symbolizer.frame(pid, libc_address(pid, name))
            assert function is not None and "[libc.so.6]" in text, text
            assert own_fds() - before <= SYMBOL_CACHE_DESCRIPTORS
        assert len(symbolizer._caches) == SYMBOL_CACHE_DESCRIPTORS // (binaries + 2)
    finally:
        symbolizer.close()
    assert own_fds() == before


def test_a_process_mapping_more_binaries_than_the_caches_may_hold_gets_none(
        started: list[subprocess.Popen[str]], tmp_path: Path) -> None:
    library = next(m[5] for m in ProcFS().executable_maps(os.getpid()) if "libc.so" in m[5])
    pid = start(started, [sys.executable, "-S", "-c", MANY, str(tmp_path), str(SYMBOL_CACHE_DESCRIPTORS), library])
    symbolizer = Symbolizer(Caches())
    before = own_fds()
    try:
        symbolizer.begin()
        text, function = symbolizer.frame(pid, libc_address(pid))
        assert function is None and text.startswith("[libc.so.6]+0x"), text  # module and offset only
        assert pid in symbolizer.too_many_binaries and own_fds() == before
    finally:
        symbolizer.close()
