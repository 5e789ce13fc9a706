"""The memory a connection costs (a fit of memory against sockets) and what to change when a
process's connections do not fit its memory cgroup, or its cgroup nears its limit: the memory
half of the needs model. ``memory_change`` is the one rule; doctor, info, the report and the live
view render the ``MemoryAdvice`` it returns (the same words and numbers in each)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from fdtrace.advice.change import Change, near_limit, raised
from fdtrace.advice.needs import is_known
from fdtrace.fits import theil_sen
from fdtrace.policy import LIMIT_MARGIN
from fdtrace.units import MIB, kib

#: A memory-per-connection fit needs this many samples, over at least this many distinct socket
#: counts spanning at least MIN_SOCKET_SPAN sockets.
MIN_FIT_POINTS, MIN_FIT_LEVELS, MIN_SOCKET_SPAN = 5, 3, 10
#: At most this many points go into a fit, each a bucket of socket counts: its pairwise slopes, and
#: the live view's memory per process, stay bounded (``MemoryLevels``).
MAX_FIT_POINTS = 64
#: Where a memory cgroup's limit is set when its unit is not known.
MEMORY_PLACES = "MemoryMax= of its unit (memory.max, memory.limit_in_bytes)"


@dataclass(frozen=True)
class MemoryFit:
    """Memory against sockets, fitted over one process's samples (``fits.theil_sen``: the median
    of the slopes between every two samples, robust to the odd sample taken during a burst).

    Attributes:
        per_connection: bytes each socket held adds (the slope).
        base: bytes at no sockets (the median intercept).
        spread: half the interquartile range of the pairwise slopes, bytes.
        points: socket counts used (each the mean of its samples);
        sockets_from, sockets_to: the range of sockets they cover.
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


