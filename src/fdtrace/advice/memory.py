"""The memory a connection costs (a fit of memory against sockets) and what to change when a
process's connections do not fit its memory cgroup: the memory half of the needs model, the same
words in doctor, info, the report and the live view."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fdtrace.advice.needs import is_known
from fdtrace.policy import LIMIT_MARGIN, MIB, kib

#: A memory-per-connection fit needs this many samples, over at least this many distinct socket
#: counts spanning at least MIN_SOCKET_SPAN sockets.
MIN_FIT_POINTS, MIN_FIT_LEVELS, MIN_SOCKET_SPAN = 5, 3, 10
#: At most this many points go into a fit (evenly chosen): its pairwise slopes stay bounded.
MAX_FIT_POINTS = 120


@dataclass(frozen=True)
class MemoryFit:
    """Memory against sockets, fitted over one process's samples (Theil-Sen: the median of the
    slopes between every two samples, robust to the odd sample taken during a burst).

    Attributes:
        per_connection: bytes each socket held adds (the slope).
        base: bytes at no sockets (the median intercept).
        spread: half the interquartile range of the pairwise slopes, bytes.
        points: samples used; sockets_from, sockets_to: the range of sockets they cover.
        measure: what memory was fitted: "cgroup usage" or "RSS".
    """

    per_connection: float
    base: float
    spread: float
    points: int
    sockets_from: int
    sockets_to: int
    measure: str

    def at(self, connections: int) -> int:
        """The memory ``connections`` sockets take, bytes."""
        return max(int(self.base + self.per_connection * connections), 0)

    def describe(self) -> str:
        """"about 100 KiB per connection (± 3 KiB; 48 samples, 12 to 1,380 sockets, cgroup usage)"."""
        return (f"about {kib(self.per_connection)} per connection (± {kib(self.spread)}; {self.points} samples, "
                f"{self.sockets_from:,} to {self.sockets_to:,} sockets, {self.measure})")


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def memory_fit(points: list[tuple[int, int]], measure: str) -> MemoryFit | None:
    """The memory a connection costs, from (sockets, bytes) samples of one process; None unless
    the samples cover enough distinct socket counts (its memory must have been seen growing with
    its connections) and the slope is positive."""
    usable = [(int(s), int(b)) for s, b in points if is_known(s) and is_known(b)]
    if len(usable) < MIN_FIT_POINTS or len({s for s, _ in usable}) < MIN_FIT_LEVELS:
        return None
    low, high = min(s for s, _ in usable), max(s for s, _ in usable)
    if high - low < MIN_SOCKET_SPAN:
        return None
    if len(usable) > MAX_FIT_POINTS:
        step = len(usable) / MAX_FIT_POINTS
        usable = [usable[int(i * step)] for i in range(MAX_FIT_POINTS)]
    slopes = [(b2 - b1) / (s2 - s1) for i, (s1, b1) in enumerate(usable) for s2, b2 in usable[i + 1:] if s2 != s1]
    slope = _median(slopes)
    if slope <= 0:
        return None
    ordered = sorted(slopes)
    spread = (ordered[3 * len(ordered) // 4] - ordered[len(ordered) // 4]) / 2
    base = _median([b - slope * s for s, b in usable])
    return MemoryFit(slope, base, spread, len(usable), low, high, measure)


def memory_advice(comm: str, fit: MemoryFit, connections: int, what: str, limit: int | None) -> tuple[int, str, str]:
    """(bytes needed, why, what to change) for ``connections`` of a process whose memory grows by
    ``fit``, against its memory cgroup's ``limit``: the memory half of the needs model, the same
    words in doctor, info and the report. ``what`` says where the connection count comes from."""
    need = fit.at(connections)
    why = f"at {connections:,} connections ({what}) {comm} needs about {kib(need)}, {fit.describe()}"
    if limit is None:
        return need, why, ""
    if need * LIMIT_MARGIN <= limit:
        return need, f"{why}; its cgroup allows {kib(limit)}", ""
    fits = max(int((limit / LIMIT_MARGIN - fit.base) / fit.per_connection), 0)
    raise_to = math.ceil(need * LIMIT_MARGIN / MIB)
    fewer = f"lower maxconn to {fits:,}" if comm.startswith("haproxy") else f"hold at most {fits:,} connections"
    change = (f"{fewer} (what its cgroup holds with the margin) or raise MemoryMax= of its unit (memory.max, "
              f"memory.limit_in_bytes) to {raise_to}M" + (" (and tune.bufsize)" if comm.startswith("haproxy") else ""))
    return need, f"{why}; its cgroup allows {kib(limit)}", change
