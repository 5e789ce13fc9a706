"""Headless recording: the live source's events, samples of /proc, exact counters, losses and
clock offsets, flushed to a recording directory every second."""

from __future__ import annotations

import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from fdtrace import __version__
from fdtrace.clock import sample_offsets
from fdtrace.counters import CounterStore
from fdtrace.haproxy import SAMPLED_FIELDS, HaproxySampler
from fdtrace.sampler import SAMPLE_COLUMNS, ProcessSample, ProcSampler
from fdtrace.schema import COUNTERS, SCHEMA_VERSION, STATS
from fdtrace.sinks.parquet import RecordingWriter
from fdtrace.sources.base import EventBatch, keep_comms
from fdtrace.sources.live_bpf import LiveBpfSource

HAPROXY_SCHEMA = pa.schema([("ts_ns", pa.int64()), ("socket", pa.string()), ("error", pa.string())]
                           + [(column, pa.int64()) for _, column in SAMPLED_FIELDS])
ERRORS_TYPE = pa.list_(pa.struct([("syscall", pa.string()), ("errno", pa.string()), ("count", pa.int64())]))


@dataclass(frozen=True)
class RecordOptions:
    """How often to sample and flush, and what to keep."""

    interval_s: float = 1.0
    rotate_s: float | None = None  # merge the parts of each this many seconds into one file
    top_processes: int = 20
    haproxy_sockets: tuple[str, ...] = ()
    comms: tuple[str, ...] = ()


