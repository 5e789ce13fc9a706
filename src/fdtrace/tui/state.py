"""What an on-call engineer needs to see, kept up to date from a feed: per process FD headroom,
rates, errors, threads, OOM kills and exits; the system's file-nr; a log of what went wrong; and
alerts at the thresholds operators use. Pure Python: the TUI only draws it."""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fdtrace.advice.memory import MemoryFit, MemoryLevels, memory_fit_buckets
from fdtrace.integrations.haproxy import NOT_ASKED
from fdtrace.pipeline.update import Baseline
from fdtrace.policy import FD_EXHAUSTION_ERRNOS, USAGE_WARN
from fdtrace.procfs import TICK_NS
from fdtrace.procfs.thread_limits import binding_limit
from fdtrace.procfs.threads import describe_state
from fdtrace.schema import NOT_FAILURES, plain_rows
from fdtrace.schema.failures import FAILURE_CLASSES, INCIDENT_CLASSES, failure_class, harm_order, is_oom_end
from fdtrace.schema.owners import CONNECTED_ERRNOS, OWNERS, owner_of
from fdtrace.schema.records import PhaseNow, ProcessSample, SiteRow, Stack, ThreadCensus, ThreadState
from fdtrace.schema.site_names import site_name
from fdtrace.units import kib

#: Alert thresholds (USAGE_WARN and USAGE_CRITICAL are fdtrace.policy's).
THREAD_BURST_PER_S = 50.0  # thread starts per second in one process that make a log line and an alert
THREAD_LIMIT_ALERT_S = 3600.0  # steady thread growth that reaches its limit within this alerts
HISTORY_POINTS = 600
MAX_SITES = 10_000  # call-site names kept for the detail screen (--stacks)
RATE_KINDS = ("socket", "accept", "connect", "close", "thread_start")
NO_RATES = dict.fromkeys((*RATE_KINDS, "fd_exhaustion"), 0.0)


class CountedInstance(Protocol):
    """One process instance of the in-kernel counters (the kernel package's ``ProcessTotals``),
    as ``IncidentState.apply_counters`` reads it."""

    pid: int
    first_ts: int
    comm: str
    exit_ts: int | None
    errors: dict[tuple[str, str], int]


#: HAProxy processes whose demands are kept (their views may come later).
MAX_DEMANDED = 1024

Point = TypeVar("Point")


def _appended(points: Sequence[Point], point: Point) -> deque[Point]:
    """``points`` with ``point`` added, the oldest past ``HISTORY_POINTS`` dropped. A view's
    histories start as the empty tuple and become a deque at their first point: most processes of
    a churning host are never sampled, and three empty deques were 2.3 kB of each view's 5 kB
    (``MAX_PROCESSES`` views are kept)."""
    kept = points if isinstance(points, deque) else deque(points, maxlen=HISTORY_POINTS)
    kept.append(point)
    return kept


