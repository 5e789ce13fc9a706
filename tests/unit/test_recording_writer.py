"""The recording writer: complete parts, compaction (--rotate) and the size cap (--max-size)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from fdtrace.analysis import load
from fdtrace.analysis.summary import incident_window_lines
from fdtrace.cli.common import parse_size
from fdtrace.errors import FdtraceError
from fdtrace.recording import host_dir, part_files
from fdtrace.recording import writer as writer_module
from fdtrace.recording.writer import RecordingWriter
from fdtrace.schema import SCHEMA_VERSION

META = {"schema_version": SCHEMA_VERSION, "host": "h1"}


def write_intervals(writer: RecordingWriter, count: int, rows: int = 50, start: int = 0) -> None:
    for i in range(start, start + count):
        ts = list(range(i * rows, (i + 1) * rows))
        writer.add("system", pa.table({"ts_ns": ts, "file_nr": [i] * rows, "file_max": [1 << 20] * rows,
                                       "time": pa.array(ts, pa.timestamp("ns", tz="UTC"))}))
        writer.flush()


def test_parts_are_numbered_by_flush_and_load_in_order(tmp_path: Path) -> None:
    writer = RecordingWriter(tmp_path, "h1", META)
    write_intervals(writer, 3)
    writer.flush()  # nothing buffered: no file, but the number moves on
    write_intervals(writer, 1, start=3)
    names = [p.name for p in part_files(host_dir(tmp_path, "system", "h1"))]
    assert names == ["part-000001.parquet", "part-000002.parquet", "part-000003.parquet", "part-000005.parquet"]
    assert load(tmp_path).system["ts_ns"].tolist() == list(range(200))


def test_compaction_merges_parts_and_keeps_every_row(tmp_path: Path) -> None:
    writer = RecordingWriter(tmp_path, "h1", META)
    write_intervals(writer, 4)
    writer.compact()
    write_intervals(writer, 2, start=4)
    writer.compact()
    names = [p.name for p in part_files(host_dir(tmp_path, "system", "h1"))]
    assert names == ["part-000001-000004.parquet", "part-000005-000006.parquet"]
    assert load(tmp_path).system["ts_ns"].tolist() == list(range(300))


def test_interrupted_compaction_is_read_once(tmp_path: Path) -> None:
    writer = RecordingWriter(tmp_path, "h1", META)
    write_intervals(writer, 3)
    folder = host_dir(tmp_path, "system", "h1")
    saved = tmp_path / "saved"
    shutil.copytree(folder, saved)
    writer.compact()
    for part in saved.iterdir():  # as if the recorder died after the rename, before the unlinks
        shutil.copy(part, folder / part.name)
    assert [p.name for p in part_files(folder)] == ["part-000001-000003.parquet"]
    assert len(load(tmp_path).system) == 150


def test_max_size_deletes_the_oldest_parts_and_counts_them(tmp_path: Path) -> None:
    writer = RecordingWriter(tmp_path, "h1", META)
    write_intervals(writer, 1)
    one_part = writer.size
    capped = RecordingWriter(tmp_path / "capped", "h1", META, max_size=int(one_part * 3.5))
    write_intervals(capped, 10)
    capped.write_meta(complete=True)
    rec = load(tmp_path / "capped")
    assert rec.system["ts_ns"].tolist() == list(range(350, 500))
    meta = json.loads((tmp_path / "capped" / "meta" / "host=h1.json").read_text())
    assert meta["rotated_out"]["files"] == 7 and meta["rotated_out"]["rows"]["system"] == 350
    assert meta["rows"]["system"] == 500


def test_a_second_recording_of_the_same_host_is_refused(tmp_path: Path) -> None:
    RecordingWriter(tmp_path, "h1", META)
    with pytest.raises(FdtraceError, match="already holds a recording of host h1"):
        RecordingWriter(tmp_path, "h1", META)


@pytest.mark.parametrize(("text", "expected"), [("4096", 4096), ("500K", 500 << 10), ("2G", 2 << 30),
                                                ("1.5M", 3 << 19), ("64MiB", 64 << 20)])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-5M", "0"])
def test_parse_size_refuses_nonsense(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


class Watched(RecordingWriter):
    """A writer that notes the size of the part files on disk after each file it writes."""

    peak = 0

    def _guard(self, action: Any) -> Any:
        done = super()._guard(action)
        self.peak = max(self.peak, sum(p.stat().st_size for p in self.root.rglob("part-*.parquet")))
        return done


def test_max_size_holds_while_parts_are_flushed(tmp_path: Path) -> None:
    """The parts a flush pushes out of the budget are gone before its own part is written."""
    limit = int(part_size(tmp_path) * 3.5)
    writer = Watched(tmp_path / "capped", "h1", META, max_size=limit)
    write_intervals(writer, 10)
    assert writer.peak <= limit and writer.rotated_out["files"] == 7, (writer.peak, limit)


def test_max_size_holds_while_parts_are_merged(tmp_path: Path) -> None:
    """A merged file is written beside its parts before they go: room is made for it first."""
    probe = RecordingWriter(tmp_path / "probe", "h1", META)
    write_intervals(probe, 1)
    one_part = probe.size
    limit = one_part * 10
    writer = Watched(tmp_path / "capped", "h1", META, max_size=limit)
    for start in (0, 4, 8):
        write_intervals(writer, 4, start=start)
        writer.compact()
    assert writer.peak <= limit
    assert writer.rotated_out["files"] >= 1 and len(load(tmp_path / "capped").system) >= 4 * 50


def part_size(tmp_path: Path) -> int:
    one = RecordingWriter(tmp_path / "one", "h1", META)
    write_intervals(one, 1)
    return one.size


def test_a_users_failures_again_and_again_never_evict_roots_first_incident(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Root's program fails once, then a user's (uid 65534) fails at five later flushes, each its
    own window (no gap joins them here), under a budget of three parts: root's window stays, the
    user's program keeps its first and its latest windows, the three between are given up
    (counted), and the ring keeps only its newest part besides."""
    monkeypatch.setattr(writer_module, "WINDOW_GAP_NS", 0)
    part = part_size(tmp_path)
    writer = RecordingWriter(tmp_path / "ring", "h1", META, max_size=int(part * 1.5), keep_incidents=int(part * 3.5),
                             keep_before_ns=0, keep_after_ns=0)
    for i in range(14):
        if i == 1:  # inside the span of the part this flush writes
            writer.mark_incidents([(time.monotonic_ns(), "EMFILE/ENFILE", "early", 0)], 0)
        if i in (3, 5, 7, 9, 11):
            writer.mark_incidents([(time.monotonic_ns(), "EMFILE/ENFILE", "noisy", 65534)], 0)
        write_intervals(writer, 1, start=i)
    writer.write_meta(complete=True)
    meta = json.loads((tmp_path / "ring" / "meta" / "host=h1.json").read_text())
    assert [(w["program"], w["uid"]) for w in meta["incident_windows"]] == [("early", 0), ("noisy", 65534),
                                                                              ("noisy", 65534)]
    assert meta["incidents_dropped"]["windows"] == 3 and meta["incidents_dropped"]["incidents"] == 3
    kept = set(load(tmp_path / "ring").system["file_nr"])
    assert kept == {1, 3, 11, 13}  # root's, the user's first and latest, the ring's newest
    assert writer.size <= writer.max_size + writer.keep_incidents  # type: ignore[operator]
    assert incident_window_lines(meta)[-1] == ("  incident windows given up (more than --keep-incidents holds): "
                                               "3 windows, 3 incidents")