def boot_id() -> str:
    """This boot's id: monotonic stamps are comparable only within one boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def run_metadata(source: LiveBpfSource, argv: list[str]) -> dict[str, Any]:
    """What a reader needs to know about the run, written to meta/host=NAME.json."""
    return {
        "schema_version": SCHEMA_VERSION,
        "fdtrace_version": __version__,
        "host": source.host,
        "kernel": platform.release(),
        "boot_id": boot_id(),
        "probes_attached": source.probes,
        "probes_skipped": list(source.tracer.skipped),
        "options": {"pids": list(source.options.pids), "follow": source.options.follow,
                    "errors_only": source.options.errors_only,
                    "ring_pages": source.options.ring_pages},
        "argv": argv,
        "started": time.time(),
    }


def _time_column(ts: list[int], realtime_offset: int) -> pa.Array:
    return pa.array([t + realtime_offset for t in ts], type=pa.int64()).cast(pa.timestamp("ns", tz="UTC"))


class Recorder:
    """Drives one live source into one recording writer until told to stop."""

    def __init__(self, source: LiveBpfSource, writer: RecordingWriter, sampler: ProcSampler,
                 options: RecordOptions, exporter: Any = None) -> None:
        """``exporter``: a MetricsExporter fed with the same events, samples and counters."""
        self.source = source
        self.exporter = exporter
        self.haproxy = HaproxySampler(list(options.haproxy_sockets)) if options.haproxy_sockets else None
        self.writer = writer
        self.sampler = sampler
        self.options = options
        self.events = 0
        self._pids_seen: set[int] = set()
        self._last_losses = dict.fromkeys(STATS, 0)
        self._last_counters: dict[tuple[int, int], tuple[Any, ...]] = {}
        self._next_tick = time.monotonic()
        self._next_compaction = time.monotonic() + (options.rotate_s or 0)

    @property
    def losses(self) -> dict[str, int]:
        """Cumulative loss counters at the last flush."""
        return dict(self._last_losses)

    def run(self, should_stop: Callable[[], bool], deadline: float | None) -> None:
        """Poll every 10 ms and sample and flush every interval, until stopped."""
        while True:
            last = should_stop() or (deadline is not None and time.monotonic() >= deadline)
            self.take(self.source.poll())
            if self.due() or last:
                self.tick()
            self.maintain(last)
            if last:
                return
            time.sleep(0.01)

    def take(self, batch: EventBatch) -> None:
        """Buffer a batch's events (those of the --comm names, when given)."""
        if not len(batch):
            return
        table = keep_comms(batch.events, self.options.comms)
        self._pids_seen.update(table["pid"].unique().to_pylist())
        self.writer.add("events", table.drop_columns(["host"]))
        if self.exporter is not None:
            self.exporter.observe(table)
        self.events += table.num_rows

    def due(self) -> bool:
        """Whether an interval has passed since the last tick."""
        return time.monotonic() >= self._next_tick

    def maintain(self, last: bool = False) -> None:
        """Merge files every --rotate seconds (and at the end)."""
        rotate = self.options.rotate_s
        if rotate is None or not (last or time.monotonic() >= self._next_compaction):
            return
        self.writer.compact(wait=False)
        self.writer.write_meta(complete=False, wait=False)
        self._next_compaction = time.monotonic() + rotate

    @property
    def pids_with_events(self) -> set[int]:
        """Processes that had events since the last tick."""
        return set(self._pids_seen)

    def tick(self, samples: list[ProcessSample] | None = None, system: dict[str, Any] | None = None,
             haproxy: list[dict[str, Any]] | None = None) -> None:
        """Sample (unless the caller already did), read counters and losses, and flush."""
        self._next_tick = max(self._next_tick + self.options.interval_s, time.monotonic())
        offsets = sample_offsets()
        now = offsets.mono_ns
        self.writer.add("clock", pa.table({
            "ts_ns": [now], "realtime_offset_ns": [offsets.realtime_offset_ns],
            "boottime_offset_ns": [offsets.boottime_offset_ns]}))
        if samples is None:
            samples = self.sampler.round(self._pids_seen, self.options.top_processes, exclude=os.getpid())
        if system is None:
            system = self.sampler.system()
        self._pids_seen.clear()
        self._write_samples(samples, system, now, offsets.realtime_offset_ns)
        if haproxy is None and self.haproxy is not None:
            haproxy = self.haproxy.sample()
        if haproxy:
            table = pa.Table.from_pylist([{"ts_ns": now, **row} for row in haproxy], schema=HAPROXY_SCHEMA)
            self.writer.add("haproxy", table.append_column("time", _time_column([now] * len(haproxy),
                                                                                offsets.realtime_offset_ns)))
        store = self.source.read_counters()
        self._counters(now, store)
        losses = self.source.read_losses()
        if self.exporter is not None:
            self.exporter.update(samples, system, store, losses)
        row: dict[str, list[Any]] = {"ts_ns": [now]}
        for name in STATS:
            row[name] = [losses.get(name, 0) - self._last_losses.get(name, 0)]
            row[f"{name}_total"] = [losses.get(name, 0)]
        self._last_losses = losses
        table = pa.table(row)
        self.writer.add("losses", table.append_column("time", _time_column([now], offsets.realtime_offset_ns)))
        self.writer.flush(wait=False)

    def _write_samples(self, samples: list[ProcessSample], system: dict[str, Any], now: int,
                       realtime_offset: int) -> None:
        if samples:
            columns: dict[str, list[Any]] = {"ts_ns": [now] * len(samples)}
            for name in SAMPLE_COLUMNS:
                columns[name] = [getattr(s, name) for s in samples]
            if self.sampler.cmdline:
                columns["cmdline"] = [s.cmdline for s in samples]
            table = pa.table(columns)
            self.writer.add("samples", table.append_column("time", _time_column(columns["ts_ns"], realtime_offset)))
        table = pa.table({"ts_ns": [now], **{k: [v] for k, v in system.items()}})
        self.writer.add("system", table.append_column("time", _time_column([now], realtime_offset)))

    def _counters(self, now: int, store: CounterStore) -> None:
        rows = list(store.newly_exited)  # final values, written once
        for totals in rows:
            self._last_counters.pop((totals.pid, totals.first_ts), None)
        for key, totals in store.live.items():
            values = (*(totals.counts[c] for c in COUNTERS), tuple(sorted(totals.errors.items())))
            if self._last_counters.get(key) != values:
                self._last_counters[key] = values
                rows.append(totals)
        if not rows:
            return
        columns: dict[str, list[Any]] = {
            "ts_ns": [now] * len(rows),
            "pid": [t.pid for t in rows],
            "first_ts": [t.first_ts for t in rows],
            "exit_ts": [t.exit_ts for t in rows],
            "comm": [t.comm for t in rows],
        }
        for name in COUNTERS:
            columns[name] = [t.counts[name] for t in rows]
        errors = [[{"syscall": sc, "errno": err, "count": n} for (sc, err), n in sorted(t.errors.items())]
                  for t in rows]
        table = pa.table(columns).append_column("errors", pa.array(errors, type=ERRORS_TYPE))
        self.writer.add("counters", table)


def default_host() -> str:
    """The host name recordings are partitioned by."""
    return socket.gethostname()
