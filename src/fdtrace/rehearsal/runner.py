"""Playing a rehearsal: the ranks started, each step's bursts opened at one instant, answered,
measured on the target while held, closed, and the target's descriptors seen to come back;
stopping at the first failure, at ``--duration`` or when cancelled."""

from __future__ import annotations

import dataclasses
import resource
import selectors
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from fdtrace.errors import FdtraceError
from fdtrace.procfs.sampler import ProcSampler
from fdtrace.rehearsal.connections import UNREACHABLE
from fdtrace.rehearsal.rank import ProcessRank, Rank, RankGoneError, ThreadRank
from fdtrace.rehearsal.result import Burst
from fdtrace.rehearsal.shape import Shape
from fdtrace.rehearsal.target import Target
from fdtrace.rehearsal.watch import TargetWatch
from fdtrace.schema.records import ProcessSample

#: Descriptors this process needs besides the connections when it traces: two per tracepoint,
#: the maps and ring buffer, Python's own, the recording's files (`record` ran at 130).
TRACING_DESCRIPTORS = 256
#: Descriptors of this process per rank: its selector and its channel (a socket pair, or two pipes).
PER_RANK_DESCRIPTORS = 4
#: Descriptors of a rank process besides its connections: Python's own, its selector, its pipes.
RANK_PROCESS_DESCRIPTORS = 32
#: Descriptors of this process besides all that (Python, click, /proc reads).
BASE_DESCRIPTORS = 64

#: The ranks are told to start this long ahead, so that every rank has the order before the instant.
START_AHEAD_NS = 30_000_000
#: Once the tracer saw the target fail, connections still waiting are given up after this long
#: without a new answer (a target out of descriptors answers no more until some are closed).
GIVE_UP_AFTER_S = 0.5
#: A rank that has not reported this long after its burst's timeout is taken as gone.
RANK_GRACE_S = 30.0
#: The target's descriptors are read this often while waiting for them to come back.
SETTLE_POLL_S = 0.02


def own_need(shape: Shape, tracing: bool) -> tuple[int, int]:
    """(descriptors this process needs, descriptors each rank process needs (0 for thread
    ranks)) to play ``shape``."""
    here = BASE_DESCRIPTORS + PER_RANK_DESCRIPTORS * shape.ranks + (TRACING_DESCRIPTORS if tracing else 0)
    if shape.processes:
        return here, shape.per_rank + RANK_PROCESS_DESCRIPTORS
    return here + shape.total, 0


def ensure_own_limit(shape: Shape, tracing: bool) -> int:
    """Raise this process's soft RLIMIT_NOFILE to what ``shape`` needs here (rank processes
    inherit it), raising the hard limit too where that is allowed. Returns the need. Raises
    FdtraceError (one line) when the hard limit is too low and cannot be raised."""
    need = max(own_need(shape, tracing))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return need
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return need
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))
    except (ValueError, OSError) as exc:
        what = (f"{shape.total} connections, {shape.ranks} ranks" if not shape.processes
                else f"{shape.ranks} rank processes of {shape.per_rank} connections each")
        split = max(own_need(dataclasses.replace(shape, processes=True), tracing))
        other = "" if shape.processes or split > hard else (
            f", or give --processes (each rank a process of its own: then {split} descriptors per process at most)")
        raise FdtraceError(f"the shape needs {need} descriptors in fdtrace ({what}"
                           f"{', and tracing' if tracing else ''}) but its hard RLIMIT_NOFILE is {hard} and cannot "
                           f"be raised ({exc}): run it under prlimit --nofile={need}:{need}{other}",
                           exit_code=1) from None
    return need


#: How long a burst holds its connections at most for the tracer's round to read the target.
ROUND_WAIT_S = 2.0


class TargetSampler(ProcSampler):
    """The live source's sampler, sampling the target every round (with events or not)."""

    def __init__(self, pids: Iterable[int]) -> None:
        super().__init__()
        self.targets = set(pids)

    def round(self, with_events: Iterable[int], top: int, exclude: int | None = None,
              first: Iterable[int] = (), budget_s: float | None = None) -> list[ProcessSample]:
        """The usual round, with the target in it, first (without ranking every process when
        ``top`` is 0)."""
        first = [*sorted(self.targets), *first]
        if top:
            return super().round({*with_events, *self.targets}, top, exclude, first=first, budget_s=budget_s)
        order = [*first, *sorted(set(with_events) - set(first))]
        return self.processes([pid for pid in order if pid != exclude], budget_s=budget_s)