@dataclass(slots=True)
class ProcessView:
    """One process as the view shows it."""

    pid: int
    comm: str
    start_ns: int | None = None
    open_fds: int | None = None
    fd_soft_limit: int | None = None
    fd_hard_limit: int | None = None
    sockets: int | None = None
    threads: int | None = None
    thread_limit: tuple[str, int, int] | None = None  # (name, count, limit) of the limit binding the threads
    placement: tuple[str | None, ...] = ()  # its sample's cgroup, unit, container id, runtime, pod UID
    totals: Counter[str] = field(default_factory=Counter)
    rates: dict[str, float] = field(default_factory=dict)
    fd_exhaustion_errors: int = 0  # EMFILE + ENFILE from any syscall
    emfile: int = 0  # EMFILE of any call (the needs model's count)
    emfile_worst_second: int = 0  # EMFILE in its worst UTC second so far
    _emfile_second: tuple[int, int] = (-1, 0)  # (the second being counted, its count)
    maxsock: int | None = None  # what HAProxy sized itself for (show info), or its configuration demands
    maxsock_from: str | None = None  # "configuration" when only the configuration said
    limit_config: tuple[int, str] | None = None  # an haproxy's (ulimit-n, its configuration file)
    go_thread_limit: int | None = None  # the N of Go's "program exceeds N-thread limit", when it said so
    go_limit_unread: str | None = None  # why its Go limit could not be read from its memory
    maxconn: int | None = None  # an haproxy's maxconn (show info, or its configuration)
    rss_kb: int | None = None  # resident memory, and its split as the OOM killer splits it
    rss_split: tuple[int | None, int | None, int | None] = (None, None, None)
    memcg_limit: int | None = None  # the tightest memory cgroup's limit and usage, bytes
    memcg_usage: int | None = None
    # (time, sockets, memory: the cgroup's usage, else RSS, bytes) at each sample
    memory_history: Sequence[tuple[int, int | None, int]] = ()  # a deque from its first point (``_appended``)
    memcg_peak: int | None = None  # its cgroup's highest usage seen, bytes (the report's memcg_peak_bytes)
    peak_fds: int | None = None  # its most open FDs in any sample (the report's peak_fds; history forgets)
    # sockets -> [total memory, samples] over every sample: the memory fit's levels, as the report sums them
    memory_levels: MemoryLevels = field(default_factory=MemoryLevels)
    memory_in_cgroup: bool = False  # a sample's memory was its cgroup's usage (the fit's measure)
    last_state: str | None = None  # an OOM victim as its last sample saw it
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # (syscall, errno) -> failures shown
    # Its failed calls as its events counted them and as the in-kernel counters last said (live
    # only): ``errors`` shows the larger of the two for each (syscall, errno), so a failure the
    # counters saw first is on screen at once, and is not counted again when its events come.
    event_errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    kernel_errors: dict[tuple[str, str], int] = field(default_factory=dict)
    kernel_instance: int | None = None  # the counters' first_ts of the instance they were read for
    history: Sequence[tuple[int, int]] = ()  # (time, open FDs) at each sample: a deque from its first
    thread_history: Sequence[tuple[int, int]] = ()  # (time, threads) at each sample: likewise
    # connect() calls by destination ("10.0.0.5:8080", "[::1]:443"): (calls, failed)
    destinations: dict[str, list[int]] = field(default_factory=dict)
    oom_killed: bool = False
    oom_kill_ns: int | None = None  # when (its latest): its SIGKILL exit soon after is that kill's end
    sampled: bool = False  # whether a /proc round saw it (its limits are known only then)
    failures: set[str] = field(default_factory=set)  # its failure classes (schema.failures.failure_class)
    first_failure_ns: int | None = None  # when it first failed as an incident does (wall)
    ended: str | None = None  # "exit 1", "SIGKILL", ...
    ended_ns: int | None = None  # when it ended (wall)
    # A training rank's sockets (fd -> side, family, peer port, threads, phase when made) and its
    # rendezvous store's port: what `descriptors_by_owner` counts (fdtrace.schema.owners).
    rank_sockets: dict[int, tuple[str, str | None, int | None, tuple[str, ...], str]] = field(default_factory=dict)
    store_port: int | None = None
    last_seen_ns: int = 0
    census: list[ThreadState] = field(default_factory=list)  # what its threads are blocked in, last round
    fd_sites: dict[int | None, tuple[int, float | None]] = field(default_factory=dict)  # stack -> (open, growth/min)
    fd_site_history: dict[int | None, deque[tuple[int, int]]] = field(default_factory=dict)

    def thread_growth(self, window_ns: int = 60_000_000_000) -> float | None:
        """Threads started per second over the last ``window_ns``; None unless the threads grew at
        every sample of at least 10 s of that window (steadily)."""
        if len(self.thread_history) < 3 or self.ended is not None:
            return None
        if not _still_growing(list(self.thread_history)):
            return None  # it stopped growing: no alert from what it did before
        end_t = self.thread_history[-1][0]
        recent = [(t, v) for t, v in self.thread_history if t >= end_t - window_ns]
        if len(recent) < 3 or recent[-1][0] - recent[0][0] < 10_000_000_000:
            return None
        if any(later < earlier for (_, earlier), (_, later) in zip(recent, recent[1:], strict=False)):
            return None  # not steady: it also shrank
        grown = recent[-1][1] - recent[0][1]
        if grown <= 0:
            return None
        return grown / ((recent[-1][0] - recent[0][0]) / 1e9)

    def seconds_to_thread_limit(self, window_ns: int = 60_000_000_000) -> float | None:
        """At the thread growth of the last ``window_ns`` (``thread_growth``), seconds until the
        binding thread limit."""
        slope = self.thread_growth(window_ns)
        if self.thread_limit is None or slope is None:
            return None
        _kind, count, limit = self.thread_limit
        return max(limit - count, 0) / slope

    @property
    def memory_usage(self) -> float | None:
        """Its memory cgroup's usage / limit."""
        if self.memcg_usage is None or not self.memcg_limit:
            return None
        return self.memcg_usage / self.memcg_limit

    def seconds_to_memory_limit(self, window_ns: int = 30_000_000_000) -> float | None:
        """At the growth of its cgroup's usage over the last ``window_ns``, seconds until the
        cgroup's limit; None when not growing (or no limit), 0 when there."""
        if (self.memcg_limit is None or self.memcg_usage is None or len(self.memory_history) < 2
                or self.ended is not None):
            return None
        room = self.memcg_limit - self.memcg_usage
        if room <= 0:
            return 0.0
        if not _still_growing([(t, v) for t, _, v in self.memory_history]):
            return None
        end_t, _, end_v = self.memory_history[-1]
        start_t, _, start_v = next(((t, n, v) for t, n, v in self.memory_history if t >= end_t - window_ns),
                                   self.memory_history[0])
        if end_t <= start_t or end_v <= start_v:
            return None
        return room / ((end_v - start_v) / ((end_t - start_t) / 1e9))

    def memory_fit(self) -> MemoryFit | None:
        """The memory a connection costs, fitted over every sample's memory per bucket of socket
        counts (``advice.memory.memory_fit_buckets``, as the report fits a recording's)."""
        measure = "cgroup usage" if self.memory_in_cgroup else "RSS"
        return memory_fit_buckets(self.memory_levels, measure)

    def descriptors_by_owner(self) -> dict[str, int]:
        """A training rank's descriptors by owner (the ledger's, live): its sockets followed
        through its calls, and what else its last sample counted (files and pipes)."""
        counts = dict.fromkeys(OWNERS, 0)
        for side, family, port, threads, phase in self.rank_sockets.values():
            counts[owner_of(side, family, port, threads, phase, self.store_port)] += 1
        if self.open_fds is not None and self.sockets is not None:
            counts["files_pipes"] = max(self.open_fds - self.sockets, 0)
        return counts

    def describe_last_state(self) -> str:
        """What its last sample saw, for an OOM kill's log line: FDs, sockets, threads, memory."""
        parts = [f"{self.open_fds:,} FDs" + (f" ({self.sockets:,} sockets)" if self.sockets is not None else "")]
        if self.threads is not None:
            parts.append(f"{self.threads} thread{'s' if self.threads != 1 else ''}")
        if self.rss_kb is not None:
            parts.append(f"RSS {kib(self.rss_kb * 1024)}")
        text = ", ".join(parts)
        usage = self.memory_usage
        if usage is not None and self.memcg_limit is not None and self.memcg_usage is not None:
            text += (f"; its cgroup at {kib(self.memcg_usage)} of {kib(self.memcg_limit)} ({usage:.0%}): "
                     + ("foreseen" if usage >= USAGE_WARN else "not foreseen"))
        return text

    @property
    def usage(self) -> float | None:
        """Open FDs / soft limit."""
        if self.open_fds is None or not self.fd_soft_limit:
            return None
        return self.open_fds / self.fd_soft_limit

    @property
    def headroom(self) -> int | None:
        """FDs left under the soft limit."""
        if self.open_fds is None or self.fd_soft_limit is None:
            return None
        return self.fd_soft_limit - self.open_fds

    def seconds_to_exhaustion(self, window_ns: int = 30_000_000_000) -> float | None:
        """At the growth rate of open FDs over the last ``window_ns``, seconds until the soft limit;
        None when not growing (or unknown), 0 when already there."""
        if self.headroom is None or len(self.history) < 2 or self.ended is not None:
            return None
        if self.headroom <= 0:
            return 0.0
        if not _still_growing([(t, v) for t, v in self.history]):
            return None
        end_t, end_v = self.history[-1]
        start_t, start_v = next(((t, v) for t, v in self.history if t >= end_t - window_ns), self.history[0])
        if end_t <= start_t or end_v <= start_v:
            return None
        slope = (end_v - start_v) / ((end_t - start_t) / 1e9)
        return self.headroom / slope

    @property
    def failed(self) -> bool:
        """Whether it failed as an incident does (``schema.failures``), ended or not: EMFILE/ENFILE,
        an OOM kill, Go's thread limit, a kill by a signal; a non-zero exit alone is not one."""
        return not self.failures.isdisjoint(INCIDENT_CLASSES)

    def harm(self) -> tuple[int, int, int]:
        """Its place by harm (``schema.failures.harm_order``): its worst incident class, then the
        most failures (its EMFILE/ENFILE, else 1), then who failed first."""
        worst = next((c for c in FAILURE_CLASSES if c in self.failures and c in INCIDENT_CLASSES), None)
        count = self.fd_exhaustion_errors if worst == "EMFILE/ENFILE" else 1
        return harm_order(worst, count, self.first_failure_ns if self.first_failure_ns is not None else 1 << 62)

    def _count_failed(self, syscall: str, errno: str, count: int) -> None:
        """Count ``count`` calls of ``syscall`` failed with ``errno`` (from events), and their
        failure class."""
        self.event_errors[(syscall, errno)] += count
        self._settle(syscall, errno)

    def _counted_failed(self, syscall: str, errno: str, count: int) -> None:
        """The in-kernel counters' count of ``syscall`` failed with ``errno`` (cumulative)."""
        self.kernel_errors[(syscall, errno)] = count
        self._settle(syscall, errno)

    def _settle(self, syscall: str, errno: str) -> None:
        """Show the larger of the events' and the counters' count of (``syscall``, ``errno``)."""
        key = (syscall, errno)
        grown = max(self.event_errors[key], self.kernel_errors.get(key, 0)) - self.errors[key]
        if grown <= 0:
            return
        self.errors[key] += grown
        found = failure_class({"errno": errno})
        if found is not None:
            self.failures.add(found)
        if errno in FD_EXHAUSTION_ERRNOS:
            self.fd_exhaustion_errors += grown

    def _failed_at(self, when_ns: int) -> None:
        if self.first_failure_ns is None or when_ns < self.first_failure_ns:
            self.first_failure_ns = when_ns

    @property
    def alerts(self) -> list[str]:
        """What is wrong with this process, worst first."""
        found = []
        if self.oom_killed:
            found.append("OOM-killed")
        if self.fd_exhaustion_errors:
            found.append(f"{self.fd_exhaustion_errors} EMFILE/ENFILE")
        if self.go_thread_limit is not None:
            found.append(f"exceeded Go's {self.go_thread_limit}-thread limit")
        usage = self.usage
        if usage is not None and usage > USAGE_WARN:
            found.append(f"FDs at {usage:.0%}")
        memory = self.memory_usage
        if memory is not None and memory > USAGE_WARN and not self.oom_killed:
            to_limit = self.seconds_to_memory_limit()
            found.append(f"memory at {memory:.0%} of its cgroup" + (f", full in {duration(to_limit)}"
                                                                   if to_limit is not None and to_limit > 0 else ""))
        if self.thread_limit is not None and self.thread_limit[1] > USAGE_WARN * self.thread_limit[2]:
            kind, count, limit = self.thread_limit
            found.append(f"threads {count}/{limit} ({kind})")
        if self.rates.get("thread_start", 0.0) >= THREAD_BURST_PER_S:
            found.append(f"threads +{self.rates['thread_start']:.0f}/s")
        to_limit = self.seconds_to_thread_limit()
        if to_limit is not None and to_limit <= THREAD_LIMIT_ALERT_S and self.thread_limit is not None:
            found.append(self._thread_limit_alert(to_limit))
        return found

    def _thread_limit_alert(self, to_limit: float) -> str:
        """"412 threads blocked in read() on pipes at fetch.dialSingle, 3 new per second, thread limit
        (Go default) in 2m": what the threads wait in, how fast they come, when the limit is hit."""
        assert self.thread_limit is not None
        when = f"in {duration(to_limit)}" if to_limit > 0 else "reached"
        slope = self.thread_growth() or 0.0
        rate = f"{slope:.0f}" if slope >= 1.5 else f"{slope:.1f}"
        limit = f"{rate} new per second, thread limit ({self.thread_limit[0]}) {when}"
        dominant = next((s for s in self.census if s.syscall not in ("running", "user")), None)
        return f"{describe_state(dominant)}, {limit}" if dominant is not None else limit


