"""The values an update carries, declared once, next to the tables they are written to.

Producers (the kernel session, the /proc sampler, the phase reader) make them; the Parquet sink
writes them and replay reads them back through one codec per table (``fdtrace.schema.codecs``);
the live view shows them. None of those consumers needs to import the producer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProcessSample:
    """One process at one moment."""

    pid: int
    start_ns: int
    comm: str
    open_fds: int
    fd_soft_limit: int | None
    fd_hard_limit: int | None
    threads: int
    sockets: int | None
    cmdline: str | None = None
    #: Real user id; RLIMIT_NPROC counts all threads of this user.
    uid: int | None = None
    #: RLIMIT_NPROC soft limit; None when unlimited or not enforced (root is not held to it).
    nproc_soft_limit: int | None = None
    #: Threads of all processes of ``uid``, counted only when ``nproc_soft_limit`` applies.
    user_threads: int | None = None
    #: Tasks and limit of the tightest cgroup pids.max over the process; None when none applies.
    pids_current: int | None = None
    pids_max: int | None = None
    #: A Go program's thread limit, read from its memory (what debug.SetMaxThreads set), or Go's
    #: default 10000 when it cannot be read (``go_limit_unread`` says why); None for other programs.
    go_max_threads: int | None = None
    go_limit_unread: str | None = None
    #: Where it runs (``fdtrace.procfs.containers.placement``): cgroup, systemd unit, container, pod.
    cgroup: str | None = None
    unit: str | None = None
    container_id: str | None = None
    container_runtime: str | None = None
    pod_uid: str | None = None
    #: Resident memory in kB, split as the OOM killer splits it (None: not in its status).
    rss_anon_kb: int | None = None
    rss_file_kb: int | None = None
    rss_shmem_kb: int | None = None
    #: The memory cgroup that leaves it the least to spare (its own or an ancestor's): limit and
    #: usage in bytes, and the OOM kills in it so far; None when no cgroup limits its memory.
    memcg_limit_bytes: int | None = None
    memcg_usage_bytes: int | None = None
    memcg_oom_kills: int | None = None

    @property
    def rss_kb(self) -> int | None:
        """Resident memory in all (kB)."""
        parts = [self.rss_anon_kb, self.rss_file_kb, self.rss_shmem_kb]
        return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


@dataclass(frozen=True)
class SiteRow:
    """Open descriptors of one process made at one call site (a row of ``fd_sites``)."""

    pid: int
    comm: str
    origin: str  # "traced" or "before_tracing"
    stack_id: int | None
    open: int
    opened: int | None
    closed: int | None
    oldest_ns: int | None


@dataclass(frozen=True)
class Stack:
    """One symbolized stack.

    Attributes:
        stack_id: the BPF programs' id (a hash of the process and its addresses).
        pid: the process it belongs to.
        comm: its task name when read.
        frames: innermost first, "function+0xoffset [module]".
        truncated: why outer frames may be missing, or None when the walk reached a thread's start.
        mono_ns: when it was read.
    """

    stack_id: int
    pid: int
    comm: str
    frames: tuple[str, ...]
    truncated: str | None
    mono_ns: int


@dataclass(frozen=True)
class ThreadState:
    """One group of a census.

    Attributes:
        syscall: the syscall's name, "running" (on a CPU), or "user" (blocked outside any syscall,
            a page fault for instance).
        fd_kind: for syscalls on a descriptor: socket, dns (a UDP socket connected to port 53),
            pipe, file, directory, device, anon:<name> (eventfd, eventpoll, ...) or unknown; None
            otherwise.
        threads: how many threads are in it.
        site: the function of the program its threads wait in (``thread_census``'s ``site_of``),
            None where not looked for or not found.
    """

    syscall: str
    fd_kind: str | None
    threads: int
    site: str | None = None


@dataclass(frozen=True)
class ClockQuality:
    """What the host itself knows of its wall clock's quality (adjtimex(2), chronyd)."""

    synchronized: bool | None
    est_error_us: int | None
    max_error_us: int | None
    chrony_offset_ns: int | None = None


@dataclass(frozen=True)
class ClockOffsets:
    """CLOCK_REALTIME - CLOCK_MONOTONIC and CLOCK_BOOTTIME - CLOCK_MONOTONIC, in ns, at ``mono_ns``."""

    mono_ns: int
    realtime_offset_ns: int
    boottime_offset_ns: int
    quality: ClockQuality | None = None  # read each round by live sources


@dataclass(frozen=True)
class PhaseNow:
    """Where one process of a training job is now.

    ``phase`` is the innermost phase in progress (``allreduce`` inside ``backward``), ``""``
    between phases; ``since_wall_ns`` is when it began (or when the last one ended)."""

    pid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    step: int
    phase: str
    name: str
    since_wall_ns: int

    @property
    def label(self) -> str:
        """``allreduce``, ``user:eval``, or ``-`` between phases."""
        if not self.phase:
            return "-"
        return f"user:{self.name}" if self.phase == "user" and self.name else self.phase


@dataclass(frozen=True)
class ThreadCensus:
    """What one process's threads were doing at a round (a group of ``thread_census`` rows)."""

    pid: int
    comm: str
    states: list[ThreadState]


@dataclass
class EventBatch:
    """Events handed out by one poll of a source, in the column layout of ``schema.EVENT_FIELDS``:
    read from the kernel (``kernel.session``) or played back from a recording (``sources.replay``).

    Attributes:
        events: a ``pyarrow.Table`` with the schema of ``schema.arrow_schema()``.
        mono_ns: the time of the poll (CLOCK_MONOTONIC; a replay's virtual wall clock).
        losses: cumulative loss and overflow counters (``schema.STATS``) then.
        stacks: --stacks: the stacks these events name that no earlier batch gave.
        connections: rows of the connections table (``TraceOptions.connections``), or None.
    """

    events: Any
    mono_ns: int
    losses: dict[str, int] = field(default_factory=dict)
    stacks: list[Stack] = field(default_factory=list)
    connections: Any = None

    def __len__(self) -> int:
        return int(self.events.num_rows)


@dataclass
class ProcessTotals:
    """Exact in-kernel counts of one process instance, identified by (pid, first_ts), as the kernel
    package reads them and the ``counters`` table keeps them (``schema.COUNTERS`` in ``counts``)."""

    pid: int
    first_ts: int
    comm: str
    exit_ts: int | None
    counts: dict[str, int]
    errors: dict[tuple[str, str], int] = field(default_factory=dict)  # (syscall, errno) -> calls

    def as_dict(self) -> dict[str, Any]:
        """A flat dict, errors as ``{"syscall:ERRNO": count}``."""
        row: dict[str, Any] = {"pid": self.pid, "first_ts": self.first_ts, "comm": self.comm,
                               "exit_ts": self.exit_ts, **self.counts}
        row["errors"] = {f"{sc}:{err}": n for (sc, err), n in sorted(self.errors.items())}
        return row
