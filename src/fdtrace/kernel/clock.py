"""Offsets between the kernel clocks: BPF stamps CLOCK_MONOTONIC, people read wall time."""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import time
from pathlib import Path

from fdtrace.schema.records import ClockOffsets, ClockQuality


def sample_offsets() -> ClockOffsets:
    """Measure the offsets, taking the monotonic reading that brackets the others most tightly."""
    best: tuple[int, int, int, int] | None = None
    for _ in range(5):
        m0 = time.monotonic_ns()
        real = time.clock_gettime_ns(time.CLOCK_REALTIME)
        boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, (m0 + m1) // 2, real, boot)
    assert best is not None
    _, mono, real, boot = best
    return ClockOffsets(mono_ns=mono, realtime_offset_ns=real - mono, boottime_offset_ns=boot - mono)


class _Timex(ctypes.Structure):
    """``struct timex`` of <sys/timex.h> (Linux, LP64 and ILP32 alike through ctypes' alignment)."""

    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long), ("tick", ctypes.c_long),
                ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long), ("shift", ctypes.c_int),
                ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
                ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
                ("reserved", ctypes.c_int * 11)]


TIME_ERROR = 5
STA_UNSYNC = 0x0040
#: chronyc, asked at most this often (it talks to chronyd over a socket: not every round).
CHRONY_EVERY_S = 60.0
CHRONYC = Path("/usr/bin/chronyc")


def adjtimex_quality() -> ClockQuality:
    """The kernel's view of its clock: synchronized or not, estimated and maximum error (µs).
    Reading (modes 0) needs no privilege; unknown fields are None where the call fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    timex = _Timex()
    state = libc.adjtimex(ctypes.byref(timex))
    if state < 0:
        return ClockQuality(None, None, None)
    synchronized = state != TIME_ERROR and not timex.status & STA_UNSYNC
    return ClockQuality(bool(synchronized), int(timex.esterror), int(timex.maxerror))


def parse_chrony_tracking(text: str) -> int | None:
    """How far the system clock is ahead of chronyd's sources (ns; negative: behind), from
    ``chronyc -c tracking``'s CSV line: its 5th field, "System time", is the correction chronyd
    is applying in seconds, positive when the clock is slow. None when the line is not that."""
    fields = text.strip().split(",")
    if len(fields) < 6:
        return None
    try:
        return -round(float(fields[4]) * 1e9)
    except ValueError:
        return None


class ClockQualityReader:
    """adjtimex(2) each round; chronyd's offset every CHRONY_EVERY_S when chronyd runs (through
    root's own /usr/bin/chronyc only, with a short timeout: a hung chronyd cannot hold a round)."""

    def __init__(self) -> None:
        self._chrony_at = -CHRONY_EVERY_S
        self._chrony: int | None = None
        self._has_chrony = _trusted_binary(CHRONYC)

    def read(self) -> ClockQuality:
        quality = adjtimex_quality()
        now = time.monotonic()
        if self._has_chrony and now - self._chrony_at >= CHRONY_EVERY_S:
            self._chrony_at = now
            self._chrony = _ask_chrony()
        return ClockQuality(quality.synchronized, quality.est_error_us, quality.max_error_us, self._chrony)


def _trusted_binary(path: Path) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == 0 and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _ask_chrony() -> int | None:
    try:
        done = subprocess.run([str(CHRONYC), "-c", "-n", "tracking"], capture_output=True, text=True, timeout=1.0,
                              env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"}, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_chrony_tracking(done.stdout) if done.returncode == 0 else None
