"""The live source: the kernel's events and counters, with a sampling round of /proc (and of
HAProxy's stats sockets) every interval, and where the ranks of training jobs are."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from fdtrace.integrations.haproxy import HaproxySampler, HaproxyWatch
from fdtrace.integrations.phases.live import LivePhases
from fdtrace.kernel.clock import ClockQualityReader, sample_offsets
from fdtrace.kernel.counters import CounterStore
from fdtrace.kernel.loader import TraceOptions
from fdtrace.kernel.session import KernelSession
from fdtrace.kernel.stacks import BlockedCode
from fdtrace.kernel.syscalls import syscall_name
from fdtrace.pipeline.update import SampleRound, SourceInfo, Update
from fdtrace.policy import FD_EXHAUSTION_ERRNOS
from fdtrace.procfs import ProcFS
from fdtrace.procfs.reader import READ_ERRORS
from fdtrace.procfs.sampler import ProcSampler
from fdtrace.procfs.thread_limits import binding_limit
from fdtrace.procfs.threads import thread_census
from fdtrace.schema import arrow_schema
from fdtrace.schema.failures import incident_mask
from fdtrace.schema.records import ProcessSample, ThreadCensus
from fdtrace.sources.filters import keep_comms
from fdtrace.sources.memory import return_freed_memory

#: How often the live view reads the ranks' phase state files.
PHASES_INTERVAL_NS = 250_000_000
#: ``failures_first``: rounds brought forward by new failures are at least this far apart ...
FAILURES_FIRST_GAP_S = 0.25
#: ... and sample the failing processes for at most this share of the interval.
EARLY_ROUND_SHARE = 0.1


@dataclass(frozen=True)
class LiveOptions:
    """What the live source traces and samples.

    Attributes:
        trace: what the BPF programs trace (pids, follow, errors only, ring size).
        comms: only events of tasks with these names (all when empty).
        interval_s: seconds between rounds: counters, losses and clock are read each round.
        sample: whether rounds sample /proc (``trace`` reads only counters).
        top_processes: each round samples the processes with events plus this many with the most FDs.
        cmdline: samples carry command lines.
        haproxy_sockets: stats sockets sampled each round.
        find_haproxy_sockets: whether the stats sockets the configurations of the haproxys sampled
            name are asked too (``rehearse`` does not: its own connection would be one of the
            descriptors it measures, and could cost a target at its limit an accept).
        live_phases: read the phase state files of jobs under `fdtrace run` (the live view).
        keep_exited: exited processes whose final counters are kept (for --totals).
        exiting: the process ends when the source stops (a command): the slow detaching of the
            probes is left to a helper (see ``KernelSession.stop``).
        census_processes: each round takes a thread census of this many sampled processes, those
            nearest a thread limit (and of every process traced with --pid).
        samples_of_comms_only: with ``comms``, rounds sample only processes of those names too
            (`top --comm`); otherwise ``comms`` filters the events only.
        round_share: a round's /proc sampling stops after this share of the interval: the
            processes failing, those named (--pid, --comm) and those nearest a limit first, the
            rest as time allows (each round says what it took and how many it left out).
        failures_first: (the live view) each poll reads the in-kernel error table and the
            ending events kept beside the ring first; a process that newly failed with
            EMFILE/ENFILE, was OOM-killed or hit Go's thread limit brings the round forward,
            itself sampled first, and that poll hands out the round (exact counters, its sample,
            the ending events) before the ring's events, which a flood can hold back for seconds
            (at most one such round per ``FAILURES_FIRST_GAP_S``).
    """

    trace: TraceOptions = TraceOptions()
    comms: tuple[str, ...] = ()
    interval_s: float = 1.0
    sample: bool = True
    top_processes: int = 20
    cmdline: bool = False
    haproxy_sockets: tuple[str, ...] = ()
    find_haproxy_sockets: bool = True
    live_phases: bool = False
    keep_exited: int = 100_000
    exiting: bool = False
    census_processes: int = 3
    samples_of_comms_only: bool = False
    round_share: float = 0.5
    failures_first: bool = False


class LiveSource:
    """The live kernel as a pipeline source. ``start()`` compiles and attaches the programs."""

    def __init__(self, options: LiveOptions | None = None, sampler: ProcSampler | None = None,
                 phases: LivePhases | None = None) -> None:
        self.options = options or LiveOptions()
        self.kernel = KernelSession(self.options.trace, keep_exited=self.options.keep_exited)
        self.sampler = sampler or ProcSampler(cmdline=self.options.cmdline)
        # Stats sockets asked for, and those the configurations of the haproxys sampled name.
        self.haproxy = (HaproxySampler(list(self.options.haproxy_sockets), interval_s=self.options.interval_s)
                        if self.options.haproxy_sockets or (self.options.sample and self.options.find_haproxy_sockets)
                        else None)
        self._haproxy_watch = (HaproxyWatch(ProcFS(), self.haproxy)
                               if self.options.sample and self.options.find_haproxy_sockets else None)
        self.phases = phases or (LivePhases() if self.options.live_phases else None)
        self._procfs = ProcFS()
        self._blocked_code = BlockedCode()  # the census's code of blocked threads
        self._go_shortfalls: list[str] = []
        self._pids_with_events: set[int] = set()
        self._pids_failing: dict[int, None] = {}  # failed (EMFILE, OOM kill...) since the last round, in order
        self._failed_instances: set[tuple[int, int]] = set()  # failures_first: those seen in the error table
        self._last_early_round = 0.0
        self._no_events = arrow_schema().empty_table()
        self._info: SourceInfo | None = None
        self._next_round = time.monotonic()
        self._rounds_asked: list[threading.Event] = []
        self._rounds_asked_lock = threading.Lock()
        self._next_phases = 0
        self._clock_quality = ClockQualityReader()
        self._boot_wall_ns = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        #: Hears each start-up step as it begins (the command line shows them while bcc compiles).
        self.on_stage: Callable[[str], None] | None = None

    @property
    def notes(self) -> list[str]:
        """Things the user should know (tracefs mounted, probes this kernel lacks)."""
        return self.kernel.notes

    def shortfalls(self) -> list[str]:
        """What the bounded readers of other users' data left unread so far, in words: binaries
        whose symbols were not read, Python stack walks abandoned, shared slots (Go uprobes,
        stats sockets) refused."""
        said = self._blocked_code.shortfalls()
        if self.kernel.started:
            self._go_shortfalls = self.kernel.tracer.go_shortfalls()
        said += self._go_shortfalls  # as last read, once the kernel session has stopped
        if self._haproxy_watch is not None:
            said += self._haproxy_watch.shortfalls()
        if self.sampler.unread_go_limits:
            said.append(f"{self.sampler.unread_go_limits} reads of a Go program's thread limit left for a later round "
                        "(the bytes of binaries read a round were spent)")
        return said

    @property
    def counters(self) -> CounterStore:
        """The exact per-process totals as last read."""
        return self.kernel.counters

    @property
    def info(self) -> SourceInfo:
        if self._info is None:
            raise RuntimeError("LiveSource.start() was not called")
        return self._info

    def _describe(self) -> SourceInfo:
        trace = self.options.trace
        return SourceInfo(
            host=self.kernel.host, live=True, probes_attached=tuple(self.kernel.probes),
            probes_skipped=tuple(self.kernel.tracer.skipped),
            options={"pids": list(trace.pids), "follow": trace.follow, "errors_only": trace.errors_only,
                     "ring_pages": trace.ring_pages, "stacks": trace.stacks},
            interval_s=self.options.interval_s, cmdline=self.options.cmdline)

    def start(self) -> None:
        self.kernel.start(on_stage=self.on_stage)
        self.notes.extend(return_freed_memory())
        self._info = self._describe()
        if self.haproxy is not None:
            self.haproxy.start()

    def poll(self) -> Update:
        if self.options.failures_first:
            early = self._failures_first()
            if early is not None:
                return early
        update = self._events()
        now = time.monotonic()
        if self.phases is not None and time.monotonic_ns() >= self._next_phases:
            self._next_phases = time.monotonic_ns() + PHASES_INTERVAL_NS
            update.phases = self.phases.poll()
        if now >= self._next_round:
            with self._rounds_asked_lock:
                asked, self._rounds_asked = self._rounds_asked, []
            self._next_round = now + self.options.interval_s if asked else \
                max(self._next_round + self.options.interval_s, now)
            self._round(update)
            for done in asked:
                done.set()
        return update

    def _failures_first(self) -> Update | None:
        """A round taken now, before the ring's events are read, when a process newly failed
        with EMFILE/ENFILE (the error table says so at once; its events may be seconds behind a
        flood's), or was OOM-killed or died of Go's thread limit (the kernel keeps those events
        beside the ring): it is sampled first and the round's counters carry its exact counts;
        the update holds the ending events, none of the ring's."""
        now = time.monotonic()
        if now - self._last_early_round < FAILURES_FIRST_GAP_S:
            return None
        ending = self.kernel.take_ending()
        failed = self.kernel.failed_instances(FD_EXHAUSTION_ERRNOS)
        new = failed - self._failed_instances
        self._failed_instances = failed
        if not new and ending is None:
            return None
        self._last_early_round = now
        events = self._taken_in(ending.events) if ending is not None else self._no_events
        for pid, _first_ts in sorted(new, key=lambda instance: instance[1]):
            self._pids_failing[pid] = None
        update = Update(now_ns=time.time_ns(), events=events, boot_wall_ns=self._boot_wall_ns, urgent=True)
        self._round(update, early=True)
        return update

    def round_now(self) -> threading.Event:
        """Ask for a sampling round at the next poll, from any thread (``fdtrace rehearse`` asks one
        while a burst's connections are held, so the recording holds the peak a timed round could
        miss); the event is set once the round's figures are read."""
        done = threading.Event()
        with self._rounds_asked_lock:
            self._rounds_asked.append(done)
            self._next_round = 0.0
        return done

    def finish(self) -> Update:
        update = self._events(final=True)
        self._round(update)
        update.final = True
        update.unread = self.shortfalls()
        return update

    def stop(self) -> None:
        self.shortfalls()  # what the kernel session counted, kept past its end
        if self.haproxy is not None:
            self.haproxy.close()
        self.kernel.stop(exiting=self.options.exiting)

    def _events(self, final: bool = False) -> Update:
        batch = self.kernel.poll(final=final)
        events = self._taken_in(batch.events)
        return Update(now_ns=time.time_ns(), events=events, losses=batch.losses, boot_wall_ns=self._boot_wall_ns,
                      stacks=batch.stacks, connections=batch.connections, more=self.kernel.behind)

    def _early_round(self, update: Update) -> None:
        """The round ``_failures_first`` hands out: the failing processes' samples and the
        exact counters, nothing that scans every process (the ranking by open FDs, the processes
        with events, the census, HAProxy)."""
        offsets = dataclasses.replace(sample_offsets(), quality=self._clock_quality.read())
        samples = []
        if self.options.sample:
            failing = [pid for pid in self._pids_failing if pid != os.getpid()]
            samples = self.sampler.processes(failing, budget_s=EARLY_ROUND_SHARE * self.options.interval_s)
            # Those the budget left out stay first for the timed round.
            for pid in failing[:len(failing) - self.sampler.unsampled]:
                self._pids_failing.pop(pid, None)
            if self.options.comms and self.options.samples_of_comms_only:
                samples = [s for s in samples if s.comm in self.options.comms]
        else:
            self._pids_failing.clear()
        update.rounds.append(SampleRound(offsets.mono_ns, offsets.mono_ns + offsets.realtime_offset_ns, samples,
                                         None, [], offsets))
        update.counters = self.kernel.read_counters()
        update.losses = self.kernel.read_losses()

    def _taken_in(self, events: pa.Table) -> pa.Table:
        """Events of the names asked for (``comms``), their processes noted for the next round
        (those failing to be sampled first)."""
        events = keep_comms(events, self.options.comms)
        if events.num_rows:
            self._pids_with_events.update(events["pid"].unique().to_pylist())
            failing = events.filter(incident_mask(events))
            if failing.num_rows:
                self._pids_failing.update(dict.fromkeys(failing["pid"].to_pylist()))
        return events

    def _round(self, update: Update, early: bool = False) -> None:
        """Counters, losses and clock, and (when sampling) /proc and HAProxy, into the update.
        ``early``: a round brought forward by new failures (``failures_first``): only the failing
        processes are sampled (at most ``EARLY_ROUND_SHARE`` of the interval), with the exact
        counters, and the timed round stays due when it was."""
        if early:
            self._early_round(update)
            return
        # The call sites first, then the round's time: their rows carry it, and no descriptor they
        # count was made after it.
        sites, stacks = self.kernel.read_fd_sites() if self.options.trace.stacks else ([], [])
        offsets = dataclasses.replace(sample_offsets(), quality=self._clock_quality.read())
        samples, system = [], None
        if self.options.sample:
            first = [*self._pids_failing, *self.options.trace.pids, *self._named()]
            samples = self.sampler.round(self._pids_with_events | set(self.options.trace.pids),
                                         self.options.top_processes, exclude=os.getpid(), first=first,
                                         budget_s=self.options.round_share * self.options.interval_s)
            if self.options.comms and self.options.samples_of_comms_only:
                samples = [s for s in samples if s.comm in self.options.comms]
            system = self.sampler.system()
            for sample in samples:
                if sample.go_max_threads is not None:  # a Go binary: its thread-limit message is read
                    try:
                        self.kernel.watch_go_runtime(sample.pid)
                    except OSError as error:  # its /proc/PID/exe went while it was looked at
                        self.sampler.skip(error)
        self._pids_with_events.clear()
        self._pids_failing.clear()
        haproxy = self.haproxy.sample() if self.haproxy is not None else []
        if self._haproxy_watch is not None:
            haproxy = self._haproxy_watch.look(samples) + haproxy
        sample_round = SampleRound(offsets.mono_ns, offsets.mono_ns + offsets.realtime_offset_ns, samples,
                                   system, haproxy, offsets)
        if self.options.sample:
            sample_round.cost_s, sample_round.unsampled = self.sampler.round_s, self.sampler.unsampled
        update.counters = self.kernel.read_counters()
        update.losses = self.kernel.read_losses()
        if self.options.sample:
            sample_round.threads = self._census(samples)
        sample_round.fd_sites = sites
        update.stacks.extend(stacks)
        update.rounds.append(sample_round)

    def _named(self) -> list[int]:
        """With ``samples_of_comms_only``, the live processes of the names asked for (`top --comm`):
        sampled first. Their names are read from /proc only for the pids with events."""
        if not (self.options.comms and self.options.samples_of_comms_only):
            return []
        named = []
        for pid in self._pids_with_events:
            try:
                if self._procfs.stat(pid).comm in self.options.comms:
                    named.append(pid)
            except READ_ERRORS:
                continue
        return named

    def _census(self, samples: list[ProcessSample]) -> list[ThreadCensus]:
        """The thread census of the processes nearest a thread limit (and of those under --pid)."""
        def nearness(sample: ProcessSample) -> float:
            limit = binding_limit(sample)
            return limit[1] / limit[2] if limit and limit[2] > 0 else 0.0

        chosen = [s for s in sorted(samples, key=nearness, reverse=True) if s.threads > 1]
        chosen = chosen[:self.options.census_processes]
        wanted = {s.pid: s.comm for s in chosen}
        for sample in samples:
            if sample.pid in self.options.trace.pids:
                wanted[sample.pid] = sample.comm
        census = []
        self._blocked_code.begin()
        for pid, comm in wanted.items():
            try:
                census.append(ThreadCensus(pid, comm, thread_census(self._procfs, pid, syscall_name,
                                                                    site_of=self._blocked_code)))
            except READ_ERRORS as error:
                self.sampler.skip(error)
        return census
