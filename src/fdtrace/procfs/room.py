"""Whether a watched process has room for a descriptor fdtrace would cost it: the one rule for
every probe of fdtrace's that makes another process take a descriptor (a connection to HAProxy's
stats socket, from ``record``, ``top``, ``export`` and ``doctor``). fdtrace must never be the cause
of the EMFILE it counts, so the count is read just before the probe, never taken from a sample,
and the probe needs a margin (``policy.probe_room``), not merely one free descriptor."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from fdtrace.policy import probe_room
from fdtrace.procfs.reader import READ_ERRORS, ProcFS, skip_reason


@dataclass(frozen=True)
class Room:
    """A process's descriptors now.

    Attributes:
        pid: the process.
        open_fds: its open descriptors (with a bounded count, at least this many: see ``counted``).
        soft_limit: its RLIMIT_NOFILE soft limit (None: unlimited).
        needed: descriptors that must be free for a probe (``probe_room`` of the limit).
        counted: "size" (the fd folder's size, Linux >= 6.2) or "listed" (a listing, stopped once
            the process was known to have too little room).
    """

    pid: int
    open_fds: int
    soft_limit: int | None
    needed: int
    counted: str
    pending: int = 0
    growth: int = 0

    @property
    def free(self) -> int | None:
        return None if self.soft_limit is None else self.soft_limit - self.open_fds

    @property
    def enough(self) -> bool:
        return self.free is None or self.free >= self.needed + PER_PENDING * self.pending + \
            GROWTH_SPANS * self.growth

    def refusal(self, what: str) -> str:
        """Why ``what`` ("haproxy [12]") is not probed now, in words."""
        more = "at least " if self.counted == "listed" else ""
        waiting = (f" and {self.pending} connections waiting to be accepted (up to {PER_PENDING} descriptors each)"
                   if self.pending else "")
        rising = f", {self.growth} more in {GROWTH_GAP_S * 1000:.0f} ms" if self.growth else ""
        return (f"{what} has {more}{self.open_fds} of its {self.soft_limit} descriptors open{waiting}{rising}, "
                f"fewer than {self.needed} free: a connection of fdtrace's could fail one of its own with EMFILE")


def open_fds_bounded(procfs: ProcFS, pid: int, stop_at: int) -> tuple[int, str]:
    """(open descriptors, how counted): the size of /proc/PID/fd where the kernel gives it
    (Linux >= 6.2, O(1)), else a listing that stops at ``stop_at`` entries (a process with 100k
    descriptors is not listed whole to learn that it has too many)."""
    folder = f"{procfs.root}/{pid}/fd"
    try:
        size = os.stat(folder).st_size
    except OSError:
        size = 0
    if size > 0:
        return size, "size"
    count = 0
    with os.scandir(folder) as entries:  # an OSError (gone, not readable) is the caller's
        for _ in entries:
            count += 1
            if count >= stop_at:
                break
    return count, "listed"


#: Descriptors a connection waiting in a listener's accept queue may cost once accepted (a proxy's
#: client and server sides).
PER_PENDING = 2
#: Lines of /proc/net/tcp{,6} read at most for the accept queues; a process's socket links at most.
MAX_TCP_LINES = 200_000
MAX_LINKS_LISTED = 10_000


def pending_accepts(procfs: ProcFS, pid: int) -> int:
    """Connections waiting in the accept queues of ``pid``'s listening TCP sockets: the burst it
    takes next whatever fdtrace reads of it now (after a storm, a haproxy at its limit takes its
    whole backlog as descriptors free, two each). 0 when they cannot be read (a process with more
    than ``MAX_LINKS_LISTED`` descriptors is not listed)."""
    try:
        if procfs.open_fds(pid, by_size=True) > MAX_LINKS_LISTED:
            return 0
        inodes = {target[8:-1] for target in procfs.fd_targets(pid) if target.startswith("socket:[")}
    except READ_ERRORS:
        return 0
    waiting, lines = 0, 0
    for table in ("net/tcp", "net/tcp6"):
        try:
            with open(procfs.root / str(pid) / table, encoding="ascii", errors="replace") as rows:  # its namespace's
                for line in rows:
                    lines += 1
                    if lines > MAX_TCP_LINES:
                        return waiting
                    fields = line.split()
                    # sl local rem st tx_queue:rx_queue ... inode: a listener's rx_queue is its accept queue
                    if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:
                        waiting += int(fields[4].partition(":")[2] or "0", 16)
        except (OSError, ValueError):
            continue
    return waiting


#: The count is read twice this far apart: a process whose descriptors rise between the two reads
#: (a storm beginning) needs room for GROWTH_SPANS times that rise as well, the time fdtrace's
#: connection may wait for its turn on a busy host.
GROWTH_GAP_S = 0.01
GROWTH_SPANS = 10


def room_of(procfs: ProcFS, pid: int, gap_s: float = GROWTH_GAP_S) -> Room:
    """``pid``'s room now: its limit, its count, the connections waiting in its accept queues,
    and its count again ``gap_s`` later (the last read nearest the probe). Raises one of
    ``READ_ERRORS`` when it cannot be read (gone, not readable)."""
    soft = procfs.limits(pid).get("Max open files", (None, None))[0]
    needed = probe_room(soft) if soft is not None else 0
    stop_at = max(soft - needed + 1, 1) if soft is not None else 1 << 30
    before, _ = open_fds_bounded(procfs, pid, stop_at)
    pending = pending_accepts(procfs, pid) if soft is not None else 0
    if gap_s:
        time.sleep(gap_s)
    count, how = open_fds_bounded(procfs, pid, stop_at)
    return Room(pid, count, soft, needed, how, pending, max(0, count - before))


def refusal(procfs: ProcFS, pid: int, what: str) -> str | None:
    """Why ``pid`` (named ``what``) must not be made to take a descriptor now, or None when it has
    room. A process whose room cannot be read is not probed either (its reason says why)."""
    try:
        room = room_of(procfs, pid)
    except READ_ERRORS as error:
        return f"the descriptors of {what} could not be counted ({skip_reason(error)})"
    return None if room.enough else room.refusal(what)