def test_a_window_wider_than_its_budget_is_trimmed_to_its_failures_not_dropped(tmp_path: Path) -> None:
    """--keep-before 600 s before an incident, with a budget of two parts and three parts of the
    ring before it: the window keeps the part with the incident (trimmed, said so), nothing is
    given up, and the ring goes on over the parts before it."""
    part = part_size(tmp_path)
    writer = RecordingWriter(tmp_path / "ring", "h1", META, max_size=int(part * 3.5), keep_incidents=int(part * 2.5),
                             keep_before_ns=600 * 10**9, keep_after_ns=0)
    for i in range(12):
        if i == 5:
            writer.mark_incidents([(time.monotonic_ns(), "EMFILE/ENFILE", "early", None)], 0)
        write_intervals(writer, 1, start=i)
    writer.write_meta(complete=True)
    meta = json.loads((tmp_path / "ring" / "meta" / "host=h1.json").read_text())
    [window] = meta["incident_windows"]
    assert window["trimmed"] is True and window["incidents"] == {"EMFILE/ENFILE": 1}
    assert meta["incidents_dropped"]["windows"] == 0 and meta["incidents_trimmed"] == 1
    assert set(load(tmp_path / "ring").system["file_nr"]) == {5, 9, 10, 11}
    [line] = [line for line in incident_window_lines(meta) if "kept" in line]
    assert line.endswith(": early: EMFILE/ENFILE 1 (trimmed to fit --keep-incidents)")


