"""fdtrace's BPF programs on this kernel: checked, compiled, attached, and read in batches
(events, exact counters, losses)."""

from __future__ import annotations

import errno as errno_module
import os
import resource
import socket
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fdtrace.errors import FdtraceError
from fdtrace.kernel.clock import sample_offsets
from fdtrace.kernel.counters import CounterStore
from fdtrace.kernel.decode import decode, decode_connections, split_connections
from fdtrace.kernel.descriptors import MAX_REMEMBERED, DescriptorTracker
from fdtrace.kernel.features import (
    KernelFeatures,
    check_kernel_headers,
    check_privileges,
    ensure_tracefs,
    has_task_pt_regs,
    probe_kernel,
)
from fdtrace.kernel.loader import MAX_GO_BINARIES, BpfTracer, TraceOptions, lifecycle_probes, syscall_probes
from fdtrace.kernel.stacks import Symbolizer, symbolize
from fdtrace.procfs import ProcFS, StartTimeResolver
from fdtrace.schema import RAW_EVENT_DTYPE, Kind, arrow_schema
from fdtrace.schema.records import EventBatch, SiteRow, Stack


def raise_nofile_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit, so that fdtrace keeps working
    on a machine that is running out of file descriptors. Returns the new (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


#: Descriptors fdtrace holds besides its probes (two each at most: the program and its perf event)
#: and what the parts below count: its maps and ring buffer, the kept programs' file, Python's, the
#: reads of /proc, a stats socket and a phase file read at a time. bench/fd_budget (docs/benchmarks.md)
#: found at most 16 (`trace`, `record`, `export`, `top`, over a churning host); 10 more for what it
#: does not exercise.
OWN_DESCRIPTORS = 26
#: --stacks: its maps, a listing of /proc/PID/fd, the symbolizer's /proc/PID/mem and a binary (and its
#: debug file) read at a time. bench/fd_budget found at most 8.
STACKS_DESCRIPTORS = 16
#: The pipe of the helper that detaches the probes once fdtrace has exited (``_hand_off_detaching``).
DETACH_HELPER_DESCRIPTORS = 2
#: A uprobe (its perf event) per Go binary watched for its thread-limit message (each exec'd one, up
#: to the loader's MAX_GO_BINARIES), and their program. Measured: 16 Go programs, 17 more.
GO_WATCH_DESCRIPTORS = MAX_GO_BINARIES + 1

#: Descriptors that sinks and sources will hold besides the kernel's, by owner: what they are for
#: and how many (``reserve_descriptors``). Counted by ``check_nofile``; forgotten with their owner.
_RESERVED: weakref.WeakKeyDictionary[object, dict[str, int]] = weakref.WeakKeyDictionary()


def reserve_descriptors(owner: object, what: str, count: int) -> None:
    """Count ``count`` descriptors that ``owner`` will hold once running (a recording's folders, a
    metrics server's connections) in the budget ``check_nofile`` checks before the probes attach;
    until ``release_descriptors(owner)`` or the owner is gone. An owner may reserve for several
    things (each ``what`` once)."""
    _RESERVED.setdefault(owner, {})[what] = count


def release_descriptors(owner: object) -> None:
    """Stop counting what ``owner`` reserved."""
    _RESERVED.pop(owner, None)


def planned_probes(features: KernelFeatures, options: TraceOptions) -> list[str]:
    """The tracepoints ``BpfTracer`` attaches for these options on this kernel (in its order)."""
    return [tracepoint for tracepoint, _ in syscall_probes(features, options)] + lifecycle_probes(features, options)


@dataclass(frozen=True)
class DescriptorBudget:
    """What fdtrace will hold at most, part by part (``needed`` is their sum)."""

    parts: tuple[tuple[str, int], ...]

    @property
    def needed(self) -> int:
        """The hard RLIMIT_NOFILE it needs."""
        return sum(count for _, count in self.parts)

    def __str__(self) -> str:
        return ", ".join(f"{what}: {count}" for what, count in self.parts if count)


def descriptor_budget(features: KernelFeatures, options: TraceOptions, open_now: int | None = None
                      ) -> DescriptorBudget:
    """The descriptors fdtrace will need with these options: those open already (``open_now``,
    counted in /proc/self/fd by default), two per probe, its own, --stacks's, the detach helper's,
    the uprobes of the Go binaries it may watch, and what sinks and sources reserved
    (``reserve_descriptors``)."""
    if open_now is None:
        open_now = ProcFS().own_open_fds()
    probes = len(planned_probes(features, options))
    parts = [("open already", open_now), (f"{probes} probes", 2 * probes), ("its own", OWN_DESCRIPTORS)]
    if options.stacks:
        parts.append(("--stacks", STACKS_DESCRIPTORS))
    parts.append(("the detach helper", DETACH_HELPER_DESCRIPTORS))
    parts.append(("Go programs watched", GO_WATCH_DESCRIPTORS))  # each Go binary exec'd gets a uprobe
    parts += sorted(item for reserved in _RESERVED.values() for item in reserved.items())
    return DescriptorBudget(tuple(parts))


def check_nofile(features: KernelFeatures, options: TraceOptions | None = None) -> DescriptorBudget:
    """Refuse in one line, before bcc opens anything, a hard RLIMIT_NOFILE below what fdtrace
    will hold (``descriptor_budget``): bcc would fail with dozens of lines of errors, or fdtrace
    later, mid-recording or at its stop. Returns the budget."""
    budget = descriptor_budget(features, options or TraceOptions())
    needed = budget.needed
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise FdtraceError(f"the hard RLIMIT_NOFILE is {hard}: fdtrace needs {needed} file descriptors "
                           f"({budget}); raise it (prlimit --nofile={needed}:{needed}, ulimit -Hn, or "
                           "LimitNOFILE= of its unit)")
    return budget


#: Notes kept at most (the Go binaries that cannot be watched add one each).
MAX_NOTES = 64
#: A read of at least this many records is a flood: its records are held to be decoded with the
#: next reads' (``KernelSession.poll``) ...
HOLD_FROM = 1024
#: ... until this many are held; and a poll decodes at most this many (the rest stay held, and
#: the ring is not read again until they are decoded: the backlog stays the ring's to bound and
#: count), so that no poll holds its caller for a flood's whole backlog.
DECODE_AT = 32768
#: ... or the first of them was read this long ago (CLOCK_MONOTONIC ns).
HOLD_NS = 50_000_000
#: The kinds the kernel keeps beside the ring until taken (``KernelSession.take_ending``).
ENDING_KINDS = np.array([Kind.OOM_KILL, Kind.GO_THREAD_LIMIT], dtype=np.uint8)
#: Those handed out that are remembered, so that the other copy is dropped: far more than can be
#: waiting in the ring (the kernel keeps 1,024 at most).
ENDING_SEEN = 8192


class KernelSession:
    """Attaches the probes on ``start()``; each ``poll()`` returns the events since the last.

    Attributes:
        notes: things the user should know (tracefs mounted, probes skipped).
        counters: exact per-process totals, refreshed by ``read_counters()``.
    """

    def __init__(self, options: TraceOptions | None = None, keep_exited: int = 100_000) -> None:
        """Args:
            options: what to trace.
            keep_exited: how many exited processes' final counters ``counters`` keeps.
        """
        self.options = options or TraceOptions()
        self.host = socket.gethostname()
        self.notes: list[str] = []
        self.counters = CounterStore(max_exited=keep_exited)
        self._resolver = StartTimeResolver()
        self._tracer: BpfTracer | None = None
        self._probes_at_stop: list[str] = []
        self._empty = arrow_schema().empty_table()
        self._last_losses: dict[str, int] = {}
        self._losses_read_ns = -(10**18)
        self._symbolizer: Symbolizer | None = None
        self._descriptors: DescriptorTracker | None = None
        self._site_ids: OrderedDict[int, int | None] = OrderedDict()  # kernel stack id -> site
        self._frames_seen: OrderedDict[tuple[int, tuple[str, ...], str | None], int] = OrderedDict()
        self._pending_stacks: list[Stack] = []
        self._held: list[np.ndarray] = []  # records read but not decoded yet (a flood: see poll)
        self._held_count = 0
        self._held_since_ns = 0
        self._empty_raw = np.empty(0, dtype=RAW_EVENT_DTYPE)
        self._behind = False  # the last decode left held records for the next poll
        self._ending_seen: OrderedDict[tuple[int, int, int], None] = OrderedDict()  # (ts, pid, kind)

    def start(self, on_stage: Callable[[str], None] | None = None) -> None:
        """Check the environment, compile and attach (``on_stage`` hears each step's name as it
        begins: compiling takes seconds). Raises FdtraceError with the reason."""
        stage = on_stage or (lambda _text: None)
        stage("checking privileges, tracefs and the kernel's tracepoints")
        raise_nofile_limit()
        check_privileges()
        note = ensure_tracefs()
        if note:
            self.notes.append(note)
        check_kernel_headers()
        features = probe_kernel()
        check_nofile(features, self.options)
        if self.options.stacks:
            features.stack_top = has_task_pt_regs()
            if not features.stack_top:
                self.notes.append("this kernel lacks bpf_task_pt_regs (Linux 5.15): stacks skip the caller of "
                                  "libc's syscall wrappers")
        self._tracer = BpfTracer(self.options, features, on_stage=stage)
        self.notes.append(self._tracer.programs_note)
        if self.options.stacks:
            self._symbolizer = Symbolizer()
            self._descriptors = DescriptorTracker(self._tracer, self._resolve_sites,
                                                  before_tracing_pids=self.options.pids)
        if self._tracer.skipped:
            self.notes.append("running without probes this kernel lacks: " + ", ".join(self._tracer.skipped))

    @property
    def started(self) -> bool:
        """Whether the probes are attached."""
        return self._tracer is not None

    @property
    def tracer(self) -> BpfTracer:
        """The loaded programs (after ``start()``)."""
        if self._tracer is None:
            raise RuntimeError("KernelSession.start() was not called")
        return self._tracer

    @property
    def probes(self) -> list[str]:
        """The probes attached (after ``stop()``: those that were attached at the end)."""
        return list(self._tracer.attached) if self._tracer is not None else list(self._probes_at_stop)

    def watch_go_runtime(self, pid: int) -> None:
        """Read the thread-limit message of this Go process's binary from now on (see
        ``BpfTracer.watch_go_runtime``); what cannot be watched becomes a note."""
        note = self.tracer.watch_go_runtime(pid)
        if note is not None and len(self.notes) < MAX_NOTES:
            self.notes.append(note)

    def poll(self, final: bool = False) -> EventBatch:
        """Read the events waiting in the ring buffer and decode them. Under a flood (a read of
        at least ``HOLD_FROM`` records) they are held and decoded together, up to ``DECODE_AT``
        records or ``HOLD_NS`` after the first was read: a decode costs about 0.45 ms of CPU
        whatever its size (34 columns made), which at a decode per 10 ms poll was 0.18 µs of
        each event at 250,000 events a second. A poll decodes at most ``DECODE_AT`` records:
        what is left is decoded first by the next poll, which does not read the ring before
        (``behind`` says so: poll again at once). ``final``: decode everything held and waiting
        (the last poll)."""
        ending = self.take_ending()
        if ending is not None and not final:
            return ending  # the ring's events at the next poll
        raw = self._empty_raw
        if final or self._held_count < DECODE_AT:
            raw = self.tracer.poll()
            if isinstance(raw, bytes | bytearray | memoryview):
                raw = np.frombuffer(raw, dtype=RAW_EVENT_DTYPE)
            raw = self._first_copies(raw)
        if len(raw):
            if not self._held:
                self._held_since_ns = time.monotonic_ns()
            self._held.append(raw)
            self._held_count += len(raw)
        if not self._held_count:  # the common case when idle: keep it cheap
            if ending is not None:
                return ending
            now = time.monotonic_ns()
            return EventBatch(events=self._empty, mono_ns=now, losses=self._losses(now))
        if (not final and len(raw) >= HOLD_FROM and self._held_count < DECODE_AT
                and time.monotonic_ns() - self._held_since_ns < HOLD_NS):
            now = time.monotonic_ns()
            return EventBatch(events=self._empty, mono_ns=now, losses=self._losses(now))
        raw = self._take_held(None if final else DECODE_AT)
        offsets = sample_offsets()
        raw, established = split_connections(raw)
        connections = decode_connections(established, offsets) if len(established) else None
        table = decode(raw, self.host, offsets, self._resolver)
        table = self._programs_started(table, raw)
        stacks: list[Stack] = []
        if self._symbolizer is not None:
            self._symbolizer.begin()
            table, stacks = self._new_stacks(table, offsets.mono_ns)
        if ending is not None:  # the last poll: the kept ones first
            import pyarrow as pa

            table = pa.concat_tables([ending.events, table])
        return EventBatch(events=table, mono_ns=offsets.mono_ns, losses=self._losses(offsets.mono_ns), stacks=stacks,
                          connections=connections)

    @property
    def behind(self) -> bool:
        """Whether records read from the ring wait to be decoded by the next poll (a poll
        decodes at most ``DECODE_AT``): the caller should poll again without pausing."""
        return self._behind

    def _take_held(self, most: int | None) -> np.ndarray:
        """The held records in the order read, at most ``most`` of them (None: all); the rest
        stay held, as one array."""
        # Joined as bytes: numpy joins records field by field, nine times slower.
        raw = self._held[0] if len(self._held) == 1 else np.concatenate(
            [np.ascontiguousarray(held).view(np.uint8) for held in self._held]).view(RAW_EVENT_DTYPE)
        if most is None or len(raw) <= most:
            self._held, self._held_count, self._behind = [], 0, False
            return raw
        self._behind = True
        self._held, self._held_count = [raw[most:]], len(raw) - most
        self._held_since_ns = 0  # a leftover is not held back for company: decoded at the next poll
        return raw[:most]

    def take_ending(self) -> EventBatch | None:
        """The OOM kills and Go thread-limit exits the kernel kept beside the ring since the last
        call, decoded (None: none). ``poll`` hands them out ahead of the ring's events, which a
        flood can hold back for seconds or drop; each is handed out once, from whichever copy is
        read first."""
        raw = self._first_copies(self.tracer.take_ending_events())
        if not len(raw):
            return None
        offsets = sample_offsets()
        return EventBatch(events=decode(raw, self.host, offsets, self._resolver), mono_ns=offsets.mono_ns,
                          losses=self._losses(offsets.mono_ns))

    def _first_copies(self, raw: np.ndarray) -> np.ndarray:
        """``raw`` without the ending events (``ENDING_KINDS``) already handed out from their
        other copy; those left are remembered as handed out."""
        if not len(raw):
            return raw
        ending = np.flatnonzero(np.isin(raw["kind"], ENDING_KINDS))
        if not len(ending):
            return raw
        keep = np.ones(len(raw), dtype=bool)
        for index in ending.tolist():
            key = (int(raw["ts_ns"][index]), int(raw["pid"][index]), int(raw["kind"][index]))
            if key in self._ending_seen:
                keep[index] = False
                continue
            self._ending_seen[key] = None
            if len(self._ending_seen) > ENDING_SEEN:
                self._ending_seen.popitem(last=False)
        return raw if keep.all() else raw[keep]

    def _programs_started(self, events: Any, raw: np.ndarray) -> Any:
        """Each program exec'd in this batch is looked at as it starts: a Go binary gets its
        thread-limit uprobe at once (one that dies of its limit within a second is still heard).
        Under --errors-only the exec events, sent for this alone, are dropped. ``raw``: the
        records ``events`` were decoded from, row for row (their kinds are read there)."""
        execs = raw["kind"] == Kind.PROCESS_EXEC
        if not execs.any():
            return events
        import pyarrow as pa

        for pid in sorted(set(raw["pid"][execs].tolist())):
            self.watch_go_runtime(pid)
        return events.filter(pa.array(~execs)) if self.options.errors_only else events

    def _new_stacks(self, events: Any, mono_ns: int) -> tuple[Any, list[Stack]]:
        """The events with their stack ids as sites (see ``_site_of``), and the stacks they name
        that no earlier batch gave, symbolized now (while their processes are likeliest to live)."""
        column = events["stack_id"]
        if column.null_count == len(column):
            return events, []
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        stacks: list[Stack] = []
        # Once per distinct stack in the batch, not per event (an EMFILE storm repeats one stack).
        named = events.filter(pc.is_valid(column)).select(["stack_id", "pid", "comm"])
        named = named.set_column(2, "comm", named["comm"].cast(pa.string()))
        firsts = named.group_by("stack_id", use_threads=False).aggregate([("pid", "first"), ("comm", "first")])
        sites = {stack_id: self._site_of(stack_id & (2**64 - 1), pid, comm, False, mono_ns, stacks)
                 for stack_id, pid, comm in zip(firsts["stack_id"].to_pylist(), firsts["pid_first"].to_pylist(),
                                                firsts["comm_first"].to_pylist(), strict=True)}
        ids = pc.fill_null(column, 0).to_numpy()  # int64 (with nulls, to_numpy would give float64)
        keys = np.array(list(sites), dtype=np.int64)
        values = np.array([sites[k] if sites[k] is not None else 0 for k in keys], dtype=np.int64)
        valid = ~column.is_null().to_numpy(zero_copy_only=False)
        mapped = np.zeros(len(ids), dtype=np.int64)
        order = np.argsort(keys)
        mapped[valid] = values[order][np.searchsorted(keys[order], ids[valid])]
        index = events.schema.get_field_index("stack_id")
        site_column = pa.array(mapped, type=pa.int64(), mask=mapped == 0)
        return events.set_column(index, events.schema.field(index), site_column), stacks

    def _site_of(self, stack_id: int, pid: int, comm: str, stale: bool, mono_ns: int, out: list[Stack]) -> int | None:
        """The id of a kernel stack's symbolized stack: the first kernel id that gave the same frames
        in that process (a walk gone astray gives a new kernel id per call). New stacks go to
        ``out``; a stack read is removed from the kernel's table. None: the stack was not kept."""
        if stack_id in self._site_ids:
            self._site_ids.move_to_end(stack_id)
            return self._site_ids[stack_id]
        raw = self.tracer.read_stack(stack_id)
        if raw is None:
            return None
        self.tracer.forget_stacks([stack_id])
        owner, scan, addresses = raw
        if stale:
            stack = Stack(_signed(stack_id), owner, comm, tuple(f"{a:#x}" for a in addresses),
                          "the process exec'd before this stack was read: addresses of the old program", mono_ns)
        else:
            assert self._symbolizer is not None
            stack = symbolize(self._symbolizer, _signed(stack_id), owner, scan, addresses, comm, mono_ns)
        key = (owner, stack.frames, stack.truncated)
        site = self._frames_seen.get(key)
        if site is None:
            site = self._frames_seen[key] = stack.stack_id
            out.append(stack)
            while len(self._frames_seen) > MAX_REMEMBERED:
                self._frames_seen.popitem(last=False)
        self._site_ids[stack_id] = site
        while len(self._site_ids) > MAX_REMEMBERED:
            self._site_ids.popitem(last=False)
        return site

    def _resolve_sites(self, ids: dict[int, tuple[int, int]]) -> dict[int, int | None]:
        """DescriptorTracker's resolver: the sites of kernel stack ids of live descriptors."""
        assert self._symbolizer is not None and self._descriptors is not None
        self._symbolizer.begin()
        comms = {t.pid: t.comm for t in self.counters.live.values()}
        sites = {}
        for stack_id, (pid, oldest_ns) in ids.items():
            stale = oldest_ns < self._descriptors.exec_ts.get(pid, 0)
            sites[stack_id] = self._site_of(stack_id, pid, comms.get(pid, ""), stale, time.monotonic_ns(),
                                            self._pending_stacks)
        return sites

    def read_fd_sites(self) -> tuple[list[SiteRow], list[Stack]]:
        """--stacks: the call sites whose open descriptors changed since the last call, and the
        stacks of those sites not given before. Call it once per round."""
        if self._descriptors is None or self._symbolizer is None:
            return [], []
        comms = {t.pid: t.comm for t in self.counters.live.values()}
        rows = self._descriptors.sweep(comms)
        stacks, self._pending_stacks = self._pending_stacks, []
        return rows, stacks

    def _losses(self, now_ns: int) -> dict[str, int]:
        """Loss counters, read from the kernel at most every 100 ms."""
        if now_ns - self._losses_read_ns >= 100_000_000:
            self._last_losses = self.tracer.stats()
            self._losses_read_ns = now_ns
        return self._last_losses

    def read_losses(self) -> dict[str, int]:
        """Loss counters read from the kernel now."""
        self._last_losses = self.tracer.stats()
        return self._last_losses

    def failed_instances(self, errnos: Iterable[str]) -> set[tuple[int, int]]:
        """The process instances (pid, first_ts) the in-kernel error table has a failed call of
        one of ``errnos`` (names: "EMFILE") for, read now (the table alone: cheap)."""
        codes = frozenset(getattr(errno_module, name) for name in errnos)
        return self.tracer.failed_instances(codes)

    def read_counters(self) -> CounterStore:
        """Refresh and return the exact per-process totals.

        Call it every second or so: it also drains the kernel's table of exited processes,
        which would otherwise fill up (``exited_full``)."""
        tracer = self.tracer
        exited = tracer.take_exited()
        forget = self.counters.update(tracer.live_counters(), exited, tracer.error_counts())
        if forget:
            tracer.forget_errors(forget)
        return self.counters

    def stop(self, exiting: bool = False) -> None:
        """Detach the probes.

        The kernel takes about 40 ms per tracepoint to detach, one at a time (2 to 4 s for all).
        With ``exiting`` (the command ends right after), a helper process keeps its own copies of
        the descriptors and does that work once fdtrace has exited, so SIGTERM or ``q`` end
        fdtrace at once; the probes stay attached, unread, for those seconds."""
        if self._tracer is None:
            return
        tracer, self._tracer = self._tracer, None  # a stop that fails half way is not repeated
        self._probes_at_stop = list(tracer.attached)
        if exiting:
            _hand_off_detaching()
        if self._symbolizer is not None:
            self._symbolizer.close()
            self._symbolizer = None
        tracer.close()


def _signed(stack_id: int) -> int:
    """A stack id as the int64 columns hold it."""
    return stack_id - (1 << 64) if stack_id >= 1 << 63 else stack_id


def _hand_off_detaching() -> None:
    """Fork a helper that holds a copy of every descriptor until this process has exited (its end
    of a pipe closes), so this process's closes are only reference drops."""
    try:
        read_end, write_end = os.pipe()  # not inherited by the processes fdtrace starts (O_CLOEXEC)
    except OSError:  # no descriptors left (the budget reserves them; a host may still take them): detach slowly
        return
    try:
        child = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return  # no helper: detach here, slowly
    if child == 0:  # the helper: only system calls from here on
        try:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # let go of fdtrace's terminal and pipes: nobody waits on us
                os.dup2(null, fd)
            os.close(write_end)
            os.read(read_end, 1)  # end of file: fdtrace has exited
        finally:
            os._exit(0)
    os.close(read_end)
    _HELD.append(write_end)  # closed by this process's exit, which ends the helper


#: The write ends of the helpers' pipes, kept open until this process exits.
_HELD: list[int] = []

