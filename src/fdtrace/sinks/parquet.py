"""The recording sink: every update of a source into a Parquet recording directory (events as
they come; samples, system figures, HAProxy, clock, counters and losses once per round), one
flush to disk per round."""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from fdtrace import __version__
from fdtrace.errors import FdtraceError
from fdtrace.kernel.counters import CounterStore
from fdtrace.kernel.session import release_descriptors, reserve_descriptors
from fdtrace.pipeline.update import SampleRound, SourceInfo, Update
from fdtrace.procfs import ProcFS
from fdtrace.recording.writer import RecordingWriter
from fdtrace.safe_files import check_directory
from fdtrace.schema import COUNTERS, SCHEMA_VERSION, STATS, codecs
from fdtrace.schema.failures import failure_class, incident_mask
from fdtrace.schema.records import ProcessTotals

#: The live /proc: this boot's id and the real uid of the processes recorded.
_PROCFS = ProcFS()


def boot_id() -> str:
    """This boot's id: monotonic stamps are comparable only within one boot."""
    return (_PROCFS.system_text("sys/kernel/random/boot_id") or "").strip()


def run_metadata(info: SourceInfo, argv: list[str]) -> dict[str, Any]:
    """What a reader needs to know about the run, written to meta/host=NAME.json."""
    return {
        "schema_version": SCHEMA_VERSION,
        "fdtrace_version": __version__,
        "host": info.host,
        "kernel": platform.release(),
        "boot_id": boot_id(),
        "probes_attached": list(info.probes_attached),
        "probes_skipped": list(info.probes_skipped),
        "options": dict(info.options),
        "argv": argv,
        "started": time.time(),
    }


def incidents(events: Any) -> list[tuple[int, str]]:
    """The incidents among events (``schema.failures.incident_mask``), as (CLOCK_MONOTONIC ns, failure
    class)."""
    return [(ts, kind) for ts, kind, _, _ in incident_rows(events)]


def incident_rows(events: Any) -> list[tuple[int, str, str, int]]:
    """The incidents among events, as (CLOCK_MONOTONIC ns, failure class, comm, pid)."""
    import pyarrow.compute as pc

    found = incident_mask(events)
    if not pc.any(found).as_py():
        return []
    chosen = events.filter(found)
    columns = [c for c in ("kind", "errno", "signal") if c in chosen.column_names]
    rows = chosen.select(columns).cast(pa.schema([(c, pa.string()) for c in columns])).to_pylist()
    return [(ts, failure_class(row) or "", comm or "", pid) for ts, row, comm, pid in
            zip(chosen["ts_ns"].to_pylist(), rows, chosen["comm"].cast(pa.string()).to_pylist(),
                chosen["pid"].to_pylist(), strict=True)]


def incident_note(kept: int, trimmed: int, dropped: dict[str, int]) -> str:
    """The recorder's exit words on the incident windows: "incident windows: 3 kept (1 trimmed),
    2 given up (140 incidents)"."""
    text = f"incident windows: {kept} kept" + (f" ({trimmed} trimmed to fit --keep-incidents)" if trimmed else "")
    if dropped.get("windows"):
        text += f", {dropped['windows']} given up ({dropped.get('incidents', 0)} incidents)"
    return text


#: Processes whose real uid the sink remembers (from the samples and its own reads) at most.
MAX_KNOWN_UIDS = 8192


def real_uid(pid: int) -> int | None:
    """A live process's real uid, from its /proc status (None when it is gone or unreadable)."""
    try:
        return _PROCFS.real_uid(int(pid))
    except (TypeError, ValueError):  # not a pid
        return None