def test_compaction_leaves_the_parts_a_window_keeps_apart(tmp_path: Path) -> None:
    """--rotate merges the ring's parts around a window, not the window's: it can still be
    trimmed part by part."""
    part = part_size(tmp_path)
    writer = RecordingWriter(tmp_path / "ring", "h1", META, max_size=part * 100, keep_incidents=part * 100,
                             keep_before_ns=0, keep_after_ns=0)
    for i in range(6):
        if i == 3:
            writer.mark_incidents([(time.monotonic_ns(), "OOM kill", "early", 0)], 0)
        write_intervals(writer, 1, start=i)
    writer.compact()
    names = [p.name for p in part_files(host_dir(tmp_path / "ring", "system", "h1"))]
    assert names == ["part-000001-000003.parquet", "part-000004.parquet", "part-000005-000006.parquet"]


def test_an_events_part_reads_back_as_written_and_engines_read_it_as_it_is(tmp_path: Path) -> None:
    """The part a flush writes (times delta-encoded, statistics only where a reader checks them)
    holds the decoded rows unchanged, and its footer shows an engine may read it without the
    reader's checks of every value."""
    import numpy as np
    import pyarrow.parquet as pq

    from fdtrace.kernel.decode import decode
    from fdtrace.procfs import ProcFS, StartTimeResolver
    from fdtrace.recording.reader import doubts, open_part
    from fdtrace.schema import RAW_EVENT_DTYPE, SYSCALL_IDS, Kind
    from fdtrace.schema.records import ClockOffsets

    raw = np.zeros(5000, dtype=RAW_EVENT_DTYPE)
    raw["ts_ns"] = 10**12 + np.cumsum(np.arange(5000) % 7 + 1)
    raw["pid"], raw["tid"], raw["comm"] = 4242, 4243, b"worker"
    raw["kind"], raw["syscall"], raw["ret"], raw["errno"], raw["fd"] = Kind.CLOSE, SYSCALL_IDS["close"], -9, 9, -1
    raw["kind"][::100], raw["ret"][::100], raw["errno"][::100] = Kind.SOCKET, -24, 24
    offsets = ClockOffsets(mono_ns=0, realtime_offset_ns=1_700_000_000 * 10**9, boottime_offset_ns=0)
    events = decode(raw, "h1", offsets, StartTimeResolver(ProcFS("/nonexistent"))).drop_columns(["host"])
    writer = RecordingWriter(tmp_path, "h1", META)
    writer.add("events", events)
    writer.flush()
    writer.close()
    [path] = part_files(host_dir(tmp_path, "events", "h1"))
    stored = pq.read_table(path)
    assert stored.equals(events.replace_schema_metadata(stored.schema.metadata))
    footer = pq.read_metadata(path).row_group(0)
    columns = {footer.column(i).path_in_schema: footer.column(i) for i in range(footer.num_columns)}
    assert "DELTA_BINARY_PACKED" in columns["ts_ns"].encodings and "DELTA_BINARY_PACKED" in columns["time"].encodings
    assert columns["pid"].is_stats_set and not columns["peer_port"].is_stats_set
    # a scan for one kind or errno skips the row groups whose filter lacks it
    assert columns["kind"].bloom_filter_length and columns["errno"].bloom_filter_length
    assert columns["comm"].bloom_filter_length is None
    part = open_part(path)
    try:
        assert doubts(part, "events", SCHEMA_VERSION) == ""
    finally:
        part.file.close()


def test_a_part_appended_to_a_finished_recording_is_published_in_its_manifest(tmp_path: Path) -> None:
    """`fdtrace run` adds the phases after its recorder stopped (``append_part``): the manifest
    names the new part, numbered after every part the recording ever had (merged ones too)."""
    from fdtrace.recording.manifest import Manifest
    from fdtrace.recording.writer import append_part

    writer = RecordingWriter(tmp_path, "h1", META)
    write_intervals(writer, 3)
    writer.compact()
    writer.write_meta(complete=True)
    writer.close()
    manifest_path = tmp_path / "meta" / ".host=h1.parts.json"
    before = Manifest.decode(json.loads(manifest_path.read_text()))
    ts = list(range(150, 160))
    rows = pa.table({"ts_ns": ts, "file_nr": [9] * 10, "file_max": [1 << 20] * 10,
                     "time": pa.array(ts, pa.timestamp("ns", tz="UTC"))})
    written = append_part(tmp_path, "system", "h1", rows)
    after = Manifest.decode(json.loads(manifest_path.read_text()))
    assert written.name == "part-000004.parquet" and after.generation == before.generation + 1
    assert after.parts["system"] == ["part-000001-000003.parquet", "part-000004.parquet"]
    assert load(tmp_path).system["ts_ns"].tolist() == list(range(160))
