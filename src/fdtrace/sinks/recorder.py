"""The controls of the live view (`fdtrace top`): its time runs on its own, and the R key records
what it shows, a Parquet sink attached to the running pipeline and detached again."""

from __future__ import annotations

import time
from pathlib import Path

from fdtrace.display import shown
from fdtrace.pipeline import NoPlayback, Notice, Pipeline
from fdtrace.sinks.parquet import ParquetSink

#: The longest the R key waits for the pipeline (the view's thread must not hang on it).
LOCK_WAIT_S = 0.25


class LiveControls(NoPlayback):
    """The live view's controls over its pipeline.

    Args:
        pipeline: the pipeline the view is fed by (R attaches the recording to it).
        record_dir: where R records (default: ./fdtrace-DATE-TIME, named when R is pressed).
    """

    running = True
    skipped: tuple[str, ...] = ()

    def __init__(self, pipeline: Pipeline, record_dir: Path | None = None) -> None:
        self.pipeline = pipeline
        self.record_dir = record_dir
        self.recording: ParquetSink | None = None

    def status(self) -> str:
        """live, recording to DIR (N events), or why the recording stopped. Never waits for the
        pipeline's lock (the view asks every redraw, and a poll can hold the lock for seconds on a
        busy host): the lists it reads are copied whole."""
        recording, sinks, failures = self.recording, list(self.pipeline.sinks), list(self.pipeline.failures)
        if recording is not None and recording in sinks:
            return f"live, recording to {recording.directory} ({recording.events} events)"
        failed = [f.error for f in failures if isinstance(f.sink, ParquetSink)]
        return f"live, recording stopped: {failed[-1]}" if failed else "live"

    def toggle_recording(self) -> Notice:
        """R: start recording to a new directory, or stop and say where it was saved. The view
        waits at most ``LOCK_WAIT_S`` for the pipeline (a poll may hold it): then it says so."""
        if not self.pipeline.lock.acquire(timeout=LOCK_WAIT_S):
            return Notice("the feed is busy reading the kernel and /proc: press R again", "warning")
        try:
            return self._toggle()
        finally:
            self.pipeline.lock.release()

    def _toggle(self) -> Notice:
        with self.pipeline.lock:
            if self.recording is None or self.recording not in self.pipeline.sinks:
                directory = self.record_dir or Path(time.strftime("fdtrace-%Y%m%d-%H%M%S"))
                try:
                    sink = ParquetSink(directory, ["fdtrace", "top"], required=False)
                    self.pipeline.attach(sink)
                except Exception as exc:
                    return Notice(f"cannot record: {shown(exc)}", "error")
                self.recording = sink
                return Notice(f"recording to {shown(directory)}")
            done, self.recording = self.recording, None
            self.pipeline.detach(done)
            return Notice(f"recording saved in {shown(done.directory)}")