#: A growth alert holds only while the value grew within this much of the newest sample.
GROWING_NS = 10_000_000_000


def _still_growing(history: list[tuple[int, int]]) -> bool:
    """Whether the newest value is above the one ``GROWING_NS`` before it (the previous sample when
    none is that recent): a growth that stopped ends its alert and its "full in" then, not a
    whole window later."""
    end_t, end_v = history[-1]
    recent = [v for t, v in history if t >= end_t - GROWING_NS]
    base = recent[0] if len(recent) > 1 else history[-2][1]
    return end_v > base


@dataclass(frozen=True)
class LogEntry:
    """One line of the event log."""

    time_ns: int
    pid: int
    comm: str
    text: str
    severity: str  # "error", "warning", or "exit" (a non-zero exit: shown when asked)

    def matches(self, text_filter: str) -> bool:
        """Whether the line belongs to the processes a filter (name or pid) selects."""
        wanted = text_filter.strip().lower()
        return not wanted or wanted in self.comm.lower() or wanted == str(self.pid)


#: Destinations kept per process (the first seen); a process connecting to more is rare.
MAX_DESTINATIONS = 256

HAPROXY_BUSY = 0.90  # CurrConns / maxconn
HAPROXY_BUSY_FOR_NS = 30_000_000_000


@dataclass
class HaproxyView:
    """One HAProxy stats socket's latest `show info`, and how long it has been near maxconn."""

    socket: str
    row: dict[str, Any] = field(default_factory=dict)  # the last answer (kept while it does not answer)
    error: str | None = None  # why it does not answer now
    error_since_ns: int | None = None
    answered_ns: int | None = None  # when the last answer came
    busy_since_ns: int | None = None
    alerted: bool = False
    unreachable_logged: bool = False

    @property
    def usage(self) -> float | None:
        """CurrConns / maxconn."""
        current, limit = self.row.get("curr_conns"), self.row.get("maxconn")
        return current / limit if current is not None and limit else None

    def busy_for_s(self, now_ns: int) -> float:
        """Seconds CurrConns has stayed above 90 % of maxconn."""
        return 0.0 if self.busy_since_ns is None else (now_ns - self.busy_since_ns) / 1e9


@dataclass(frozen=True)
class SystemView:
    """The header: the system's FD table and what the feed has seen."""

    file_nr: int | None = None
    file_max: int | None = None
    oom_kills: int = 0
    events_per_s: float = 0.0
    losses: int = 0
    loss_detail: str = ""
    exact: str = ""  # which counts stay exact, given the losses (``exact_counts``)


#: The loss counter of the events the live view left out while it was behind (``ViewSink``).
VIEW_SKIPPED = "view_skipped"


def held_events(events: pa.Table, at_most: int) -> tuple[pa.Table, int]:
    """At most ``at_most`` rows of an events table, in time order, and how many were left out:
    failed calls and the rare kinds (ends, OOM kills, Go's thread limit) first, then the newest
    of the rest; the newest first among each."""
    if events.num_rows <= at_most:
        return events, 0
    kind_codes, kind_names = _codes(events["kind"])
    errno_codes, errno_names = _codes(events["errno"])
    telling = [code for code, name in enumerate(errno_names) if name and name not in NOT_FAILURES]
    rare = [code for code, name in enumerate(kind_names) if name in RARE_KINDS]
    first = np.isin(errno_codes, telling) | np.isin(kind_codes, rare)
    telling_rows, other_rows = np.flatnonzero(first), np.flatnonzero(~first)
    kept = telling_rows[-at_most:]
    room = at_most - len(kept)
    if room:
        kept = np.concatenate([kept, other_rows[-room:]])
    return events.take(pa.array(np.sort(kept))), events.num_rows - at_most


def exact_counts(losses: dict[str, int]) -> str:
    """Which counts stay exact given what was lost (the in-kernel counters are kept apart from
    the event stream): "" when nothing was lost."""
    lost = {name for name, count in losses.items() if count}
    if not lost:
        return ""
    inexact = []
    if "counters_full" in lost:
        inexact.append("processes not counted")
    if "errors_full" in lost:
        inexact.append("failed calls not counted")
    if "exited_full" in lost:
        inexact.append("ended processes' totals")
    if inexact:
        return "counts exact but " + ", ".join(inexact)
    return "counts exact, event list incomplete" if lost & {"ringbuf_full", VIEW_SKIPPED} else "counts exact"


