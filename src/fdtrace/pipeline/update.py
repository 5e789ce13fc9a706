"""What flows through the pipeline: one typed update per poll of a source."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fdtrace.schema.records import ThreadCensus

if TYPE_CHECKING:
    from fdtrace.kernel.counters import CounterStore
    from fdtrace.schema.records import ClockOffsets, PhaseNow, ProcessSample, SiteRow, Stack

#: A row of system figures (the ``system`` table's columns but ts_ns and time).
SystemFigures = dict[str, "int | None"]
#: A row of HAProxy's `show info` (the ``haproxy`` table's columns but ts_ns and time).
HaproxyRow = dict[str, "int | str | None"]


class ArrowTable(Protocol):
    """The part of ``pyarrow.Table`` the pipeline relies on (pyarrow ships no type stubs)."""

    @property
    def num_rows(self) -> int: ...

    def __getitem__(self, key: str) -> Any: ...


@dataclass
class SampleRound:
    """One sampling round of /proc (and of HAProxy's stats sockets).

    Attributes:
        mono_ns: CLOCK_MONOTONIC of the round on the traced host (the tables' ``ts_ns``).
        time_ns: its wall time.
        samples: the processes sampled.
        system: the system figures (None when the round had none).
        haproxy: `show info` rows (--haproxy-socket).
        clock: the clock offsets measured at the round (live only).
        fd_sites: --stacks: call sites whose open descriptors changed since the last round.
        threads: thread census of the processes nearest a thread limit.
        cost_s: seconds the round's /proc sampling took (live; None: not measured).
        unsampled: processes the round left out when its time ran out (sampled in later rounds).
    """

    mono_ns: int
    time_ns: int
    samples: list[ProcessSample]
    system: SystemFigures | None
    haproxy: list[HaproxyRow] = field(default_factory=list)
    clock: ClockOffsets | None = None
    fd_sites: list[SiteRow] = field(default_factory=list)
    threads: list[ThreadCensus] = field(default_factory=list)
    cost_s: float | None = None
    unsampled: int = 0

    def then(self, newer: SampleRound) -> SampleRound:
        """This round and a newer one as one, for a consumer that holds rounds back: each
        process's and each call site's latest sample, the newer figures where it has them, at
        the newer round's time."""
        samples = {sample.pid: sample for sample in self.samples}
        samples.update((sample.pid, sample) for sample in newer.samples)
        sites = {(site.pid, site.origin, site.stack_id): site for site in self.fd_sites}
        sites.update(((site.pid, site.origin, site.stack_id), site) for site in newer.fd_sites)
        threads = {entry.pid: entry for entry in self.threads}
        threads.update((entry.pid, entry) for entry in newer.threads)
        return SampleRound(mono_ns=newer.mono_ns, time_ns=newer.time_ns, samples=list(samples.values()),
                           system=newer.system or self.system, haproxy=newer.haproxy or self.haproxy,
                           clock=newer.clock or self.clock, fd_sites=list(sites.values()),
                           threads=list(threads.values()),
                           cost_s=newer.cost_s if newer.cost_s is not None else self.cost_s,
                           unsampled=newer.unsampled)


@dataclass
class Baseline:
    """What the events before a replay's window added up to (a jump rebuilds the view from a
    window before its target, these totals first): per process its identity, its events by
    kind, its failed calls, its busiest EMFILE second and its connect() destinations; and the
    rare events (ends, OOM kills, Go's thread limit) to apply one by one.

    Attributes:
        until_ns: the window's start (wall ns): everything before it is summed here.
        processes: (pid, comm, start_ns, last seen wall ns) of each process seen before it.
        totals: (pid, kind) -> events.
        errors: (pid, syscall, errno) -> (failed calls, wall ns of the first).
        emfile_worst_second: pid -> EMFILE in its busiest UTC second.
        destinations: (pid, "addr:port") -> [connect() calls, failed].
        lifecycle: the rare events, an events table in time order.
    """

    until_ns: int
    processes: list[tuple[int, str, int | None, int]] = field(default_factory=list)
    totals: dict[tuple[int, str], int] = field(default_factory=dict)
    errors: dict[tuple[int, str, str], tuple[int, int]] = field(default_factory=dict)
    emfile_worst_second: dict[int, int] = field(default_factory=dict)
    destinations: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    lifecycle: Any = None


@dataclass
class Update:
    """Everything a source produced since its previous update.

    Attributes:
        now_ns: the wall time the source has reached: now when live, the replay clock otherwise.
        events: an events table (``schema.arrow_schema("events")``).
        losses: cumulative loss counters (``schema.STATS``).
        rounds: sampling rounds taken (or recorded) since, in time order.
        counters: a fresh reading of the exact per-process counters (live, once per round, and in
            the final update); None when not read this time.
        phases: where each process of a training job is now, by pid (None: not read this time).
        reset: the source jumped back (a replay's seek): forget what was shown, start from here.
        boot_wall_ns: wall time of the traced machine's boot, for process start times.
        final: the last update before the pipeline stops.
        stacks: --stacks: symbolized stacks the events or rounds name, each given once.
        connections: rows of the ``connections`` table (recordings), or None.
        unread: what the source's bounded readers of other users' data left unread, in words
            (live: in the final update; a recording keeps it in its metadata).
        baseline: with ``reset``, what the events before this update's added up to (a replay's
            jump hands out a window of events, not all since the start), or None.
        urgent: it carries a round brought forward by a new failure (``failures_first``): a
            consumer that fell behind takes it ahead of the updates it holds back.
        more: the source has more waiting that it did not hand out in this update (a flood's
            backlog, decoded a bounded part per poll): the pipeline polls again without pausing.
    """

    now_ns: int
    events: ArrowTable
    losses: dict[str, int] = field(default_factory=dict)
    rounds: list[SampleRound] = field(default_factory=list)
    counters: CounterStore | None = None
    phases: dict[int, PhaseNow] | None = None
    reset: bool = False
    boot_wall_ns: int | None = None
    final: bool = False
    stacks: list[Stack] = field(default_factory=list)
    connections: ArrowTable | None = None
    unread: list[str] = field(default_factory=list)
    baseline: Baseline | None = None
    urgent: bool = False
    more: bool = False

    def then(self, later: Update) -> Update:
        """This update and a later one as one (for a consumer that fell behind): events one
        after the other, rounds of both, the later readings. A later reset drops this one."""
        if later.reset:
            return later
        import pyarrow as pa

        events = later.events if not self.events.num_rows else self.events if not later.events.num_rows else \
            pa.concat_tables([self.events, later.events])
        both = [t for t in (self.connections, later.connections) if t is not None]
        connections = pa.concat_tables(both) if len(both) > 1 else both[0] if both else None
        return Update(now_ns=later.now_ns, events=events, losses=later.losses or self.losses,
                      rounds=[*self.rounds, *later.rounds],
                      counters=later.counters if later.counters is not None else self.counters,
                      phases=later.phases if later.phases is not None else self.phases,
                      reset=self.reset, boot_wall_ns=later.boot_wall_ns or self.boot_wall_ns,
                      final=later.final, stacks=[*self.stacks, *later.stacks], connections=connections,
                      unread=later.unread or self.unread, baseline=self.baseline,
                      urgent=self.urgent or later.urgent, more=later.more)


@dataclass(frozen=True)
class SourceInfo:
    """What a sink needs to know of the source it is attached to (a recording's metadata).

    Attributes:
        host: the traced machine's name.
        live: whether the source is the live kernel (a replay cannot be recorded again).
        probes_attached: tracepoints attached.
        probes_skipped: tracepoints this kernel lacks.
        options: what was traced (pids, follow, errors_only, ring_pages), as JSON values.
        interval_s: seconds between sampling rounds.
        cmdline: whether samples carry command lines.
    """

    host: str
    live: bool
    probes_attached: tuple[str, ...] = ()
    probes_skipped: tuple[str, ...] = ()
    options: dict[str, object] = field(default_factory=dict)
    interval_s: float = 1.0
    cmdline: bool = False
