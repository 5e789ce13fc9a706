"""Damage done to copies of real recordings (tests/data/emfile and tests/data/ddp, made by
fdtrace's own recorder), shared by the readers' hostile tests and the seeded fuzz: each function
changes one thing the way a corrupt disk, a bad copy, a clock step or a local user would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fdtrace.recording.compaction import compact_host
from fdtrace.recording.fleet import find_fleet
from fdtrace.recording.summaries import SUMMARY_KEY
from tests.helpers import FDTRACE

DATA = Path(__file__).parents[1] / "data"
EMFILE, DDP = DATA / "emfile", DATA / "ddp"
#: What tests/data/emfile holds (fdtrace info says so): events, of which EMFILE failures.
EMFILE_EVENTS = 76
EMFILE_FAILURES = 4
SECOND = 1_000_000_000
THREE_YEARS = 3 * 365 * 86_400 * SECOND


def copy(fixture: Path, to: Path) -> Path:
    """A copy of a fixture recording to damage."""
    shutil.copytree(fixture, to)
    return to


def parts(recording: Path, table: str = "events") -> list[Path]:
    """A table's part files, in order."""
    return sorted((recording / table).glob("host=*/part-*.parquet"))


def meta_file(recording: Path) -> Path:
    return next((recording / "meta").glob("host=*.json"))


def compacted(fixture: Path, to: Path) -> Path:
    """A copy whose parts were merged by ``fdtrace compact`` (so its events parts carry summaries)."""
    recording = copy(fixture, to)
    for host in find_fleet(recording).hosts:
        compact_host(host)
    return recording


def rewrite(part: Path, change: Callable[[pa.Table], pa.Table], compression: str = "zstd") -> None:
    """Write a part again with its rows changed (its footer's own metadata kept)."""
    table = change(pq.read_table(part))
    pq.write_table(table, part, compression=compression)


def set_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.column_names.index(name), name, values)


def set_times(part: Path, index: int, ns: int) -> None:
    """The ``time`` of one row of a part set to ``ns``."""
    def change(table: pa.Table) -> pa.Table:
        times = table["time"].cast(pa.int64()).to_pylist()
        times[index] = ns
        return set_column(table, "time", pa.array(times, pa.int64()).cast(table["time"].type))

    rewrite(part, change)


def first_of_kind(recording: Path, kind: str) -> tuple[Path, int]:
    """The part and row of the first event of a kind."""
    for part in parts(recording):
        kinds = pq.read_table(part, columns=["kind"])["kind"].cast(pa.string()).to_pylist()
        if kind in kinds:
            return part, kinds.index(kind)
    raise AssertionError(f"no {kind} event")


def nest_meta(recording: Path, depth: int = 100_000) -> None:
    """The metadata with a field nested ``depth`` deep."""
    path = meta_file(recording)
    text = path.read_text().rstrip().removesuffix("}")
    path.write_text(text + ', "nested": ' + "[" * depth + "]" * depth + "}")


def set_meta(recording: Path, **fields: object) -> None:
    path = meta_file(recording)
    meta = json.loads(path.read_text())
    meta.update(fields)
    path.write_text(json.dumps(meta))


def set_summary(part: Path, summary: object) -> None:
    """A part's footer summary replaced (``summary``: its JSON value, or bytes as they are)."""
    table = pq.read_table(part)
    raw = summary if isinstance(summary, bytes) else json.dumps(summary).encode()
    metadata = {k: v for k, v in (table.schema.metadata or {}).items() if k != SUMMARY_KEY}
    with pq.ParquetWriter(part, table.schema.with_metadata(metadata), compression="zstd") as out:
        out.write_table(table.replace_schema_metadata(metadata))
        out.add_key_value_metadata({SUMMARY_KEY: raw})


def read_summary_json(part: Path) -> dict[str, object]:
    found = json.loads((pq.read_metadata(part).metadata or {})[SUMMARY_KEY])
    assert isinstance(found, dict)
    return found


def truncate_half(part: Path) -> None:
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])


def flip_page_bytes(part: Path) -> None:
    """Bytes inverted in the middle of the file (its pages), the footer left whole."""
    data = bytearray(part.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    for i in range(4, len(data) - footer - 4):
        if i % 3 == 0:
            data[i] ^= 0xFF
    part.write_bytes(bytes(data))


def all_null(part: Path) -> None:
    """Every column of a part null (its types kept)."""
    def change(table: pa.Table) -> pa.Table:
        schema = pa.schema([f.with_nullable(True) for f in table.schema])
        return pa.Table.from_arrays([pa.nulls(table.num_rows, f.type) for f in schema], schema=schema)

    rewrite(part, change)


def huge_comm(part: Path, size: int = 300_000_000) -> None:
    """The part's first row alone, its comm ``size`` characters long (zstd keeps the file small)."""
    def change(table: pa.Table) -> pa.Table:
        one = table.slice(0, 1)
        return set_column(one, "comm", pa.array(["x" * size], pa.string()).cast(one["comm"].type))

    rewrite(part, change)


def float_pid(part: Path) -> None:
    rewrite(part, lambda t: set_column(t, "pid", t["pid"].cast(pa.float64())))


def plant_wide_part(recording: Path, rows: int = 5) -> Path:
    """A part named to cover every flush, holding a few rows of a real part."""
    first = parts(recording)[0]
    planted = first.parent / "part-000000-999999.parquet"
    pq.write_table(pq.read_table(first).slice(0, rows), planted)
    return planted


def negative_losses(recording: Path, value: int = -10**15) -> Path:
    part = parts(recording, "losses")[-1]
    rewrite(part, lambda t: set_column(t, "ringbuf_full", pa.array([value] * t.num_rows, pa.int64())))
    return part


def fdtrace(*argv: str, timeout: float = 120, procs: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the fdtrace command (``procs``: in the memory cgroup of this cgroup.procs file)."""
    def join() -> None:
        if procs is not None:
            procs.write_text(str(os.getpid()))

    return subprocess.run([FDTRACE, *argv], capture_output=True, text=True, timeout=timeout, preexec_fn=join)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused command prints."""
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fdtrace: error: "), result.stderr
    return lines[0]


def succeeded(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """A command that ran to its end (killed by a memory cgroup, it has returncode -9)."""
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result
