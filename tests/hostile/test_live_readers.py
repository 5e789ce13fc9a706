"""A recording read while its recorder writes it (issue 27, item 8): the recorder's own writer
flushes the events of tests/data/emfile part by part and merges them (as --rotate does) while
`info` reads. Before, `info --engine duckdb` failed on 6 of 8 tries with "No files found that
match ... part-000013.parquet" (a merge had moved it), and the pandas reader skipped what a
merge moved; now the part list is a snapshot, taken again when a merge moved a file."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fdtrace.analysis import load
from fdtrace.analysis.engines import dataset
from fdtrace.analysis.summary import summary
from fdtrace.recording import reader
from fdtrace.recording.upgrade import upgrade
from fdtrace.recording.writer import RecordingWriter
from fdtrace.schema import SCHEMA_VERSION
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
    recording = load(writer.root, engine="duckdb")
    try:
        before = sorted(p.name for p in (writer.root / "events" / "host=vm").iterdir())
        writer.compact()  # --rotate: the seven parts the views were made over become one file
        after = sorted(p.name for p in (writer.root / "events" / "host=vm").iterdir())
        assert len(before) == 7 and after == ["part-000001-000007.parquet"]
        counted = recording.sql("SELECT count(*) AS n FROM events")
        text = summary(recording)
    finally:
        recording.close()
    assert int(counted["n"].iloc[0]) == damage.EMFILE_EVENTS and recording.skipped == []
    assert "\nevents: 76\n" in text and "4 calls failed (EMFILE socket 3, EMFILE pipe2 1)" in text


def test_a_merge_between_listing_and_reading_is_listed_again(writer: RecordingWriter,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    opened = reader.open_part
    merged: list[bool] = []

    def open_then_merge(path: Path) -> reader.Part:
        if not merged and path.parent.name == "host=vm" and path.parent.parent.name == "events":
            merged.append(True)
            writer.compact()  # after the listing: the listed parts are gone
        return opened(path)

    monkeypatch.setattr(reader, "open_part", open_then_merge)
    loaded = load(writer.root)
    assert merged and len(loaded.events) == damage.EMFILE_EVENTS and loaded.skipped == []


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
