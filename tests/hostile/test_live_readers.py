"""A recording read while its recorder writes it (issue 27, item 8; issue 39): the recorder's own
writer flushes the events of tests/data/emfile part by part and merges them (as --rotate does)
while `info` reads. Before, `info --engine duckdb` failed on 6 of 8 tries with "No files found
that match ... part-000013.parquet" (a merge had moved it), and later, under load, with "its part
files kept changing while it was read" (readers listed again and gave up after some tries). Now
a reader reads the manifest the writer publishes, under the readers' lock, and the parts a merge
replaces stay on disk until no reader holds that lock; the same for planted manifests and locks,
and recordings written before manifests."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fdtrace.analysis import load
from fdtrace.analysis.engines import dataset
from fdtrace.analysis.summary import summary
from fdtrace.errors import FdtraceError
from fdtrace.recording import reader
from fdtrace.recording.compaction import compact_host
from fdtrace.recording.fleet import find_fleet
from fdtrace.recording.upgrade import upgrade
from fdtrace.recording.writer import RecordingWriter
from fdtrace.schema import SCHEMA_VERSION
from fdtrace.sources.replay import ReplaySource
from tests.hostile import mutations as damage

#: Flushes the writer of the live test makes at most (about a second of its time each run of info).
MAX_FLUSHES = 300
META = {"schema_version": SCHEMA_VERSION, "host": "vm", "started": 1_796_016_973.6, "boot_id": "b"}


def fixture_events() -> list[pa.Table]:
    """The events of tests/data/emfile, one table per part, in the current declaration."""
    return [upgrade("events", pq.read_table(part), 1) for part in damage.parts(damage.EMFILE)]


def later(events: pa.Table, flushes: int) -> pa.Table:
    """Events moved ``flushes`` x 10 s later, as a recorder's next flushes would be (the same rows
    at the same times twice are one part copied, which readers read once)."""
    shift = flushes * 10_000_000_000
    time_index = events.schema.get_field_index("time")
    events = events.set_column(time_index, events.schema.field(time_index), pa.array(
        [t + shift for t in events["time"].cast(pa.int64()).to_pylist()], pa.int64()).cast(events["time"].type))
    ts_index = events.schema.get_field_index("ts_ns")
    return events.set_column(ts_index, events.schema.field(ts_index),
                             pa.array([t + shift for t in events["ts_ns"].to_pylist()], events["ts_ns"].type))


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[RecordingWriter]:
    """A recorder's writer that has flushed every events part of the fixture, unmerged."""
    writer = RecordingWriter(tmp_path / "rec", "vm", META)
    for events in fixture_events():
        writer.add("events", events)
        writer.flush()
    yield writer
    writer.close()


def test_a_merge_after_the_views_were_made_is_read_through(writer: RecordingWriter) -> None:
    """The views' state of the recording stays on disk while they are open: the merge publishes
    its file, and the seven parts it replaced are deleted only after the reader let go."""
    folder = writer.root / "events" / "host=vm"
    recording = load(writer.root, engine="duckdb")
    try:
        before = sorted(p.name for p in folder.iterdir())
        writer.compact()  # --rotate: the seven parts the views were made over become one file
        after = sorted(p.name for p in folder.iterdir())
        assert len(before) == 7 and after == sorted([*before, "part-000001-000007.parquet"])
        counted = recording.sql("SELECT count(*) AS n FROM events")
        text = summary(recording)
    finally:
        recording.close()
    assert int(counted["n"].iloc[0]) == damage.EMFILE_EVENTS and recording.skipped == []
    assert "\nevents: 76\n" in text and "4 calls failed (EMFILE socket 3, EMFILE pipe2 1)" in text
    writer.flush()  # the next flush deletes what no reader holds any more
    assert sorted(p.name for p in folder.iterdir()) == ["part-000001-000007.parquet"]


