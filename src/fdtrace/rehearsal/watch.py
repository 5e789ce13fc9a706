"""What the live tracer sees of the target while the load runs: a pipeline sink that keeps its
failures (EMFILE/ENFILE of any call, an OOM kill, its exit), its samples, its exact counters and
the system's listen-queue counters, for the rehearsal's thread to read."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from fdtrace.pipeline import SourceInfo, Update
from fdtrace.policy import FD_EXHAUSTION_ERRNOS


@dataclass(frozen=True)
class TargetFailure:
    """One failure of the target, as the tracer saw it.

    Attributes:
        ts_ns: CLOCK_MONOTONIC of the event.
        pid: the process.
        kind: the event's kind (``socket``, ``accept``, ``fd_error``, ``oom_kill``, ``process_exit``).
        syscall: the call that failed (empty for an OOM kill or an exit).
        errno: EMFILE or ENFILE (empty for an OOM kill or an exit).
        detail: how the process ended, for an exit.
    """

    ts_ns: int
    pid: int
    kind: str
    syscall: str
    errno: str
    detail: str = ""

    @property
    def label(self) -> str:
        """``socket EMFILE``, ``oom_kill``, ``exited (SIGKILL)``."""
        if self.errno:
            return f"{self.syscall} {self.errno}"
        return self.kind if not self.detail else f"exited ({self.detail})"


#: Failures kept at most (an EMFILE storm repeats one failure thousands of times a second; the
#: exact counts are the counters').
MAX_FAILURES = 100_000


class TargetWatch:
    """A required sink of the live pipeline that keeps what the rehearsal needs of ``pids``."""

    name = "rehearsal"
    required = True

    def __init__(self, pids: tuple[int, ...]) -> None:
        self.pids = set(pids)
        self._lock = threading.Lock()
        self._failures: list[TargetFailure] = []
        self._dropped = 0
        self._samples: dict[int, Any] = {}
        self._peaks: dict[int, int] = {}
        self._threads: dict[int, int] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self._system: dict[str, Any] = {}
        self._losses: dict[str, int] = {}
        self._written_ns = 0
        self._last_failure_ns = -1
        self._closed = False
        self._wrote = threading.Condition(self._lock)

    def open(self, info: SourceInfo) -> None:
        """Nothing to prepare."""

    def close(self, failed: bool = False) -> None:
        """No update comes after this: whoever waits for one stops waiting."""
        with self._lock:
            self._closed = True
            self._wrote.notify_all()

    def write(self, update: Update) -> None:
        """Keep the target's failures, samples and counters from one update."""
        failures = self._failures_in(update.events)
        with self._lock:
            room = MAX_FAILURES - len(self._failures)
            self._failures.extend(failures[:max(room, 0)])
            self._dropped += max(len(failures) - max(room, 0), 0)
            for failure in failures:
                self._last_failure_ns = max(self._last_failure_ns, failure.ts_ns)
            for sample_round in update.rounds:
                if sample_round.system:
                    self._system = dict(sample_round.system)
                for sample in sample_round.samples:
                    if sample.pid in self.pids:
                        self._samples[sample.pid] = sample
                        self._peaks[sample.pid] = max(self._peaks.get(sample.pid, 0), sample.open_fds)
                        self._threads[sample.pid] = max(self._threads.get(sample.pid, 0), sample.threads)
            if update.counters is not None:
                errors: dict[tuple[str, str], int] = {}
                for pid in self.pids:
                    for totals in update.counters.for_pid(pid):
                        for key, count in totals.errors.items():
                            errors[key] = errors.get(key, 0) + count
                self._errors = errors
            if update.losses:
                self._losses = dict(update.losses)
            self._written_ns = time.monotonic_ns()
            self._wrote.notify_all()

    def _failures_in(self, events: Any) -> list[TargetFailure]:
        if not events.num_rows or not self.pids:
            return []
        import pyarrow as pa
        import pyarrow.compute as pc

        mine = events.filter(pc.is_in(events["pid"], value_set=pa.array(sorted(self.pids), type=pa.int32())))
        if not mine.num_rows:
            return []
        errnos = mine["errno"].cast(pa.string())
        kinds = mine["kind"].cast(pa.string())
        wanted = pc.or_(pc.is_in(errnos, value_set=pa.array(sorted(FD_EXHAUSTION_ERRNOS))),
                        pc.is_in(kinds, value_set=pa.array(["oom_kill", "process_exit"])))
        rows = mine.filter(wanted).select(["ts_ns", "pid", "kind", "syscall", "errno", "exit_code", "signal"])
        found = []
        for row in rows.to_pylist():
            detail = ""
            if row["kind"] == "process_exit":
                detail = row["signal"] or f"exit status {row['exit_code']}"
            found.append(TargetFailure(int(row["ts_ns"]), int(row["pid"]), str(row["kind"]), str(row["syscall"] or ""),
                                       str(row["errno"] or ""), str(detail)))
        return found

    def wait_past(self, mono_ns: int, timeout_s: float) -> bool:
        """Wait until an update was taken after ``mono_ns`` (so every event before it has been
        read from the kernel); False when none came within ``timeout_s`` or the pipeline closed."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._written_ns <= mono_ns:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._wrote.wait(left)
        return True

    def failed_since(self, mono_ns: int) -> bool:
        """Whether the target failed at ``mono_ns`` or later (cheap: asked every few ms)."""
        with self._lock:
            return self._last_failure_ns >= mono_ns

    def failures_since(self, mono_ns: int) -> list[TargetFailure]:
        """The target's failures from ``mono_ns`` on, in time order."""
        with self._lock:
            return sorted((f for f in self._failures if f.ts_ns >= mono_ns), key=lambda f: f.ts_ns)

    @property
    def errors(self) -> dict[tuple[str, str], int]:
        """The exact counters' failed calls of the target since tracing began, by (syscall, errno)."""
        with self._lock:
            return dict(self._errors)

    @property
    def peak_fds(self) -> int | None:
        """The most descriptors the tracer's samples saw the target hold."""
        with self._lock:
            return max(self._peaks.values()) if self._peaks else None

    @property
    def peak_threads(self) -> int | None:
        """The most threads the tracer's samples saw the target run."""
        with self._lock:
            return max(self._threads.values()) if self._threads else None

    @property
    def system(self) -> dict[str, Any]:
        """The last round's system figures (``listen_overflows``, ``listen_drops``, file-nr...)."""
        with self._lock:
            return dict(self._system)

    @property
    def losses(self) -> dict[str, int]:
        """The tracer's loss counters (events it could not deliver)."""
        with self._lock:
            return dict(self._losses)

    @property
    def dropped(self) -> int:
        """Failures past ``MAX_FAILURES`` that were counted but not kept."""
        with self._lock:
            return self._dropped