class WorkersSampler(ProcSampler):
    """The sampler of a target whose workers all accept on the port (nginx with several
    workers): the first worker stands for them all, with the descriptors they hold summed (any
    one of them may accept every connection, so the sum is what one worker may need)."""

    def __init__(self, workers: Iterable[int]) -> None:
        super().__init__()
        self.workers = sorted(set(workers))

    def open_fds(self, pid: int) -> int | None:
        """The workers' descriptors summed for the first one; None when any is gone."""
        if pid != self.workers[0]:
            return super().open_fds(pid)
        counts = [super(WorkersSampler, self).open_fds(worker) for worker in self.workers]
        return None if any(count is None for count in counts) else sum(c for c in counts if c is not None)

    def sample(self, pid: int) -> ProcessSample | None:
        """The first worker's sample with the workers' descriptors summed."""
        first = super().sample(pid)
        if first is None or pid != self.workers[0]:
            return first
        total = self.open_fds(pid)
        return None if total is None else dataclasses.replace(first, open_fds=total)


def start_ranks(shape: Shape, target: Target) -> list[Rank]:
    """Start the ranks (threads, or processes with ``shape.processes``) and wait until each
    serves. Raises FdtraceError when one does not start."""
    ranks: list[Rank] = []
    try:
        for index in range(shape.ranks):
            if shape.processes:
                ranks.append(ProcessRank(index, target.family, target.address, target.port))
            else:
                ranks.append(ThreadRank(index, target.family, target.sockaddr))
        for rank in ranks:
            rank.wait_ready()
    except (OSError, RankGoneError) as exc:
        stop_ranks(ranks)
        raise FdtraceError(f"the ranks did not start: {exc}", exit_code=1) from None
    return ranks


def stop_ranks(ranks: list[Rank]) -> None:
    """End every rank (their connections are closed)."""
    for rank in ranks:
        rank.stop()