#: How long an exited process stays in the table, by default; and how many processes it holds.
KEEP_EXITED_NS = 300_000_000_000
MAX_PROCESSES = 20_000
#: Processes that ended without failing kept at most (the latest): on a host that starts
#: thousands a second they would otherwise fill ``MAX_PROCESSES`` and every round's work.
MAX_ENDED = 1_000
#: The kinds ``apply_events`` folds in row by row (each an end, or a failure by itself), and the
#: columns those rows are read with.
RARE_KINDS = frozenset({"oom_kill", "process_exit", "go_thread_limit"})
LIFECYCLE_COLUMNS = ("pid", "kind", "time", "errno", "signal", "exit_code", "ret", "anon_rss_kb", "file_rss_kb",
                     "oom_score_adj")


class IncidentState:
    """Folds feed updates into per-process views, a system view and a log.

    Memory stays bounded over days: a process that ended is forgotten ``keep_exited_ns`` after
    its end, one that was not seen for as long (no events, not among the sampled) and has no
    alert too; past ``max_ended`` processes that ended without failing, the earliest ended go;
    and past ``max_processes`` the least recently seen go first; ``forgotten`` counts them all.
    """

    def __init__(self, log_size: int = 2000, keep_exited_ns: int = KEEP_EXITED_NS,
                 max_processes: int = MAX_PROCESSES, max_ended: int = MAX_ENDED) -> None:
        self.keep_exited_ns = keep_exited_ns
        self.max_processes = max_processes
        self.max_ended = max_ended
        self.forgotten = 0
        self.processes: dict[int, ProcessView] = {}
        self.log: deque[LogEntry] = deque(maxlen=log_size)
        self.system = SystemView()
        self.now_ns = 0
        self._window: Counter[tuple[int, str]] = Counter()
        self._window_events = 0
        self._window_start_ns: int | None = None
        self._window_errors: Counter[tuple[int, str, str]] = Counter()
        self._window_error_first: dict[tuple[int, str, str], int] = {}  # when each first failed
        # and the name its process had then (a /proc sample read before it renamed itself may say
        # another, and the log line names the program that failed)
        self._window_error_comm: dict[tuple[int, str, str], str] = {}
        self._oom_kills = 0
        self._system_figures: dict[str, Any] = {}
        self.logged = 0  # log lines ever written; the view shows those past what it has shown
        self.boot_wall_ns: int | None = None  # wall time of the traced machine's boot
        self.haproxy: dict[str, HaproxyView] = {}
        self._demanded: dict[int, tuple[int, str | None]] = {}  # haproxy pid -> (Maxsock, from)
        self._limit_configs: dict[int, tuple[int, str]] = {}  # haproxy pid -> (ulimit-n, configuration)
        self._maxconns: dict[int, int] = {}  # haproxy pid -> maxconn
        self.phases: dict[int, PhaseNow] = {}  # training processes under `fdtrace run`, by pid
        self.site_names: dict[int, str] = {}  # --stacks: stack id -> the call site it names

    def _log(self, entry: LogEntry) -> None:
        self.log.append(entry)
        self.logged += 1

    def new_log_entries(self, shown: int) -> list[LogEntry]:
        """The log lines written after the first ``shown`` (those still kept)."""
        fresh = min(self.logged - shown, len(self.log))
        return list(self.log)[len(self.log) - fresh:] if fresh > 0 else []

    def _process(self, pid: int, comm: str, start_ns: int | None) -> ProcessView:
        view = self.processes.get(pid)
        if view is None or (start_ns is not None and view.start_ns is not None and view.start_ns != start_ns):
            view = ProcessView(pid=pid, comm=comm, start_ns=start_ns)  # new, or the pid was reused
            self.processes[pid] = view
        if start_ns is not None:
            view.start_ns = start_ns
        if comm:
            view.comm = comm
        if view.maxsock is None and pid in self._demanded:
            view.maxsock, view.maxsock_from = self._demanded[pid]
        if view.maxconn is None and pid in self._maxconns:
            view.maxconn = self._maxconns[pid]
        if view.limit_config is None and pid in self._limit_configs:
            view.limit_config = self._limit_configs[pid]
        return view

    def apply_events(self, events: pa.Table) -> None:
        """Fold in an events table (the event model, in time order), in bulk: counts per
        (process, kind) and (process, syscall, errno) grouped with numpy over the columns'
        dictionary codes, so Python sees each group once; rows only for the failed calls and the
        rare kinds (ends, OOM kills, Go's thread limit), and only the columns they need. The
        processes of ``_brief_lives`` are counted as forgotten, not folded in."""
        if not events.num_rows:
            return
        self._window_events += events.num_rows
        kind_codes, kind_names = _codes(events["kind"])
        errno_codes, errno_names = _codes(events["errno"])
        failing = [code for code, name in enumerate(errno_names) if name and name not in NOT_FAILURES]
        failed_row = np.isin(errno_codes, failing) if failing else np.zeros(events.num_rows, dtype=bool)
        all_pids = events["pid"].to_numpy().astype(np.int64)
        brief = self._brief_lives(all_pids, kind_codes, kind_names, failed_row, events)
        # The rows folded in (as indices of the table: filtering the table itself cost more than
        # all the rest under a flood).
        index = np.flatnonzero(~np.isin(all_pids, brief)) if len(brief) else np.arange(events.num_rows)
        self.forgotten += len(brief)
        past = self._past_instances(all_pids, events)
        current = None if past is None else pa.array(~past)  # the rows of the processes under their pids now
        if past is not None:
            self.forgotten += len(np.unique(all_pids[past]))
            index = index[~past[index]]
        n = len(index)
        if not n:
            return
        pids = all_pids[index]
        kinds = kind_codes[index]
        # Each process's identity from its last row in the batch.
        distinct, first_from_end = np.unique(pids[::-1], return_index=True)
        last = index[n - 1 - first_from_end]
        comm_codes, comm_names = _codes(events["comm"])
        starts = events["start_ns"].take(pa.array(last)).to_pylist()
        seen = events["time"].take(pa.array(last)).cast(pa.int64()).to_pylist()
        for pid, comm, start_ns, seen_ns in zip(distinct.tolist(), comm_codes[last].tolist(), starts, seen,
                                                strict=True):
            view = self._process(pid, comm_names[comm] or "", start_ns)
            view.last_seen_ns = seen_ns
        width = len(kind_names)
        pairs, counts = np.unique(pids * width + kinds, return_counts=True)
        for pair, count in zip(pairs.tolist(), counts.tolist(), strict=True):
            pid, kind = divmod(pair, width)
            label = kind_names[kind] or ""
            self.processes[pid].totals[label] += count
            if label in RATE_KINDS:
                self._window[(pid, label)] += count
        # Failed calls: an errno but those of a non-blocking socket's normal answers (NOT_FAILURES).
        failed_rows = index[failed_row[index]]
        if len(failed_rows):
            syscall_codes, syscall_names = _codes(events["syscall"])
            keys = list(zip(all_pids[failed_rows].tolist(),
                            [syscall_names[c] or "" for c in syscall_codes[failed_rows].tolist()],
                            [errno_names[c] or "" for c in errno_codes[failed_rows].tolist()], strict=True))
            times = events["time"].take(pa.array(failed_rows)).cast(pa.int64()).to_pylist()
            comms = [comm_names[c] or "" for c in comm_codes[failed_rows].tolist()]
            for key, when, comm in zip(keys, times, comms, strict=True):
                if key not in self._window_error_first:
                    self._window_error_first[key] = when
                    self._window_error_comm[key] = comm
                if key[2] in FD_EXHAUSTION_ERRNOS:
                    self.processes[key[0]]._failed_at(when)
                if key[2] == "EMFILE":  # per UTC second, as the needs model counts them
                    self._count_emfile_second(self.processes[key[0]], when)
            for (pid, syscall, errno), count in Counter(keys).items():
                self.processes[pid]._count_failed(syscall, errno, count)
                if errno in FD_EXHAUSTION_ERRNOS:
                    self._window_errors[(pid, syscall, errno)] += count
        self._destinations(events, current)
        self._rank_sockets(events, current)
        rare_codes = [code for code, name in enumerate(kind_names) if name in RARE_KINDS]
        rare = index[np.isin(kinds, rare_codes)] if rare_codes else index[:0]
        if len(rare):
            wanted = [name for name in LIFECYCLE_COLUMNS if name in events.schema.names]
            for row in plain_rows(events.select(wanted).take(pa.array(rare))):
                self._lifecycle(row)

    def _past_instances(self, pids: np.ndarray, events: pa.Table) -> np.ndarray | None:
        """Which rows belong to an earlier process than the one the view shows under their pid
        (None: none): the pid was taken again (a host that forks thousands a second goes through
        a pid_max of 32,768 in seconds) and the earlier owner's events came late (a flood holds
        them back). Folded in, they would take the row of the process running under that pid
        now, a failing one among them, until its next sample."""
        shown = {}
        for pid in np.unique(pids).tolist():
            view = self.processes.get(pid)
            if view is not None and view.start_ns is not None:
                shown[pid] = view.start_ns
        if not shown:
            return None
        known_pids = np.fromiter(shown, dtype=np.int64, count=len(shown))  # ascending, as np.unique gave them
        known_starts = np.fromiter(shown.values(), dtype=np.int64, count=len(shown))
        at = np.minimum(np.searchsorted(known_pids, pids), len(known_pids) - 1)
        current = np.where(known_pids[at] == pids, known_starts[at], -1)
        starts = pc.fill_null(events["start_ns"], -1).to_numpy()
        # A tick apart at least: the start an event gives a process seen starting is the
        # tracepoint's stamp in ticks, /proc's the task's own, and the two can differ by one.
        past: np.ndarray = (starts >= 0) & (starts + TICK_NS < current)
        return past if past.any() else None

    def _brief_lives(self, pids: np.ndarray, kind_codes: np.ndarray, kind_names: list[str | None],
                     failed_row: np.ndarray, events: pa.Table) -> np.ndarray:
        """The pids of processes not shown yet whose whole life is in this table and ended
        cleanly (started, exited 0 or unknown, no signal, no failed call), but the last
        ``max_ended`` of them: on a host that forks thousands a second the view would make each
        a row only for ``_forget`` to drop it, the earliest ended first, at the next roll."""
        exit_codes = [code for code, name in enumerate(kind_names) if name == "process_exit"]
        start_codes = [code for code, name in enumerate(kind_names) if name == "process_start"]
        none = np.empty(0, dtype=np.int64)
        if not exit_codes or not start_codes:
            return none
        exits = np.isin(kind_codes, exit_codes)
        if int(exits.sum()) <= self.max_ended:
            return none
        clean = exits & ~events["signal"].is_valid().to_numpy(zero_copy_only=False)
        clean &= ~pc.fill_null(pc.not_equal(events["exit_code"], 0), False).to_numpy(zero_copy_only=False)
        spoiled = set(pids[failed_row].tolist())
        started = set(pids[np.isin(kind_codes, start_codes)].tolist())
        _, first_from_end = np.unique(pids[::-1], return_index=True)
        last = len(pids) - 1 - first_from_end
        ended = last[clean[last]]  # each pid's last row, where it is a clean exit
        unknown = np.array([pid in started and pid not in spoiled and pid not in self.processes
                            for pid in pids[ended].tolist()], dtype=bool)
        ended = ended[unknown] if len(ended) else ended
        if len(ended) <= self.max_ended:
            return none
        brief: np.ndarray = pids[np.sort(ended)[:len(ended) - self.max_ended]]
        return brief

    def apply_counters(self, instances: Iterable[CountedInstance], now_ns: int) -> None:
        """Fold in a reading of the exact in-kernel counters (live only; a replay has none): the
        failed calls of each process the view shows get their exact counts, and a failure its
        row's events have not brought yet (a flood holds them back, or the ring drops them)
        makes the row a failed one at once. Per (syscall, errno) the view shows the larger of
        what its events counted and what the counters say, so nothing is counted twice; the
        events still bring the times and the log lines. A reading makes no row of its own: the
        counters' name may be one the program had before it renamed itself, and ``top --comm``
        shows rows by name; a new failure's row comes from its /proc sample, which the live
        source takes first, in the same round (``LiveOptions.failures_first``)."""
        for totals in instances:
            failed = [(key, count) for key, count in totals.errors.items() if count and key[1] not in NOT_FAILURES]
            view = self.processes.get(totals.pid)
            if not failed or view is None or not _same_instance(view, totals):
                continue
            view.kernel_instance = totals.first_ts
            for (syscall, errno), count in failed:
                view._counted_failed(syscall, errno, count)
                if errno in FD_EXHAUSTION_ERRNOS:
                    view._failed_at(now_ns)  # by now at the latest; its events say when

    def apply_baseline(self, baseline: Baseline) -> None:
        """Fold in what the events before a replay's window added up to (``Baseline``), as
        ``apply_events`` would have counted them one by one: the view then takes the window's
        events. Nothing of it is logged (the log starts with the window), but its ends."""
        for pid, comm, start_ns, seen_ns in baseline.processes:
            view = self._process(pid, comm, start_ns)
            view.last_seen_ns = max(view.last_seen_ns, seen_ns)
        for (pid, kind), count in baseline.totals.items():
            self.processes[pid].totals[kind] += count
        for (pid, syscall, errno), (count, first_ns) in baseline.errors.items():
            view = self.processes[pid]
            view._count_failed(syscall, errno, count)
            if errno in FD_EXHAUSTION_ERRNOS:
                view._failed_at(first_ns)
            if errno == "EMFILE":
                view.emfile += count
        for pid, worst in baseline.emfile_worst_second.items():
            view = self.processes[pid]
            view.emfile_worst_second = max(view.emfile_worst_second, worst)
        for (pid, where), (calls, failed) in baseline.destinations.items():
            known = self.processes[pid].destinations
            if where in known or len(known) < MAX_DESTINATIONS:
                tally = known.setdefault(where, [0, 0])
                tally[0] += calls
                tally[1] += failed
        if baseline.lifecycle is not None:
            for row in plain_rows(baseline.lifecycle):
                self._process(row["pid"], row["comm"], row["start_ns"])
                self._lifecycle(row)

    @staticmethod
    def _count_emfile_second(view: ProcessView, when_ns: int) -> None:
        view.emfile += 1
        second, count = view._emfile_second
        now = when_ns // 1_000_000_000
        count = count + 1 if now == second else 1
        view._emfile_second = (now, count)
        view.emfile_worst_second = max(view.emfile_worst_second, count)

    def _destinations(self, events: pa.Table, kept: pa.Array | None) -> None:
        """Count each process's connect() calls by destination (at most MAX_DESTINATIONS each),
        in the rows ``kept`` (a mask; None: all)."""
        mask = pc.and_(pc.equal(events["kind"].cast(pa.string()), "connect"), pc.is_valid(events["peer_port"]))
        connects = events.filter(mask if kept is None else pc.and_(mask, kept))
        if not connects.num_rows:
            return
        # Counted per (process, destination, errno) in Arrow: Python sees each group once.
        keys = pa.table({"pid": connects["pid"], "address": connects["peer_addr"].cast(pa.string()),
                         "port": connects["peer_port"], "errno": connects["errno"].cast(pa.string())})
        groups = keys.group_by(["pid", "address", "port", "errno"]).aggregate([([], "count_all")])
        for pid, address, port, errno, count in zip(*(groups[c].to_pylist() for c in
                                                      ("pid", "address", "port", "errno", "count_all")), strict=True):
            if pid not in self.processes:  # a brief life (``_brief_lives``), not kept
                continue
            known = self.processes[pid].destinations
            where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
            if where not in known and len(known) >= MAX_DESTINATIONS:
                continue
            tally = known.setdefault(where, [0, 0])
            tally[0] += count
            if errno not in NOT_FAILURES:
                tally[1] += count

    def _rank_sockets(self, events: pa.Table, kept: pa.Array | None) -> None:
        """Follow the sockets of the training ranks (processes under `fdtrace run` with a rank)
        in the rows ``kept`` (a mask; None: all): who made each, in which phase, and what it
        connected to. The store's port is the one init_process_group names (its rendezvous
        address), else the rank's first connect there."""
        ranks = [pid for pid, now in self.phases.items() if now.rank is not None]
        if not ranks:
            return
        kinds = pa.array(["socket", "accept", "connect", "close"])
        mask = pc.and_(pc.is_in(events["pid"].cast(pa.int64()), value_set=pa.array(ranks, type=pa.int64())),
                       pc.is_in(events["kind"].cast(pa.string()), value_set=kinds))
        if kept is not None:
            mask = pc.and_(mask, kept)
        if not pc.any(mask).as_py():
            return
        rows = events.filter(mask).select(["pid", "comm", "kind", "fd", "errno", "family", "peer_port"])
        for row in plain_rows(rows):
            if row["pid"] not in self.processes:  # a brief life (``_brief_lives``), not kept
                continue
            view, now = self.processes[row["pid"]], self.phases[row["pid"]]
            if now.phase == "init_process_group" and now.name.rsplit(":", 1)[-1].isdigit():
                view.store_port = int(now.name.rsplit(":", 1)[-1])
            fd, errno = row["fd"], row["errno"] or ""
            if fd is None:
                continue
            if row["kind"] in ("socket", "accept") and not errno:
                side = "accepted" if row["kind"] == "accept" else "unconnected"
                view.rank_sockets[fd] = (side, row["family"], row["peer_port"], (row["comm"] or "",), now.phase)
            elif row["kind"] == "connect" and fd in view.rank_sockets:
                _side, _family, _port, threads, phase = view.rank_sockets[fd]
                if errno not in CONNECTED_ERRNOS:
                    del view.rank_sockets[fd]  # a lookup's retry, closed at once
                    continue
                if view.store_port is None and phase == "init_process_group" and row["peer_port"] is not None:
                    view.store_port = row["peer_port"]  # TCPStore's client connects first
                view.rank_sockets[fd] = ("connected", row["family"], row["peer_port"],
                                         (*threads, row["comm"] or ""), phase)
            elif row["kind"] == "close" and not errno:
                view.rank_sockets.pop(fd, None)

    def _lifecycle(self, row: dict[str, Any]) -> None:
        view = self.processes[row["pid"]]
        found = failure_class(row)
        time_ns = _ns(row["time"])
        after_oom = row["kind"] == "process_exit" and is_oom_end(view.oom_kill_ns, time_ns, row.get("signal"))
        if after_oom:
            found = None  # the OOM kill's end, not a crash of its own (schema.failures.oom_ends)
        if found is not None:
            view.failures.add(found)
            if found in INCIDENT_CLASSES:
                view._failed_at(time_ns)
        if row["kind"] == "oom_kill":
            view.oom_killed = True
            view.oom_kill_ns = time_ns
            self._oom_kills += 1
            text = (f"OOM kill: anon-rss {row['anon_rss_kb']} kB, file-rss {row['file_rss_kb']} kB, "
                    f"oom_score_adj {row['oom_score_adj']}")
            if view.open_fds is not None:
                view.last_state = view.describe_last_state()
                text += f"; last seen: {view.last_state}"
            self._log(LogEntry(time_ns, view.pid, view.comm, text, "error"))
            return
        if row["kind"] == "go_thread_limit":
            view.go_thread_limit = row["ret"]
            self._log(LogEntry(time_ns, view.pid, view.comm, f"Go runtime: program exceeds {row['ret']}-thread limit "
                               f"(debug.SetMaxThreads; it exits 2)", "error"))
            return
        view.ended_ns = time_ns
        # One line per failure: the end of a process whose failure was logged already (its Go
        # thread limit, its OOM kill), and an end on request, are exits (shown when asked).
        if view.go_thread_limit is not None and row["exit_code"] == 2:
            view.ended = f"exit 2: Go's {view.go_thread_limit}-thread limit"
            self._log(LogEntry(time_ns, view.pid, view.comm, view.ended, "exit"))
            return
        if row["signal"]:
            view.ended = row["signal"]
            self._log(LogEntry(time_ns, view.pid, view.comm,
                               f"killed by {row['signal']}" + (" (the OOM kill)" if after_oom else ""),
                               "error" if found == "killed by a signal" and not after_oom else "exit"))
        else:
            view.ended = "exited" if row["exit_code"] is None else f"exit {row['exit_code']}"
            if row["exit_code"]:  # shown only when asked: short-lived programs exit 1 all day
                self._log(LogEntry(time_ns, view.pid, view.comm, view.ended, "exit"))

    def apply_samples(self, samples: list[ProcessSample], time_ns: int) -> None:
        """Fold in a sampling round of /proc (or its recorded copy)."""
        for sample in samples:
            view = self._process(sample.pid, sample.comm, sample.start_ns)
            view.sampled = True
            view.open_fds = sample.open_fds
            view.fd_soft_limit = sample.fd_soft_limit
            view.fd_hard_limit = sample.fd_hard_limit
            view.sockets = sample.sockets
            view.threads = sample.threads
            view.thread_limit = binding_limit(sample)
            view.go_limit_unread = getattr(sample, "go_limit_unread", None)
            view.placement = (sample.cgroup, sample.unit, sample.container_id, sample.container_runtime,
                              sample.pod_uid)
            view.history = _appended(view.history, (time_ns, sample.open_fds))
            view.peak_fds = max(view.peak_fds or 0, sample.open_fds)
            view.rss_split = (sample.rss_anon_kb, sample.rss_file_kb, sample.rss_shmem_kb)
            view.rss_kb = sample.rss_kb
            view.memcg_usage = sample.memcg_usage_bytes
            if sample.memcg_limit_bytes is not None or sample.memcg_usage_bytes is not None:
                # a dying process's last sample may have lost its cgroup's limit: its newest limit seen
                # stays, as the report reads a recording's (the newest sample with a limit)
                view.memcg_limit = sample.memcg_limit_bytes if sample.memcg_limit_bytes is not None else (
                    view.memcg_limit)
            memory = sample.memcg_usage_bytes if sample.memcg_usage_bytes is not None else (
                sample.rss_kb * 1024 if sample.rss_kb is not None else None)
            if memory is not None:
                view.memory_history = _appended(view.memory_history, (time_ns, sample.sockets, memory))
                if sample.sockets is not None:
                    view.memory_levels.add(sample.sockets, memory)
            if sample.memcg_usage_bytes is not None:
                view.memory_in_cgroup = True
                view.memcg_peak = max(view.memcg_peak or 0, sample.memcg_usage_bytes)
            view.thread_history = _appended(view.thread_history, (time_ns, sample.threads))
            view.last_seen_ns = max(view.last_seen_ns, time_ns)

    def apply_census(self, census: list[ThreadCensus]) -> None:
        """Fold in a round's thread census."""
        for entry in census:
            view = self.processes.get(entry.pid)
            if view is not None:
                view.census = list(entry.states)

    def apply_fd_sites(self, sites: list[SiteRow], time_ns: int) -> None:
        """Fold in a round's changed call sites (--stacks): open count and growth per minute."""
        for site in sites:
            if not site.open and site.pid not in self.processes:
                continue
            view = self._process(site.pid, site.comm, None)
            key = site.stack_id if site.origin == "traced" else None
            history = view.fd_site_history.setdefault(key, deque(maxlen=120))
            history.append((time_ns, site.open))
            growth = None
            if len(history) > 1 and history[-1][0] > history[0][0]:
                growth = (history[-1][1] - history[0][1]) / ((history[-1][0] - history[0][0]) / 60e9)
            if site.open:
                view.fd_sites[key] = (site.open, growth)
            else:
                view.fd_sites.pop(key, None)
                view.fd_site_history.pop(key, None)

    def apply_stacks(self, stacks: list[Stack]) -> None:
        """Remember the sites the stacks name (the most recent MAX_SITES)."""
        for stack in stacks:
            self.site_names[stack.stack_id] = site_name(stack.frames)
        while len(self.site_names) > MAX_SITES:
            self.site_names.pop(next(iter(self.site_names)))

    def _demands(self, row: dict[str, Any]) -> None:
        """What an haproxy sized itself for (show info's Maxsock), or failing that what its
        configuration demands: the needs model's "what the program demands of itself"."""
        pid, maxsock = row.get("haproxy_pid"), row.get("maxsock")
        if pid is not None and row.get("source") == "configuration" and row.get("ulimit_n") is not None \
                and row.get("socket") is not None:  # the configuration's ulimit-n: where its limit may be set
            self._limit_configs[int(pid)] = (int(row["ulimit_n"]), str(row["socket"]))
            while len(self._limit_configs) > MAX_DEMANDED:
                self._limit_configs.pop(next(iter(self._limit_configs)))
            if int(pid) in self.processes:
                self.processes[int(pid)].limit_config = self._limit_configs[int(pid)]
        if pid is not None and row.get("maxconn") is not None:
            self._maxconns[int(pid)] = int(row["maxconn"])
            while len(self._maxconns) > MAX_DEMANDED:
                self._maxconns.pop(next(iter(self._maxconns)))
            if int(pid) in self.processes:
                self.processes[int(pid)].maxconn = int(row["maxconn"])
        if pid is None or maxsock is None:
            return
        from_config = row.get("source") == "configuration"
        known = self._demanded.get(int(pid))
        if from_config and known is not None and known[1] is None:
            return  # show info's own figure is better
        self._demanded[int(pid)] = (int(maxsock), "configuration" if from_config else None)
        while len(self._demanded) > MAX_DEMANDED:
            self._demanded.pop(next(iter(self._demanded)))
        if int(pid) in self.processes:
            self.processes[int(pid)].maxsock, self.processes[int(pid)].maxsock_from = self._demanded[int(pid)]

    def apply_haproxy(self, rows: list[dict[str, Any]], time_ns: int) -> None:
        """Fold in `show info` samples: alert when CurrConns stays above 90 % of maxconn for 30 s,
        and say once when a socket does not answer."""
        for row in rows:
            self._demands(row)
            if row.get("source") == "configuration":  # what it demands, not its state
                continue
            view = self.haproxy.setdefault(row["socket"], HaproxyView(row["socket"]))
            if row.get("error"):  # keep the last answer: a socket times out when HAProxy is out of FDs
                if view.error is None:
                    view.error_since_ns = time_ns
                view.error = str(row["error"])
                if not view.unreachable_logged:
                    pid, comm = self._haproxy_named(row.get("haproxy_pid") or view.row.get("haproxy_pid"), row)
                    last = (f"; last answer: {view.row.get('curr_conns')}/{view.row.get('maxconn')} connections"
                            if view.row else "")
                    said = "" if str(row["error"]).startswith(NOT_ASKED) else "does not answer: "
                    self._log(LogEntry(time_ns, pid, comm, f"stats socket {row['socket']} {said}"
                                                           f"{row['error']}{last}", "warning"))
                    view.unreachable_logged = True
                continue
            view.row, view.error, view.error_since_ns, view.answered_ns = row, None, None, time_ns
            view.unreachable_logged = False
            usage = view.usage
            if usage is None or usage <= HAPROXY_BUSY:
                view.busy_since_ns, view.alerted = None, False
                continue
            if view.busy_since_ns is None:
                view.busy_since_ns = time_ns
            if not view.alerted and time_ns - view.busy_since_ns >= HAPROXY_BUSY_FOR_NS:
                view.alerted = True
                pid, comm = self._haproxy_named(row.get("haproxy_pid"), row)
                self._log(LogEntry(time_ns, pid, comm, f"{row['curr_conns']} connections of maxconn "
                                                       f"{row['maxconn']} ({usage:.0%}) for 30 s", "error"))

    def _haproxy_named(self, pid: Any, row: dict[str, Any]) -> tuple[int, str]:
        """The pid and name a stats socket's log line gives its haproxy: the row's (a live sample
        names it), else the process view's, else "haproxy"; pid 0 when no haproxy is known (the
        line then names no pid)."""
        known = int(pid) if pid else 0
        view = self.processes.get(known) if known else None
        return known, str(row.get("comm") or (view.comm if view is not None and view.comm else "haproxy"))

    def apply_phases(self, phases: dict[int, PhaseNow]) -> None:
        """Where each process of a training job is now (replaces what was known)."""
        self.phases = dict(phases)

    def apply_system(self, figures: dict[str, Any]) -> None:
        """Fold in the system figures (file-nr, file-max, ...)."""
        self._system_figures = dict(figures)

    def roll(self, now_ns: int, losses: dict[str, int]) -> None:
        """Close the rate window at ``now_ns``: per-second rates, aggregated log lines, header."""
        self.now_ns = now_ns
        first = self._window_start_ns is None
        if first:  # the first window (after a start or a seek) has no start: no rates from it
            self._window_start_ns = now_ns
            self._window.clear()
            self._window_events = 0
        seconds = max((now_ns - (self._window_start_ns or now_ns)) / 1e9, 1e-3)
        exhaustion: Counter[int] = Counter()
        for (pid, _syscall, _errno), count in self._window_errors.items():
            if not first:  # its errors are logged below, but they are no rate
                exhaustion[pid] += count
        active = {pid for pid, _kind in self._window} | set(exhaustion)
        for view in self.processes.values():  # most had no event in the window: no rates to work out
            if view.pid not in active:
                view.rates = dict(NO_RATES)
                continue
            view.rates = {kind: self._window.get((view.pid, kind), 0) / seconds for kind in RATE_KINDS}
            view.rates["fd_exhaustion"] = exhaustion.get(view.pid, 0) / seconds
        for key, count in sorted(self._window_errors.items(), key=lambda item: self._window_error_first[item[0]]):
            pid, syscall, errno = key
            comm = self._window_error_comm.get(key) or (self.processes[pid].comm if pid in self.processes else "")
            times = f" x{count}" if count > 1 else ""
            self._log(LogEntry(self._window_error_first[key], pid, comm, f"{syscall} failed with {errno}{times}",
                               "error"))
        for view in self.processes.values():
            if view.rates.get("thread_start", 0.0) >= THREAD_BURST_PER_S:
                self._log(LogEntry(now_ns, view.pid, view.comm,
                                         f"thread burst: {view.rates['thread_start']:.0f} threads/s", "warning"))
        lost = sum(losses.values())
        self.system = SystemView(
            file_nr=self._system_figures.get("file_nr"), file_max=self._system_figures.get("file_max"),
            oom_kills=self._oom_kills, events_per_s=self._window_events / seconds, losses=lost,
            loss_detail=", ".join(f"{k} {v}" for k, v in losses.items() if v), exact=exact_counts(losses),
        )
        self._window.clear()
        self._window_errors.clear()
        self._window_error_first.clear()
        self._window_error_comm.clear()
        self._window_events = 0
        self._window_start_ns = now_ns
        self._forget(now_ns)

    def _forget(self, now_ns: int) -> None:
        """Drop the processes that ended (or were not seen, with nothing to alert on) longer than
        ``keep_exited_ns`` ago, the earliest ended without failing past ``max_ended``, then the
        least recently seen past ``max_processes``."""
        old = now_ns - self.keep_exited_ns
        gone = [pid for pid, view in self.processes.items()
                if (view.ended_ns is not None and view.ended_ns < old)
                or (view.ended_ns is None and view.last_seen_ns < old and not view.alerts)]
        leaving = set(gone)
        ended = [(view.ended_ns, pid) for pid, view in self.processes.items()
                 if view.ended_ns is not None and not view.failed and pid not in leaving]
        if len(ended) > self.max_ended:  # a churning host: the ends that did not fail, the latest kept
            ended.sort()
            gone += [pid for _, pid in ended[:len(ended) - self.max_ended]]
        excess = len(self.processes) - len(gone) - self.max_processes
        if excess > 0:  # the ended that did not fail go first, then the least recently seen; the failed last
            leaving = set(gone)
            kept = sorted((view.failed, view.ended_ns is None, view.last_seen_ns, pid)
                          for pid, view in self.processes.items() if pid not in leaving)
            gone += [key[-1] for key in kept[:excess]]
        for pid in gone:
            del self.processes[pid]
        self.forgotten += len(gone)

    def rows(self, order: Callable[[ProcessView], Any] | None = None, text_filter: str = "",
             reverse: bool = False) -> list[ProcessView]:
        """The processes to show, filtered by name or pid and sorted by ``order`` (by default
        ``headroom_key``; worst first; ``reverse``:
        best first) in three groups: those that failed (``ProcessView.failed``), ended or not;
        then the live ones; then those that ended without failing (a clean exit never ranks
        above a failure)."""
        return self.top_rows(order, text_filter, reverse)[0]

    def top_rows(self, order: Callable[[ProcessView], Any] | None = None, text_filter: str = "",
                 reverse: bool = False, limit: int | None = None) -> tuple[list[ProcessView], int]:
        """The first ``limit`` of ``rows()`` (all when None), and how many ``rows()`` has: only the
        groups that reach into the first ``limit`` are ordered, and only as far as needed."""
        wanted = text_filter.strip().lower()
        views = [v for v in self.processes.values()
                 if not wanted or wanted in v.comm.lower() or wanted == str(v.pid)
                 or any(wanted in part.lower() for part in v.placement if part)]
        groups: tuple[list[ProcessView], ...] = ([], [], [])
        for view in views:
            groups[0 if view.failed else 1 if view.ended is None else 2].append(view)
        key = order or headroom_key
        shown: list[ProcessView] = []
        for group in groups:
            room = len(group) if limit is None else min(len(group), limit - len(shown))
            if room <= 0:
                continue
            if room == len(group):
                shown += sorted(group, key=key, reverse=reverse)
            else:  # as sorted(...)[:room], by the standard library's word
                shown += (heapq.nlargest if reverse else heapq.nsmallest)(room, group, key=key)
        return shown, len(views)


