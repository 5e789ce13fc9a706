"""What the live view reads: events, /proc samples and system figures, from the live kernel or
from a recording, behind one interface, so the view never knows which it is showing."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from fdtrace.haproxy import HaproxySampler
from fdtrace.phases.live import LivePhases, PhaseNow, phases_at
from fdtrace.recording import read_meta, read_parts
from fdtrace.sampler import SAMPLE_COLUMNS, ProcessSample, ProcSampler

SAMPLE_INTERVAL_NS = 1_000_000_000
PHASES_INTERVAL_NS = 250_000_000


@dataclass
class SampleRound:
    """One sampling round: the processes sampled and the system figures, at ``time_ns`` (wall)."""

    time_ns: int
    samples: list[ProcessSample]
    system: dict[str, Any] | None
    haproxy: list[dict[str, Any]] = field(default_factory=list)  # `show info` rows (--haproxy-socket)


@dataclass
class FeedUpdate:
    """What happened since the last poll.

    Attributes:
        now_ns: wall time (ns) the feed has reached: now when live, the replay clock otherwise.
        events: an events table of the event model.
        rounds: the sampling rounds of /proc taken (or recorded) since, in time order.
        losses: cumulative loss counters.
        reset: the feed jumped back: forget what was shown and start from these events.
        boot_wall_ns: wall time of the traced machine's boot, to show process start times.
        phases: where each process of a training job under `fdtrace run` is now, by pid (None:
            not read in this poll).
    """

    now_ns: int
    events: Any
    rounds: list[SampleRound] = field(default_factory=list)
    losses: dict[str, int] = field(default_factory=dict)
    reset: bool = False
    boot_wall_ns: int | None = None
    phases: dict[int, PhaseNow] | None = None


class Feed(Protocol):
    """A source of updates for the view."""

    live: bool

    def poll(self) -> FeedUpdate:
        """Everything since the last poll."""

    def status(self) -> str:
        """One line saying what the feed is doing (live, recording, replay speed, ...)."""

    def close(self) -> None:
        """Stop."""


class LiveFeed:
    """The BPF programs plus a /proc sampling round every second; can record while it runs."""

    live = True

    def __init__(self, source: Any, sampler: ProcSampler | None = None, top: int = 30,
                 haproxy_sockets: tuple[str, ...] = (), phases: LivePhases | None = None) -> None:
        self.source = source
        self.phases = phases or LivePhases()
        self._next_phases = 0
        self.sampler = sampler or ProcSampler()
        self.top = top
        self.haproxy_sockets = haproxy_sockets
        self.haproxy = HaproxySampler(list(haproxy_sockets)) if haproxy_sockets else None
        self.recorder: Any = None
        self.recording_dir: Path | None = None
        self.recording_error: str | None = None
        self._pids_with_events: set[int] = set()
        self._next_sample = 0
        self._boot_wall_ns = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.clock_gettime_ns(time.CLOCK_BOOTTIME)

    def poll(self) -> FeedUpdate:
        batch = self.source.poll()
        update = FeedUpdate(now_ns=time.time_ns(), events=batch.events, losses=batch.losses,
                            boot_wall_ns=self._boot_wall_ns)
        if len(batch):
            self._pids_with_events.update(batch.events["pid"].unique().to_pylist())
        if self.recorder is not None:
            self._recording(lambda: self.recorder.take(batch))
        if time.monotonic_ns() >= self._next_phases:
            self._next_phases = time.monotonic_ns() + PHASES_INTERVAL_NS
            update.phases = self.phases.poll()
        if time.monotonic_ns() >= self._next_sample:
            self._next_sample = time.monotonic_ns() + SAMPLE_INTERVAL_NS
            samples = self.sampler.round(self._pids_with_events, self.top, exclude=os.getpid())
            system = self.sampler.system()
            haproxy = self.haproxy.sample() if self.haproxy is not None else []
            update.rounds.append(SampleRound(update.now_ns, samples, system, haproxy))
            self._pids_with_events.clear()
            if self.recorder is not None:
                self._recording(lambda: (self.recorder.tick(samples, system, haproxy), self.recorder.maintain()))
            else:
                self.source.read_counters()  # drains the kernel's table of exited processes
        return update

    def _recording(self, step: Any) -> None:
        """Run a recording step; a failed recording (a full disk) stops, the view goes on."""
        from fdtrace.errors import FdtraceError

        try:
            step()
        except FdtraceError as exc:
            self.recorder.writer.abandon()
            self.recorder = None
            self.recording_dir = None
            self.recording_error = str(exc)

    def start_recording(self, directory: Path) -> None:
        """Record everything from now on to ``directory`` (a new recording)."""
        from fdtrace.recorder import Recorder, RecordOptions, run_metadata
        from fdtrace.sinks.parquet import RecordingWriter

        self.recording_error = None
        writer = RecordingWriter(directory, self.source.host, run_metadata(self.source, ["fdtrace", "top"]))
        self.recorder = Recorder(self.source, writer, self.sampler,
                                 RecordOptions(top_processes=self.top, haproxy_sockets=self.haproxy_sockets))
        self.recording_dir = directory

    def stop_recording(self) -> Path | None:
        """Finish the recording; returns its directory."""
        if self.recorder is None:
            return None
        self.recorder.tick()
        self.recorder.writer.write_meta(complete=True, ended=time.time())
        self.recorder.writer.close()
        self.recorder = None
        directory, self.recording_dir = self.recording_dir, None
        return directory

    def status(self) -> str:
        if self.recording_dir is not None:
            return f"live, recording to {self.recording_dir} ({self.recorder.events} events)"
        if self.recording_error:
            return f"live, recording stopped: {self.recording_error}"
        return "live"

    def close(self) -> None:
        self.stop_recording()
        self.source.stop()


def _sample(row: dict[str, Any]) -> ProcessSample:
    # Recordings of older fdtrace lack the thread-limit columns.
    values: dict[str, Any] = {name: row.get(name) for name in SAMPLE_COLUMNS}
    return ProcessSample(**values, cmdline=row.get("cmdline"))


class ReplayFeed:
    """A recording played back: its events through ReplaySource, its samples and system figures
    at the times they were taken."""

    live = False

    def __init__(self, paths: str | Path | list[str | Path], speed: float = 1.0,
                 clock: Any = time.monotonic_ns) -> None:
        from fdtrace.sources.replay import ReplaySource

        self.replay = ReplaySource(paths, speed=speed, clock=clock)
        roots = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
        skipped: list[str] = []
        samples: list[pa.Table] = []
        systems: list[pa.Table] = []
        haproxy: list[pa.Table] = []
        for root in roots:
            for host in read_meta(root):
                for name, bucket in (("samples", samples), ("system", systems), ("haproxy", haproxy)):
                    part = read_parts(root, name, host, skipped)
                    if part is not None:
                        bucket.append(part)
        self._samples = _by_time(samples)
        self._system = _by_time(systems)
        self._haproxy = _by_time(haproxy)
        self._haproxy_times = _times(self._haproxy)
        self._sample_times = _times(self._samples)
        recorded_phases = _by_time([part for root in roots for host in read_meta(root)
                                    if (part := read_parts(root, "phases", host, skipped)) is not None])
        self._phases = recorded_phases.to_pandas() if recorded_phases is not None else None
        self._system_times = _times(self._system)
        self._shown_until = self.replay.start_ns - 1
        self._reset = False
        clocks = [read_parts(root, "clock", host, skipped) for root in roots for host in read_meta(root)]
        first = next((c.slice(0, 1).to_pylist()[0] for c in clocks if c is not None and c.num_rows), None)
        self._boot_wall_ns = None if first is None else first["realtime_offset_ns"] - first["boottime_offset_ns"]

    def poll(self) -> FeedUpdate:
        batch = self.replay.poll()
        now = batch.mono_ns
        update = FeedUpdate(now_ns=now, events=batch.events, losses=batch.losses, reset=self._reset,
                            boot_wall_ns=self._boot_wall_ns)
        self._reset = False
        if now > self._shown_until:
            update.rounds = self._rounds_between(self._shown_until, now)
            self._shown_until = now
        if self._phases is not None:
            update.phases = phases_at(self._phases, now)
        return update

    def _rounds_between(self, start_ns: int, end_ns: int) -> list[SampleRound]:
        """The recorded sampling rounds in (start_ns, end_ns], grouped by the time they were taken."""
        rounds: dict[int, SampleRound] = {}
        for row in _rows_between(self._system, self._system_times, start_ns, end_ns):
            when = row.pop("time_ns")
            rounds[when] = SampleRound(when, [], row)
        for row in _rows_between(self._samples, self._sample_times, start_ns, end_ns):
            when = row["time_ns"]
            rounds.setdefault(when, SampleRound(when, [], None)).samples.append(_sample(row))
        for row in _rows_between(self._haproxy, self._haproxy_times, start_ns, end_ns):
            when = row.pop("time_ns")
            rounds.setdefault(when, SampleRound(when, [], None)).haproxy.append(row)
        return [rounds[t] for t in sorted(rounds)]

    # Replay controls

    def toggle_pause(self) -> None:
        """Pause, or go on."""
        if self.replay.paused:
            self.replay.resume()
        else:
            self.replay.pause()

    def faster(self) -> None:
        """Twice as fast (up to 64x)."""
        self.replay.set_speed(min(self.replay.speed * 2, 64.0))

    def slower(self) -> None:
        """Half as fast (down to 1/8)."""
        self.replay.set_speed(max(self.replay.speed / 2, 0.125))

    def seek_by(self, seconds: float) -> None:
        """Jump forward or back; a jump back replays from the start up to there."""
        target = self.replay.now_ns + int(seconds * 1e9)
        self.seek(target)

    def seek(self, wall_ns: int) -> None:
        """Jump to a wall time. The next update carries everything from the start up to it,
        with ``reset`` set, so the view rebuilds exactly what it showed at that moment."""
        self.replay.replay_until(wall_ns)
        self._shown_until = self.replay.start_ns - 1
        self._reset = True

    def next_problem(self) -> bool:
        """Jump to the next FD error or OOM kill; False when there is none."""
        target = self.replay.seek_next({"fd_error", "oom_kill"})
        if target is None:
            return False
        self.seek(target)
        return True

    def status(self) -> str:
        state = "paused" if self.replay.paused else f"{self.replay.speed:g}x"
        if self.replay.finished:
            state += ", at the end"
        when = time.strftime("%H:%M:%S", time.gmtime(self.replay.now_ns / 1e9))
        return f"replay {state}, {when} UTC"

    def close(self) -> None:
        pass


def _by_time(parts: list[pa.Table]) -> pa.Table | None:
    if not parts:
        return None
    import pyarrow.compute as pc

    table = pa.concat_tables(parts, promote_options="default")
    return table.take(pc.sort_indices(table, [("time", "ascending")]))


def _times(table: pa.Table | None) -> np.ndarray:
    if table is None:
        return np.zeros(0, dtype=np.int64)
    return table["time"].cast(pa.int64()).to_numpy()


def _rows_between(table: pa.Table | None, times: np.ndarray, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
    """Rows with ``time`` in (start_ns, end_ns], their time as ``time_ns``."""
    if table is None:
        return []
    lo, hi = np.searchsorted(times, [start_ns, end_ns], side="right")
    rows = table.slice(int(lo), int(hi - lo))
    rows = rows.drop_columns(["ts_ns", "time"]).append_column("time_ns", pa.array(times[lo:hi]))
    return rows.to_pylist()
