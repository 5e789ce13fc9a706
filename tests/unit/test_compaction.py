"""`fdtrace compact` merges small part files into large ones without losing or doubling a row,
also while a recorder goes on writing (and merging and rotating out parts of its own)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fdtrace.analysis import load
from fdtrace.recording.compaction import compact_host
from fdtrace.recording.fleet import find_fleet
from fdtrace.recording.summaries import read_summary
from fdtrace.recording.writer import RecordingWriter
from fdtrace.schema import SCHEMA_VERSION
from tests.helpers import FDTRACE

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from fleet_data import generate_fleet  # noqa: E402


def test_compact_a_fleet(tmp_path: Path) -> None:
    truths = generate_fleet(tmp_path, hosts=2, events_per_host=100_000, seconds=40, flush_every=2)
    parts = sorted(tmp_path.glob("host-*/events/host=*/part-*.parquet"))
    assert len(parts) == 40
    result = subprocess.run([FDTRACE, "compact", str(tmp_path)], capture_output=True, text=True, check=True)
    assert "host-00 (" in result.stdout and "104 files -> 6," in result.stdout  # 6 tables, one file each
    merged = sorted(tmp_path.glob("host-*/events/host=*/part-*.parquet"))
    assert [p.name for p in merged] == ["part-000001-000020.parquet"] * 2
    assert pq.ParquetFile(merged[0]).metadata.num_row_groups == 1
    events = load(tmp_path).events
    assert events.groupby("host", observed=True).size().to_dict() == {t.host: t.events for t in truths}
    again = subprocess.run([FDTRACE, "compact", str(tmp_path)], capture_output=True, text=True, check=True)
    assert "0 rows merged" in again.stdout


def _rows(start: int, count: int) -> pa.Table:
    ts = np.arange(start, start + count, dtype=np.int64)
    return pa.table({"ts_ns": ts, "time": pa.array(ts, pa.timestamp("ns", tz="UTC")),
                     "pid": pa.array(np.ones(count, dtype=np.int32)), "tid": pa.array(np.ones(count, dtype=np.int32)),
                     "comm": ["w"] * count, "kind": ["socket"] * count, "syscall": ["socket"] * count,
                     "errno": [""] * count})


def test_compact_while_the_recorder_writes(tmp_path: Path) -> None:
    """A writer flushing, merging its own parts and rotating out old ones (--max-size) against a
    compactor running all the while: every row still in the recording is there exactly once,
    and those rotated out are counted."""
    writer = RecordingWriter(tmp_path, "live", {"schema_version": SCHEMA_VERSION, "host": "live"},
                             max_size=170_000)
    host = find_fleet(tmp_path).hosts[0]
    stop = threading.Event()
    merges = []
    errors: list[BaseException] = []

    def compactor() -> None:
        try:
            while not stop.is_set():
                merges.append(compact_host(host, target=65_000))
        except BaseException as exc:  # the test fails below, with it
            errors.append(exc)

    thread = threading.Thread(target=compactor)
    thread.start()
    written = 0
    try:
        for flush in range(150):
            writer.add("events", _rows(written, 2000))
            written += 2000
            writer.flush(wait=flush % 3 == 0)
            if flush % 10 == 9:
                writer.compact(wait=False)
        writer.write_meta(complete=True)
        writer.close()
    finally:
        stop.set()
        thread.join()
    assert not errors
    compact_host(host, target=65_000)
    events = load(tmp_path).events
    rotated = writer.rotated_out["rows"]["events"]
    assert rotated > 0 and sum(m.rows for m in merges) > 0
    assert events["ts_ns"].is_unique
    assert len(events) + rotated == written
    assert events["ts_ns"].max() == written - 1


def test_a_planted_lock_is_refused_in_one_line(tmp_path: Path) -> None:
    generate_fleet(tmp_path, hosts=1, events_per_host=20_000, seconds=4, flush_every=1)
    lock = tmp_path / "host-00" / "meta" / ".host=host-00.lock"
    target = tmp_path / "elsewhere"
    target.write_text("not to be touched\n")
    lock.unlink()  # the recorder's, made when it started
    lock.symlink_to(target)
    before = sorted(p.name for p in (tmp_path / "host-00" / "events" / "host=host-00").iterdir())
    result = subprocess.run([FDTRACE, "compact", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode != 0 and result.stderr.count("\n") == 1 and "cannot take the host's lock" in result.stderr
    assert target.read_text() == "not to be touched\n"
    assert sorted(p.name for p in (tmp_path / "host-00" / "events" / "host=host-00").iterdir()) == before


def test_compact_gives_old_parts_their_summaries(tmp_path: Path) -> None:
    """Parts written before part summaries get one from compact, and `info` then reads the
    summaries instead of the events, with the same result."""
    copy = tmp_path / "emfile"
    subprocess.run(["cp", "-r", str(ROOT / "tests" / "data" / "emfile"), str(copy)], check=True)
    parts = sorted(copy.glob("events/host=*/part-*.parquet"))
    assert parts and all(read_summary(p) is None for p in parts)
    before = subprocess.run([FDTRACE, "info", str(copy), "--engine", "duckdb"], capture_output=True, text=True,
                            check=True).stdout
    subprocess.run([FDTRACE, "compact", str(copy)], capture_output=True, text=True, check=True)
    parts = sorted(copy.glob("events/host=*/part-*.parquet"))
    assert parts and all(read_summary(p) is not None for p in parts)
    assert load(copy, engine="duckdb").part_summaries() is not None
    after = subprocess.run([FDTRACE, "info", str(copy), "--engine", "duckdb"], capture_output=True, text=True,
                           check=True).stdout
    assert after == before


def test_the_parts_compact_deleted_are_named_by_no_manifest_after(tmp_path: Path) -> None:
    """Compaction retires the parts it merged and deletes them when no reader holds the readers'
    lock; the manifest it publishes then names them no more (a finished recording's manifest
    kept them forever, and every reader decoded them). Held by a reader, they stay on disk and
    retired until a later compaction finds the lock free."""
    import fcntl
    import json

    truths = generate_fleet(tmp_path, hosts=1, events_per_host=20_000, seconds=10, flush_every=2)
    host = find_fleet(tmp_path).hosts[0]
    manifest = host.root / "meta" / f".host={host.host}.parts.json"
    readers = host.root / "meta" / f".host={host.host}.readers"
    assert manifest.exists() and readers.exists()
    before = sorted(p.name for p in host.root.glob("events/host=*/part-*.parquet"))
    assert len(before) == 5
    with readers.open("rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_SH)  # a reader of the state before
        compact_host(host)
        retired = json.loads(manifest.read_text())["retired"]
        assert retired["events"] == before
        assert all((host.root / "events" / f"host={host.host}" / name).exists() for name in before)
    compact_host(host)
    assert json.loads(manifest.read_text())["retired"] == {}
    assert [p.name for p in host.root.glob("events/host=*/part-*.parquet")] == ["part-000001-000005.parquet"]
    assert len(load(tmp_path).events) == truths[0].events
