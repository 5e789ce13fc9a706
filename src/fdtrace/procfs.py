"""Reading /proc with psutil's manners: a configurable root, and a process that vanished
mid-read is "gone" (None), never an exception."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TICK_NS = 1_000_000_000 // CLOCK_TICKS


class ProcFS:
    """Access to one procfs tree (``/proc`` unless a test passes another root)."""

    def __init__(self, root: str | Path = "/proc") -> None:
        self.root = Path(root)

    def start_ns(self, pid: int) -> int | None:
        """Process start in CLOCK_BOOTTIME ns (field 22 of stat, tick resolution), None if gone."""
        try:
            stat = (self.root / str(pid) / "stat").read_bytes()
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError, PermissionError):
            return None
        # comm may hold spaces and parentheses: the fields start after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        try:
            return int(fields[19]) * TICK_NS
        except (IndexError, ValueError):
            return None


class StartTimeResolver:
    """Gives each event's process its start time, so that (pid, start_ns) survives PID reuse.

    Processes seen starting get the start computed from the event's own stamp (the kernel takes
    its start time moments before the tracepoint fires); others are read from /proc once and
    cached until their exit event.
    """

    def __init__(self, procfs: ProcFS | None = None, max_cached: int = 65536) -> None:
        self.procfs = procfs or ProcFS()
        self.max_cached = max_cached
        self._cache: dict[int, int | None] = {}

    def started(self, pid: int, ts_ns: int, boottime_offset_ns: int) -> int:
        """Note a process_start seen at ``ts_ns`` (monotonic) and return its start time."""
        start = (ts_ns + boottime_offset_ns) // TICK_NS * TICK_NS
        self._remember(pid, start)
        return start

    def lookup(self, pid: int) -> int | None:
        """The start time of a live (or recently seen) process."""
        if pid in self._cache:
            return self._cache[pid]
        start = self.procfs.start_ns(pid)
        self._remember(pid, start)  # None too: a gone process is not looked for again
        return start

    def exited(self, pid: int) -> None:
        """Forget a process after its exit: the pid may be reused."""
        self._cache.pop(pid, None)

    def _remember(self, pid: int, start: int | None) -> None:
        if len(self._cache) >= self.max_cached:
            self._cache.pop(next(iter(self._cache)))
        self._cache[pid] = start
