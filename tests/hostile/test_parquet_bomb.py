"""A Parquet bomb (issue 37, E): millions of copies of one row in a part of a few hundred KB.
Before, `info` decoded it whole (252 s, 5.3 GB for 4.9 M rows), and the engine was chosen by
/proc/meminfo, not by the memory cgroup fdtrace runs in. Now the rows are read from each part's
footer before anything is decoded: what would not fit in the memory this process may use (its
cgroup's limit, or MemAvailable) is refused in one line, pandas is not chosen for it, and DuckDB,
which reads the files without holding them, still reads a large recording, honest or not.

Every command runs in a memory cgroup of MEMORY_LIMIT: a command that decoded the bomb would be
killed there (returncode -9), not merely slow."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fdtrace.recording.layout import parquet_options
from tests.helpers import memory_cgroup
from tests.hostile import mutations as damage

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="memory cgroups need root")

MEMORY_LIMIT = 384 << 20
ROWS = 3_000_000
#: What one command may take here, on a busy machine.
SECONDS = 60


@pytest.fixture(scope="module")
def cgroup() -> Path:
    with memory_cgroup(MEMORY_LIMIT) as procs:
        yield procs


def _write(part: Path, table: pa.Table) -> None:
    pq.write_table(table, part, row_group_size=1 << 20, **parquet_options("events", table.column_names))


def _one_failure(recording: Path) -> tuple[Path, pa.Table]:
    """The events part of a copy that holds an EMFILE failure, and that row."""
    for part in damage.parts(recording):
        table = pq.read_table(part)
        errnos = table["errno"].cast(pa.string()).to_pylist()
        if "EMFILE" in errnos:
            return part, table.slice(errnos.index("EMFILE"), 1)
    raise AssertionError("no EMFILE in the fixture")


def others(part: Path) -> int:
    """The fixture's events outside ``part`` (before it was replaced)."""
    return damage.EMFILE_EVENTS - pq.read_metadata(damage.EMFILE / part.relative_to(part.parents[2])).num_rows


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tests/data/emfile with its last events part replaced by ROWS copies of its EMFILE row."""
    recording = damage.copy(damage.EMFILE, tmp_path_factory.mktemp("bomb") / "rec")
    part, row = _one_failure(recording)
    _write(part, row.take(pa.array([0] * ROWS, pa.int32())))
    assert part.stat().st_size < 1 << 20  # a few hundred KB for 3 million rows
    return recording, part


@pytest.fixture(scope="module")
def doubted_bomb(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The bomb with one impossible value (a time in 1969), so that no engine reads it from the
    file as it is: fdtrace's reader, which checks every value, would decode it."""
    recording = damage.copy(damage.EMFILE, tmp_path_factory.mktemp("doubted") / "rec")
    part, row = _one_failure(recording)
    table = row.take(pa.array([0] * ROWS, pa.int32()))
    times = pa.array([-1] + [row["time"][0].value] * (ROWS - 1), pa.int64()).cast(table["time"].type)
    _write(part, damage.set_column(table, "time", times))
    return recording, part


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An honest large recording: ROWS socket() calls of one process, a microsecond apart."""
    recording = damage.copy(damage.EMFILE, tmp_path_factory.mktemp("large") / "rec")
    part, index = damage.first_of_kind(recording, "socket")
    row = pq.read_table(part).slice(index, 1)
    assert not row["errno"].cast(pa.string())[0].as_py()
    many = row.take(pa.array([0] * ROWS, pa.int32()))
    start = row["time"][0].value
    many = damage.set_column(many, "time", pa.array(range(start, start + ROWS * 1000, 1000), pa.int64())
                             .cast(many["time"].type))
    first = row["ts_ns"][0].as_py()
    many = damage.set_column(many, "ts_ns", pa.array(range(first, first + ROWS * 1000, 1000), pa.int64()))
    _write(part, many)
    return recording, part


def timed(*argv: str, procs: Path) -> tuple[float, object]:
    began = time.monotonic()
    result = damage.fdtrace(*argv, procs=procs, timeout=SECONDS * 3)
    return time.monotonic() - began, result


def test_pandas_asked_for_is_refused_in_one_line(bomb: tuple[Path, Path], cgroup: Path) -> None:
    recording, part = bomb
    seconds, result = timed("info", str(recording), "--engine", "pandas", procs=cgroup)
    line = damage.one_line_error(result)  # type: ignore[arg-type]
    samples = sum(pq.read_metadata(p).num_rows for p in damage.parts(recording, "samples"))
    rows = ROWS + others(part) + samples
    assert line.startswith(f"fdtrace: error: the recording's part files count {rows:,} rows of events and samples, "
                           "about "), line
    assert "this process may use (its memory cgroup's limit or MemAvailable): give --engine duckdb" in line
    assert seconds < SECONDS


@pytest.mark.parametrize("engine", ["auto", "duckdb"])
def test_duckdb_reads_it_from_the_file_within_the_cgroup(engine: str, bomb: tuple[Path, Path],
                                                         cgroup: Path) -> None:
    recording, part = bomb
    seconds, result = timed("info", str(recording), "--engine", engine, procs=cgroup)
    info = damage.succeeded(result)  # type: ignore[arg-type]
    assert f"\nevents: {ROWS + others(part)}\n" in info.stdout
    assert seconds < SECONDS


@pytest.mark.parametrize("argv", [["info", "--engine", "duckdb"], ["info"], ["report", "-o", "{out}/r.md"]],
                         ids=" ".join)
def test_a_bomb_only_fdtrace_would_decode_is_refused_in_one_line(argv: list[str], doubted_bomb: tuple[Path, Path],
                                                                 cgroup: Path, tmp_path: Path) -> None:
    recording, part = doubted_bomb
    seconds, result = timed(*[a.format(out=tmp_path) for a in argv], str(recording), procs=cgroup)
    line = damage.one_line_error(result)  # type: ignore[arg-type]
    assert line.startswith(f"fdtrace: error: {part}: its footer counts {ROWS:,} rows, about "), line
    assert line.endswith("not read (a damaged or planted file, or one to read on a machine with more memory)")
    assert seconds < SECONDS


def test_an_honest_large_recording_is_read_through_duckdb_within_the_cgroup(large: tuple[Path, Path],
                                                                           cgroup: Path) -> None:
    recording, part = large
    seconds, result = timed("info", str(recording), procs=cgroup)
    info = damage.succeeded(result)  # type: ignore[arg-type]
    assert f"\nevents: {ROWS + others(part)}\n" in info.stdout
    assert seconds < SECONDS