class ParquetSink:
    """Writes a recording directory from the updates of a live source.

    Args:
        directory: the recording (created; several hosts may share one).
        argv: the command line, kept in the metadata.
        shared: files readable by everyone (default: owner only).
        max_size: bytes the recording may hold (oldest parts deleted and counted).
        rotate_s: merge the parts of each this many seconds into one file.
        required: whether a failure stops the pipeline (`record`) or only the recording (the
            live view's R key).
    """

    def __init__(self, directory: Path, argv: list[str], shared: bool = False, max_size: int | None = None,
                 rotate_s: float | None = None, required: bool = True, keep_incidents: int | None = None,
                 keep_before_s: float = 60.0, keep_after_s: float = 30.0, resume: bool = False) -> None:
        self.directory = Path(directory)
        check_directory(self.directory, create=True)  # before anything is compiled: a planted path is refused at once
        self.name = f"recording to {self.directory}"
        self.required = required
        self.argv = argv
        self.shared = shared
        self.max_size = max_size
        self.keep_incidents = keep_incidents
        self.keep_before_ns = int(keep_before_s * 1e9)
        self.keep_after_ns = int(keep_after_s * 1e9)
        self.rotate_s = rotate_s
        self.resume = resume
        self.events = 0
        self.losses: dict[str, int] = dict.fromkeys(STATS, 0)
        self._writer: RecordingWriter | None = None
        self._bytes_at_close = 0
        self._cmdline = False
        self._last_counters: dict[tuple[int, int], tuple[Any, ...]] = {}
        self._next_compaction = 0.0
        self._unread: list[str] = []  # what the source left unread (its final update says)
        self.incident_note = ""  # after close(), with max_size: what the incident budget kept and gave up
        self.rotated_note = ""  # after close(), with max_size: what the ring deleted
        self._uids: dict[int, int] = {}  # pid: real uid, of the processes sampled or failed
        reserve_descriptors(self, self.name, RecordingWriter.DESCRIPTORS)  # counted before the probes attach

    @property
    def writer(self) -> RecordingWriter:
        """The writer (after ``open()``)."""
        if self._writer is None:
            raise RuntimeError("ParquetSink.open() was not called")
        return self._writer

    @property
    def bytes_written(self) -> int:
        """Bytes of part files written so far."""
        return self._writer.bytes_written if self._writer is not None else self._bytes_at_close

    def open(self, info: SourceInfo) -> None:
        if not info.live:
            raise FdtraceError("a replay cannot be recorded again: copy the recording instead")
        self._cmdline = info.cmdline
        self._writer = RecordingWriter(self.directory, info.host, run_metadata(info, self.argv),
                                       shared=self.shared, max_size=self.max_size, keep_incidents=self.keep_incidents,
                                       keep_before_ns=self.keep_before_ns, keep_after_ns=self.keep_after_ns,
                                       resume=self.resume)
        self._next_compaction = time.monotonic() + (self.rotate_s or 0)

    def write(self, update: Update) -> None:
        writer = self.writer
        if update.events.num_rows:
            writer.add("events", codecs.without_host(update.events))
            self.events += update.events.num_rows
            if self.max_size is not None:
                writer.mark_incidents([(ts, kind, comm, self._uid(pid)) for ts, kind, comm, pid in
                                       incident_rows(update.events)],
                                      time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns())
        if update.connections is not None and update.connections.num_rows:
            writer.add("connections", update.connections)
        if update.stacks:
            offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()
            writer.add("stacks", codecs.STACKS.encode(update.stacks, [s.mono_ns for s in update.stacks], offset))
        if update.final:
            self._unread = list(update.unread)
        for sample_round in update.rounds:
            self._round(sample_round, update)
        if update.rounds or update.final:  # the last events go into the last merge, not a part after it
            writer.flush(wait=False)
        if self.rotate_s is not None and (update.final or time.monotonic() >= self._next_compaction):
            writer.compact(wait=False)
            writer.write_meta(complete=False, wait=False)
            self._next_compaction = time.monotonic() + self.rotate_s

    def close(self, failed: bool = False) -> None:
        release_descriptors(self)
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        try:
            if failed:
                writer.abandon()
                return
            try:
                if self._unread:
                    writer.write_meta(complete=True, ended=time.time(), unread=self._unread)
                else:
                    writer.write_meta(complete=True, ended=time.time())
                writer.close()
            except FdtraceError:
                writer.abandon()
                raise
        finally:
            self._bytes_at_close = writer.bytes_written
            if self.max_size is not None:
                rotated = writer.rotated_out
                self.rotated_note = (f"{rotated['files']} oldest files ({rotated['bytes']} bytes, "
                                     f"{rotated['rows'].get('events', 0)} events) deleted by --max-size"
                                     if rotated["files"] else "")
                self.incident_note = incident_note(len(writer.incident_windows()), writer.trimmed(),
                                                   writer.incidents_dropped)

    def _uid(self, pid: int) -> int | None:
        """The real uid of a failing process: sampled, or read now; None when it is gone (then its
        incidents rank as a user's)."""
        uid = self._uids.get(pid)
        if uid is None:
            uid = real_uid(pid)
            if uid is not None:
                self._remember(pid, uid)
        return uid

    def _remember(self, pid: int, uid: int) -> None:
        if len(self._uids) >= MAX_KNOWN_UIDS:
            self._uids.clear()
        self._uids[pid] = uid

    def _round(self, sample_round: SampleRound, update: Update) -> None:
        writer = self.writer
        if self.max_size is not None:
            for sample in sample_round.samples:
                if sample.uid is not None:
                    self._remember(sample.pid, sample.uid)
        now = sample_round.mono_ns
        offset = sample_round.time_ns - now
        if sample_round.clock is not None:
            writer.add("clock", codecs.CLOCK.encode([sample_round.clock], now, offset))
        if sample_round.samples:
            writer.add("samples", codecs.SAMPLES.encode(sample_round.samples, now, offset,
                                                        with_optional=("cmdline",) if self._cmdline else ()))
        if sample_round.system is not None:
            writer.add("system", codecs.SYSTEM.encode([sample_round.system], now, offset))
        if sample_round.haproxy:
            writer.add("haproxy", codecs.HAPROXY.encode(sample_round.haproxy, now, offset))
        if sample_round.fd_sites:
            writer.add("fd_sites", codecs.FD_SITES.encode(sample_round.fd_sites, now, offset))
        if sample_round.threads:
            writer.add("thread_census", codecs.THREAD_CENSUS.encode(sample_round.threads, now, offset))
        if update.counters is not None:
            self._counters(now, offset, update.counters)
        writer.add("losses", codecs.declared_rows("losses", codecs.loss_columns(now, update.losses, self.losses),
                                                  offset))
        self.losses = dict(update.losses)

    def _counters(self, now: int, offset: int, store: CounterStore) -> None:
        rows: list[ProcessTotals] = list(store.newly_exited)  # final values, written once
        for totals in rows:
            self._last_counters.pop((totals.pid, totals.first_ts), None)
        for key, totals in store.live.items():
            values = (*(totals.counts[c] for c in COUNTERS), tuple(sorted(totals.errors.items())))
            if self._last_counters.get(key) != values:
                self._last_counters[key] = values
                rows.append(totals)
        if len(self._last_counters) > len(store.live):  # instances the kernel no longer has (bounded by its table)
            self._last_counters = {key: self._last_counters[key] for key in store.live if key in self._last_counters}
        if rows:
            self.writer.add("counters", codecs.PROCESS_COUNTERS.encode(rows, now, offset))