def test_a_merge_between_listing_and_reading_changes_nothing_read(writer: RecordingWriter,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge between the manifest's reading and the parts' reading changes nothing read: the
    parts it replaced stay until the reader is done."""
    opened = reader.open_part
    merged: list[bool] = []

    def open_then_merge(path: Path) -> reader.Part:
        if not merged and path.parent.name == "host=vm" and path.parent.parent.name == "events":
            merged.append(True)
            writer.compact()  # after the listing: the listed parts are out of the manifest
        return opened(path)

    monkeypatch.setattr(reader, "open_part", open_then_merge)
    loaded = load(writer.root)
    assert merged and len(loaded.events) == damage.EMFILE_EVENTS and loaded.skipped == [] and loaded.notes == []
    assert len(list((writer.root / "events" / "host=vm").iterdir())) == 8  # deleted at the next flush


def test_auto_chooses_by_the_rows_the_footers_give_not_by_bytes(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A long --rotate recording's merged files compress 10 to 50 times: their bytes said nothing
    of the memory pandas would need. The footers' row counts do."""
    recording = damage.compacted(damage.EMFILE, tmp_path / "rec")
    rows = sum(pq.read_metadata(p).num_rows for t in ("events", "samples") for p in damage.parts(recording, t))
    assert rows == damage.EMFILE_EVENTS + 60
    monkeypatch.setattr(dataset, "AUTO_PANDAS_ROWS", rows)
    assert dataset.choose_engine(recording) == "duckdb"
    monkeypatch.setattr(dataset, "AUTO_PANDAS_ROWS", rows + 1)
    assert dataset.choose_engine(recording) == "pandas"
    padding = next(recording.glob("samples/host=vm/part-*.parquet"))
    table = pq.read_table(padding)
    noise = pa.array([b"\x00" * (200 << 10)] * table.num_rows, pa.binary())  # a column no table declares
    pq.write_table(table.append_column("noise", noise), padding, compression="none", use_dictionary=False)
    assert padding.stat().st_size > 8 << 20  # bytes on disk, the same rows
    assert dataset.choose_engine(recording) == "pandas"
    # and only while those rows fit in a quarter of the memory this host has available
    monkeypatch.setattr(dataset, "memory_available", lambda: 4 * dataset.PANDAS_BYTES_PER_ROW * rows)
    assert dataset.choose_engine(recording) == "pandas"
    monkeypatch.setattr(dataset, "memory_available", lambda: 4 * dataset.PANDAS_BYTES_PER_ROW * rows - 4)
    assert dataset.choose_engine(recording) == "duckdb"
    assert dataset.pandas_fits(rows, None)  # memory unknown: the rows alone decide


def test_info_while_the_recorder_flushes_and_merges(tmp_path: Path) -> None:
    """A writer flushing and merging all the while, and `info --engine duckdb` run over it again
    and again: every run reads a whole snapshot (no file named as missing, nothing skipped),
    and never fewer events than the run before."""
    writer = RecordingWriter(tmp_path / "rec", "vm", META)
    events = fixture_events()
    stop = threading.Event()
    flushed = threading.Event()

    def record() -> None:
        flushes = 0
        while not stop.is_set() and flushes < MAX_FLUSHES:
            writer.add("events", later(events[flushes % len(events)], flushes))
            writer.flush()
            flushes += 1
            if flushes % 3 == 0:
                writer.compact()  # as --rotate does, under the host's lock
            if flushes == 3:
                flushed.set()

    recorder = threading.Thread(target=record)
    recorder.start()
    try:
        assert flushed.wait(60)
        seen = []
        for _ in range(3):
            result = damage.succeeded(damage.fdtrace("info", str(writer.root), "--engine", "duckdb"))
            assert "skipped" not in result.stdout and "No files found" not in result.stderr
            seen.append(int(result.stdout.split("\nevents: ", 1)[1].split("\n", 1)[0]))
    finally:
        stop.set()
        recorder.join()
        writer.close()
    assert seen == sorted(seen) and seen[0] > 0


def test_a_recording_without_a_manifest_is_listed_as_before(tmp_path: Path) -> None:
    """tests/data/emfile was written before manifests: every reader lists its folders, and
    compact merges it without making one (an older recorder may still be writing it)."""
    old = damage.copy(damage.EMFILE, tmp_path / "old")
    assert not list((old / "meta").glob(".host=*"))
    loaded = load(old)
    assert len(loaded.events) == damage.EMFILE_EVENTS and loaded.skipped == [] and loaded.notes == []
    shown = damage.succeeded(damage.fdtrace("info", str(old), "--engine", "duckdb"))
    assert "\nevents: 76\n" in shown.stdout and "skipped" not in shown.stdout
    replayed = ReplaySource(old)
    assert replayed.player.events.num_rows == damage.EMFILE_EVENTS and replayed.skipped == []
    for host in find_fleet(old).hosts:
        compact_host(host)
    assert not list((old / "meta").glob(".host=*.parts.json"))
    assert [p.name for p in damage.parts(old)] == ["part-000002-000010.parquet"]  # its seven parts, merged
    assert len(load(old).events) == damage.EMFILE_EVENTS


@pytest.fixture
def written(tmp_path: Path) -> Path:
    """A recording of the fixture's events, finished, with its manifest."""
    writer = RecordingWriter(tmp_path / "rec", "vm", META)
    for events in fixture_events():
        writer.add("events", events)
        writer.flush()
    writer.write_meta(complete=True)
    writer.close()
    return writer.root


def _plant(path: Path, how: str, precious: Path) -> None:
    path.unlink()
    if how == "symlink":
        path.symlink_to(precious)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "huge":
        with open(path, "wb") as file:
            file.truncate(200 << 20)  # sparse: 200 MB of zeros
    elif how == "lies":  # a billion parts
        path.write_text(json.dumps({"version": 1, "generation": 7, "parts": {"events": [[1, 10**9, 1]]}}))


@pytest.mark.parametrize("how", ["symlink", "fifo", "huge", "lies"])
def test_a_planted_manifest_is_not_trusted_followed_or_overwritten(written: Path, tmp_path: Path, how: str) -> None:
    precious = tmp_path / "precious"
    precious.write_text("root's file\n")
    manifest = written / "meta" / ".host=vm.parts.json"
    _plant(manifest, how, precious)
    started = time.monotonic()
    shown = damage.succeeded(damage.fdtrace("info", str(written), "--engine", "duckdb", timeout=60))
    assert time.monotonic() - started < 60
    assert "\nevents: 76\n" in shown.stdout and "unusable manifest" in shown.stdout  # listed instead, and said
    loaded = load(written)
    assert len(loaded.events) == damage.EMFILE_EVENTS and any("unusable manifest" in s for s in loaded.skipped)
    # a recorder resuming it publishes its own manifest over the planted name, never through it
    RecordingWriter(written, "vm", META, resume=True).close()
    assert precious.read_text() == "root's file\n"
    assert stat.S_ISREG(os.lstat(manifest).st_mode) and os.lstat(manifest).st_size < 4096
    again = load(written)
    assert len(again.events) == damage.EMFILE_EVENTS and again.skipped == [] and again.notes == []


@pytest.mark.parametrize("how", ["symlink", "fifo"])
def test_a_planted_readers_lock_makes_readers_go_on_without_it_and_say_so(written: Path, tmp_path: Path,
                                                                          how: str) -> None:
    precious = tmp_path / "precious"
    precious.write_text("root's file\n")
    lock = written / "meta" / ".host=vm.readers"
    _plant(lock, how, precious)
    shown = damage.succeeded(damage.fdtrace("info", str(written), "--engine", "duckdb", timeout=60))
    assert "\nevents: 76\n" in shown.stdout and "read without the readers' lock" in shown.stdout
    replayed = ReplaySource(written)
    assert replayed.player.events.num_rows == damage.EMFILE_EVENTS
    assert any("read without the readers' lock" in n for n in replayed.notes)
    with pytest.raises(FdtraceError, match="cannot open the recording's lock"):  # the writer refuses it
        RecordingWriter(written, "vm", META, resume=True)
    assert precious.read_text() == "root's file\n"


def test_the_readers_lock_is_private_in_a_shared_recording(tmp_path: Path) -> None:
    """Only its owner may hold the recorder's deletions back: other users read a --shared
    recording without the lock (and are told so)."""
    writer = RecordingWriter(tmp_path / "rec", "vm", META, shared=True)
    writer.close()
    meta = tmp_path / "rec" / "meta"
    assert stat.S_IMODE(os.lstat(meta / ".host=vm.readers").st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(meta / ".host=vm.parts.json").st_mode) == 0o644
