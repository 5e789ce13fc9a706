"""The one loop that moves updates from a source to its sinks, and the one place that decides
when to stop (signals, a duration, a condition of the caller, a failing sink) and cleans up."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import FrameType

from fdtrace.errors import FdtraceError
from fdtrace.pipeline.protocols import Sink, Source
from fdtrace.pipeline.update import Update


class Stop:
    """When the pipeline ends: SIGINT or SIGTERM (when ``signals``; caught from when it is made,
    so a signal during start-up counts), ``duration_s`` after the pipeline began running, or
    when ``condition`` returns True (a job that exited, a cancelled worker)."""

    def __init__(self, duration_s: float | None = None, condition: Callable[[], bool] | None = None,
                 signals: bool = True) -> None:
        self.duration_s = duration_s
        self.deadline: float | None = None
        self.condition = condition
        self.signalled: int | None = None
        if signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handle)
            signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signalled = signum

    def reached(self) -> bool:
        """Whether it is time to stop (the duration counts from the first call)."""
        if self.deadline is None and self.duration_s is not None:
            self.deadline = time.monotonic() + self.duration_s
        return (self.signalled is not None
                or (self.deadline is not None and time.monotonic() >= self.deadline)
                or (self.condition is not None and self.condition()))


@dataclass
class SinkFailure:
    """An optional sink that failed and was detached."""

    sink: Sink
    error: str


@dataclass
class Pipeline:
    """One source fanned out to its sinks.

    Sinks may be attached and detached while it runs (the live view's R key); ``step()`` and
    ``attach``/``detach`` take one lock, so a caller on another thread sees whole updates.

    Args:
        source: started by ``start()``, unless ``source_started`` (the caller started it, to
            report its errors before anything else starts).
        sinks: opened by ``start()``.
        poll_interval_s: the pause between polls in ``run()``.
    """

    source: Source
    sinks: list[Sink] = field(default_factory=list)
    poll_interval_s: float = 0.01
    source_started: bool = False
    failures: list[SinkFailure] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._opened: list[Sink] = []
        self._started = self.source_started
        self._closed = False

    @property
    def lock(self) -> threading.RLock:
        """Held while an update is polled and delivered (hold it to act on the source)."""
        return self._lock

    def start(self) -> None:
        """Start the source and open every sink; on any error, undo what was done and raise."""
        try:
            if not self._started:
                self.source.start()
                self._started = True
            for sink in list(self.sinks):
                sink.open(self.source.info)
                self._opened.append(sink)
        except BaseException:
            self._abort()
            raise

    def attach(self, sink: Sink) -> None:
        """Open a sink and feed it from the next update on."""
        with self._lock:
            sink.open(self.source.info)
            self.sinks.append(sink)
            self._opened.append(sink)

    def detach(self, sink: Sink) -> None:
        """Close a sink; it has had every update up to now."""
        with self._lock:
            if sink not in self._opened:
                return
            self.sinks.remove(sink)
            self._opened.remove(sink)
            try:
                sink.close()
            except FdtraceError as error:
                self.failures.append(SinkFailure(sink, str(error)))

    def step(self) -> Update:
        """Poll the source once and hand the update to every sink."""
        with self._lock:
            update = self.source.poll()
            self._deliver(update, self._opened)
            return update

    def _deliver(self, update: Update, sinks: Iterable[Sink]) -> None:
        for sink in list(sinks):
            try:
                sink.write(update)
            except FdtraceError as error:
                if sink.required:
                    raise
                self._opened.remove(sink)
                self.sinks.remove(sink)
                sink.close(failed=True)
                self.failures.append(SinkFailure(sink, str(error)))

    def run(self, stop: Stop) -> Update:
        """Poll until ``stop`` is reached, then deliver the final update and close everything.
        A required sink's failure stops it too: the others are closed, the error is raised."""
        try:
            self.poll_until(stop)
            return self.finish()
        except BaseException:
            self._abort()
            raise

    def poll_until(self, stop: Stop, interval_s: float | None = None) -> None:
        """Poll every ``interval_s`` (default ``poll_interval_s``), or at once while the source
        says it has ``more``, until ``stop`` is reached or another thread closes the pipeline (the
        live view, polling on a worker, closes it when it quits). Closing is the caller's:
        ``run()`` finishes, a view calls ``close()``; an error is raised as it came."""
        interval_s = self.poll_interval_s if interval_s is None else interval_s
        while not stop.reached():
            started = time.monotonic()
            with self._lock:
                if self._closed:
                    return
                more = self.step().more
            # A source with a backlog is polled again at once (after letting a thread waiting on
            # the lock, a control of the view, have it).
            time.sleep(0.0 if more else max(0.0, interval_s - (time.monotonic() - started)))

    def finish(self) -> Update:
        """Deliver the source's final update, close the sinks and stop the source."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the pipeline is already closed")
            final = self.source.finish()
            final.final = True
            self._deliver(final, self._opened)
            for sink in list(self._opened):
                self._opened.remove(sink)
                sink.close()
            self._closed = True
            self.source.stop()
            return final

    def _abort(self) -> None:
        """After an error: close every sink quietly (opened or not) and stop the source."""
        with self._lock:
            self._opened.clear()
            for sink in list(self.sinks):
                try:
                    sink.close(failed=True)
                except Exception:  # noqa: S110 - the first error is the one to report
                    pass
            self._closed = True
            self.source.stop()

    def close(self, quitting: Sink | None = None) -> None:
        """Finish if still running (the live view quitting). When ``quitting`` (the view) is the
        only sink left, nothing would take a final update: the source stops without its last
        poll, whose decode took seconds on a flooded host (a recorder the view attached, R, gets
        its final update as ever)."""
        if self._closed:
            return
        if quitting is not None:
            with self._lock:
                if self._closed:
                    return
                if self._opened == [quitting]:
                    self._opened.clear()
                    self.sinks.clear()
                    quitting.close()
                    self._closed = True
                    self.source.stop()
                    return
        try:
            self.finish()
        except BaseException:
            self._abort()
            raise