class MemoryLevels:
    """(sockets, memory) samples summed per bucket of socket counts: at most ``MAX_FIT_POINTS``
    buckets, each ``width`` counts wide; when one more would not fit, the width doubles and
    neighbours merge. The width is then the smallest power of two that keeps the socket counts
    seen within the bound, whatever their order, and the sums are integers: the live view (adding
    samples as they come) and the report (adding its SQL sums per count) hold the same buckets."""

    __slots__ = ("buckets", "high", "low", "width")

    def __init__(self) -> None:
        self.width = 1
        self.buckets: dict[int, list[int]] = {}  # sockets // width -> [sum of sockets, sum of memory, samples]
        self.low: int | None = None
        self.high: int | None = None

    def add(self, sockets: int, memory: int, samples: int = 1) -> None:
        """Take ``samples`` samples at ``sockets`` sockets whose memory adds up to ``memory``."""
        key = sockets // self.width
        while key not in self.buckets and len(self.buckets) >= MAX_FIT_POINTS:
            self.width *= 2
            merged: dict[int, list[int]] = {}
            for old_key, (socket_sum, memory_sum, count) in self.buckets.items():
                bucket = merged.setdefault(old_key // 2, [0, 0, 0])
                bucket[0] += socket_sum
                bucket[1] += memory_sum
                bucket[2] += count
            self.buckets = merged
            key = sockets // self.width
        bucket = self.buckets.setdefault(key, [0, 0, 0])
        bucket[0] += sockets * samples
        bucket[1] += memory
        bucket[2] += samples
        self.low = sockets if self.low is None else min(self.low, sockets)
        self.high = sockets if self.high is None else max(self.high, sockets)

    def points(self) -> list[tuple[float, float]]:
        """(mean sockets, mean memory) of each bucket, in the order of the socket counts."""
        return [(socket_sum / count, memory_sum / count)
                for _key, (socket_sum, memory_sum, count) in sorted(self.buckets.items())]


def memory_levels(points: Iterable[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(sockets, total bytes, samples) per distinct socket count of (sockets, bytes) samples, in
    the order of the socket counts: what a fit is made of, whoever collected the samples (the
    report sums them in SQL, the live view as they come; integer sums, so both agree exactly)."""
    levels: dict[int, list[int]] = {}
    for sockets, memory in points:
        if is_known(sockets) and is_known(memory):
            level = levels.setdefault(int(sockets), [0, 0])
            level[0] += int(memory)
            level[1] += 1
    return [(s, total, n) for s, (total, n) in sorted(levels.items())]


def memory_fit(points: Iterable[tuple[int, int]], measure: str) -> MemoryFit | None:
    """The memory a connection costs, from (sockets, bytes) samples of one process
    (``memory_fit_levels`` over their ``memory_levels``)."""
    return memory_fit_levels(memory_levels(points), measure)


def memory_fit_levels(levels: Iterable[tuple[int, int, int]], measure: str) -> MemoryFit | None:
    """The memory a connection costs, from (sockets, total bytes, samples) per socket count of
    one process (``memory_fit_buckets`` over their ``MemoryLevels``). The same levels give the
    same fit in any order."""
    buckets = MemoryLevels()
    for sockets, total, count in levels:
        if is_known(sockets) and is_known(total) and count > 0:
            buckets.add(int(sockets), int(total), int(count))
    return memory_fit_buckets(buckets, measure)


def memory_fit_buckets(levels: MemoryLevels, measure: str) -> MemoryFit | None:
    """The memory a connection costs, each bucket's mean memory against its mean socket count one
    point; None unless the points cover enough socket counts (its memory must have been seen
    growing with its connections) and the slope is positive."""
    usable = levels.points()
    if len(usable) < MIN_FIT_POINTS or len(usable) < MIN_FIT_LEVELS or levels.low is None or levels.high is None:
        return None
    if levels.high - levels.low < MIN_SOCKET_SPAN:
        return None
    line = theil_sen(usable)
    if line is None or line.slope <= 0:
        return None
    return MemoryFit(line.slope, line.intercept, line.spread, len(usable), levels.low, levels.high, measure)


def connections_to_hold(maxconn: int | None, fd_recommended: int | None) -> tuple[int | None, str]:
    """How many connections a process must hold, and whence: HAProxy's maxconn, else the FD limit
    the needs model recommends for it (each descriptor a connection, at most); (None, "") when
    neither is known."""
    if is_known(maxconn) and maxconn is not None and int(maxconn) > 0:
        return int(maxconn), "its maxconn"
    if is_known(fd_recommended) and fd_recommended is not None and int(fd_recommended) > 0:
        return int(fd_recommended), "the FD limit recommended for it"
    return None, ""


@dataclass(frozen=True)
class MemoryAdvice:
    """What ``memory_change`` says of one process's memory.

    Attributes:
        need: bytes its connections need (None without a fit and a number of connections).
        why: the need in words, or the fit alone ("" when there is neither).
        change: the MemoryMax to set (its value in bytes, whole MiB), None when nothing is to change.
    """

    need: int | None
    why: str
    change: Change | None


def memory_max(value: int) -> str:
    """A MemoryMax value as systemd takes it: whole MiB ("215M")."""
    return f"{math.ceil(value / MIB)}M"


def _memory_place(unit: str | None) -> str:
    if unit and unit.endswith(".service"):
        return f"MemoryMax= in [Service] of {unit} (memory.max of its cgroup)"
    return MEMORY_PLACES


def memory_change(comm: str, limit: int | None, peak: int | None = None, fit: MemoryFit | None = None,
                  connections: int | None = None, what: str = "", unit: str | None = None) -> MemoryAdvice:
    """The one memory rule of doctor, info, the report and the live view, for a process whose
    memory cgroup allows ``limit`` bytes (None: no limit) and peaked at ``peak``:

    - with a ``fit`` and ``connections`` to hold (``connections_to_hold``; ``what`` says whence),
      the memory they need; when that with the margin is over the limit, MemoryMax raised to it
      (or, for HAProxy, maxconn lowered to what the limit holds);
    - else, when the peak is near the limit (``near_limit``), MemoryMax raised to the peak with
      the margin.

    The MemoryMax advised is always above the limit in force (never lower), in whole MiB, set in
    the process's systemd unit when ``unit`` names a service, else in the generic places."""
    where = _memory_place(unit)
    allows = f"; its cgroup allows {kib(limit)}" if limit is not None else ""
    if fit is not None and connections is not None and connections > 0:
        need = fit.at(connections)
        why = f"at {connections:,} connections ({what}) {comm} needs about {kib(need)}, {fit.describe()}{allows}"
        if limit is not None and need * LIMIT_MARGIN > limit:
            value = math.ceil(need * LIMIT_MARGIN / MIB) * MIB
            fits = max(int((limit / LIMIT_MARGIN - fit.base) / fit.per_connection), 0)
            haproxy = comm.startswith("haproxy")
            fewer = (f"lower maxconn to {fits:,}" if haproxy else f"hold at most {fits:,} connections") + \
                " (what its cgroup holds with the margin) or " if fits > 0 else ""
            command = (f"{fewer}raise {where} to {memory_max(value)}" + (" (and tune.bufsize)" if haproxy else ""))
            return MemoryAdvice(need, why, Change("MemoryMax", value, where, command, why))
        return MemoryAdvice(need, why, None)
    why = fit.describe() if fit is not None else ""
    if limit is not None and peak is not None and near_limit(peak, limit):
        target = raised(peak, limit)
        if target is not None:
            value = math.ceil(target / MIB) * MIB
            reason = f"its cgroup peaked at {kib(peak)} of {kib(limit)}"
            command = f"raise {where} to {memory_max(value)}, or find what holds the memory"
            return MemoryAdvice(None, why, Change("MemoryMax", value, where, command, reason))
    return MemoryAdvice(None, why, None)