class Rehearsal:
    """The bursts of one rehearsal, played by ``run()`` (on a thread of its own, while the
    pipeline runs on the main one).

    Args:
        shape: the load.
        ranks: the started ranks.
        pid: the process measured (None: not traced).
        watch: the tracer's view of the target (None: not traced).
        max_rate: connections opened per second at most, on average over the rehearsal.
        duration_s: seconds the rehearsal may take at most.
        sampler: the /proc reader of the target's descriptors.
        ask_round: asks the tracer for a sampling round now (``LiveSource.round_now``), taken at
            each burst's peak while its connections are held.
    """

    def __init__(self, shape: Shape, ranks: list[Rank], pid: int | None, watch: TargetWatch | None,
                 max_rate: float, duration_s: float | None, sampler: ProcSampler | None = None,
                 ask_round: Callable[[], threading.Event] | None = None) -> None:
        self.shape = shape
        self.ranks = ranks
        self.pid = pid
        self.watch = watch
        self.max_rate = max_rate
        self.duration_s = duration_s
        self.sampler = sampler or ProcSampler()
        self.ask_round = ask_round
        self.bursts: list[Burst] = []
        self.first_sample: ProcessSample | None = None
        self.stopped: str | None = None
        self.error: FdtraceError | None = None
        self.notes: list[str] = []
        self.done = threading.Event()
        self._cancelled: str | None = None
        self._wake = threading.Event()

    @property
    def cancelled(self) -> str | None:
        """Why it was cancelled, None when it was not."""
        return self._cancelled

    def cancel(self, why: str) -> None:
        """Stop after the burst now playing (its connections are closed); ``why`` is said."""
        if self._cancelled is None:
            self._cancelled = why
        self._wake.set()

    def run(self) -> None:
        """Play every step's bursts until one fails, the time is up or it is cancelled."""
        try:
            self._run()
        except FdtraceError as error:
            self.error = error
        except (RankGoneError, OSError) as exc:
            self.error = FdtraceError(f"a rank stopped: {exc}", exit_code=1)
        finally:
            self.done.set()

    def _run(self) -> None:
        began = time.monotonic()
        opened = 0
        for step, level in enumerate(self.shape.levels(), 1):
            for burst in range(1, self.shape.bursts + 1):
                earliest = began + opened / self.max_rate
                self._wake.wait(max(0.0, earliest - time.monotonic()))
                if self._cancelled is not None:
                    self.stopped = self._cancelled
                    return
                if self.duration_s is not None and time.monotonic() - began >= self.duration_s:
                    self.stopped = f"--duration {self.duration_s:g} s reached"
                    return
                record = self._burst(step, burst, level)
                if self._cancelled is not None:  # what it met while being stopped is not the target's doing
                    self.stopped = self._cancelled
                    self.notes.append(f"the burst under way when it was stopped (step {step}, {level} connections) "
                                      "is left out")
                    return
                self.bursts.append(record)
                opened += level
                if record.failed:
                    return

    def _sample(self) -> ProcessSample | None:
        return self.sampler.sample(self.pid) if self.pid is not None else None

    def _listen_counters(self) -> tuple[int, int] | None:
        """TcpExt ListenOverflows and ListenDrops now (the whole host's)."""
        system = self.sampler.system()
        overflows, drops = system.get("listen_overflows"), system.get("listen_drops")
        return None if overflows is None or drops is None else (int(overflows), int(drops))

    def _burst(self, step: int, index: int, level: int) -> Burst:
        record = Burst(step, index, level)
        before = self._sample()
        if self.pid is not None and before is None:
            record.target_failures = {"the target is gone": 1}
            return record
        if self.first_sample is None:
            self.first_sample = before
        record.fds_before = before.open_fds if before is not None else None
        overflows = self._listen_counters()
        counts = self.shape.split(level)
        began_ns = time.monotonic_ns()
        active = [rank for rank, count in zip(self.ranks, counts, strict=True) if count]
        for rank, count in zip(self.ranks, counts, strict=True):
            if count:
                rank.channel.send({"op": "burst", "count": count, "at_ns": began_ns + START_AHEAD_NS,
                                   "timeout_s": self.shape.timeout_s, "payload": self.shape.payload.hex(),
                                   "reply": self.shape.expect_reply})
        outcomes = self._gather(active, began_ns)
        own = next((o["own"] for o in outcomes if o["own"]), None)
        failures: Counter[str] = Counter()
        for outcome in outcomes:
            failures.update(outcome["failures"])
            record.answered += int(outcome["answered"])
        held = self._sample()
        if held is not None:
            record.fds_held, record.threads = held.open_fds, held.threads
        if self.ask_round is not None:  # the tracer's round too, while the connections are held
            self.ask_round().wait(ROUND_WAIT_S)
        if own is None:
            self._wake.wait(self.shape.hold_s)
            for rank in active:
                rank.channel.send({"op": "check"})
            for rank in active:
                failures.update(self._answer(rank, "checked"))
        for rank in active:
            rank.channel.send({"op": "close"})
        for rank in active:
            self._answer(rank, "closed")
        unreachable = {reason: n for reason, n in failures.items() if reason in UNREACHABLE}
        if own is None and unreachable:
            own = "this host has no route to the target (" + ", ".join(
                f"{n} connections {reason}" for reason, n in sorted(unreachable.items())) + ")"
        if own is not None:
            raise FdtraceError(f"{own}: the rehearsal stopped at step {step} ({level} connections)", exit_code=1)
        record.failures = dict(failures)
        record.settled = self._settle(record.fds_before)
        if not record.settled:
            self.notes.append(f"step {step}: the target still held more than its {record.fds_before} descriptors "
                              f"{self.shape.timeout_s:g} s after the connections closed")
        if self.watch is not None:
            if not self.watch.wait_past(time.monotonic_ns(), RANK_GRACE_S):
                self.notes.append("the tracer fell behind: failures of the last step may be missing")
            seen = self.watch.failures_since(began_ns)
            record.target_failures = dict(Counter(f.label for f in seen))
            record.first_target_failure = seen[0] if seen else None
        after = self._listen_counters()
        if overflows is not None and after is not None:
            record.listen_overflows, record.listen_drops = after[0] - overflows[0], after[1] - overflows[1]
        return record

    def _answer(self, rank: Rank, key: str) -> Any:
        """The answer ``key`` of one rank, progress lines skipped."""
        while True:
            message = rank.channel.receive(RANK_GRACE_S)
            if key in message:
                return message[key]

    def _gather(self, active: list[Rank], began_ns: int) -> list[dict[str, Any]]:
        """Each active rank's outcome; once the target has failed and no answer came for
        ``GIVE_UP_AFTER_S``, or when cancelled, the ranks are told to stop waiting."""
        pending = {rank.index: rank for rank in active}
        answered = dict.fromkeys(pending, 0)
        outcomes: list[dict[str, Any]] = []
        last_answer = time.monotonic()
        gave_up = False
        deadline = time.monotonic() + START_AHEAD_NS / 1e9 + self.shape.timeout_s + RANK_GRACE_S
        selector = selectors.DefaultSelector()
        for rank in active:
            selector.register(rank.channel.read_fd, selectors.EVENT_READ, rank)
        try:
            while pending:
                for key, _ in selector.select(0.05):
                    key.data.channel.fill()
                for index, rank in list(pending.items()):
                    while (message := rank.channel.take()) is not None:
                        if "answered" in message and message["answered"] != answered[index]:
                            answered[index] = int(message["answered"])
                            last_answer = time.monotonic()
                        if "done" in message:
                            outcomes.append(message["done"])
                            del pending[index]
                            selector.unregister(rank.channel.read_fd)
                            break
                now = time.monotonic()
                failed = self.watch is not None and self.watch.failed_since(began_ns)
                if not gave_up and pending and (self._cancelled is not None
                                                or (failed and now - last_answer >= GIVE_UP_AFTER_S)):
                    for rank in pending.values():
                        rank.channel.send({"op": "give_up"})
                    gave_up = True
                if now > deadline:
                    raise RankGoneError(f"rank {min(pending)} did not finish its burst")
        finally:
            selector.close()
        return outcomes

    def _settle(self, fds_before: int | None) -> bool:
        """Wait (at most the connection timeout) until the target holds no more descriptors than
        before the burst."""
        if self.pid is None or fds_before is None:
            return True
        deadline = time.monotonic() + self.shape.timeout_s
        while True:
            now = self.sampler.open_fds(self.pid)
            if now is None or now <= fds_before:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(SETTLE_POLL_S)

