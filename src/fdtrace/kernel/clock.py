"""Offsets between the kernel clocks: BPF stamps CLOCK_MONOTONIC, people read wall time."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ClockOffsets:
    """CLOCK_REALTIME - CLOCK_MONOTONIC and CLOCK_BOOTTIME - CLOCK_MONOTONIC, in ns, at ``mono_ns``."""

    mono_ns: int
    realtime_offset_ns: int
    boottime_offset_ns: int


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