def _same_instance(view: ProcessView, totals: CountedInstance) -> bool:
    """Whether a counters' process instance is the one a row shows (not an earlier or later
    process of the same pid): the one read for it before; else, for a row no reading named yet,
    a live instance for a live row, an ended one for an ended row."""
    if view.kernel_instance is not None:
        return view.kernel_instance == totals.first_ts
    return (totals.exit_ts is None) == (view.ended is None)


def headroom_key(view: ProcessView) -> tuple[Any, ...]:
    """Failed first, by harm (``ProcessView.harm``); then the nearest to a limit: its FD table's or
    its memory cgroup's."""
    usage = max((u for u in (view.usage, view.memory_usage) if u is not None), default=None)
    return (not view.failed, view.harm() if view.failed else (0, 0, 0), -(usage if usage is not None else -1.0),
            view.pid)


def _ns(value: Any) -> int:
    """Nanoseconds of a timestamp: from ``plain_rows`` already, or a pandas Timestamp or datetime."""
    if isinstance(value, int):
        return value
    if hasattr(value, "value"):
        return int(value.value)
    return int(value.timestamp() * 1e9)


def _codes(column: Any) -> tuple[np.ndarray, list[str | None]]:
    """A text column as (a code per row, the text of each code): its dictionary's indices when it
    is one (chunks' dictionaries unified), else dictionary-encoded; a null's code is the last,
    whose text is None."""
    if isinstance(column, pa.ChunkedArray):
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        chunks = column.unify_dictionaries().chunks
        if not chunks:
            return np.zeros(0, dtype=np.int64), [None]
        dictionary = chunks[0].dictionary
        indices = pa.chunked_array([chunk.indices for chunk in chunks], type=chunks[0].indices.type)
    else:
        array = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
        dictionary, indices = array.dictionary, array.indices
    names: list[str | None] = [*dictionary.to_pylist(), None]
    codes = pc.fill_null(indices, len(names) - 1).to_numpy().astype(np.int64)
    return codes, names



def duration(seconds: float | None) -> str:
    """Time to exhaustion, short: 45s, 12m, 3h."""
    if seconds is None:
        return "·"
    if seconds <= 0:
        return "FULL"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"
