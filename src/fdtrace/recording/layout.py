"""The on-disk layout of a recording.

A recording is a directory of plain Parquet files, one folder per table and one hive partition
per host, so that several hosts' recordings can sit side by side and be read as one dataset::

    DIR/meta/host=NAME.json                    run metadata (schema version, kernel, probes, ...)
    DIR/TABLE/host=NAME/part-000001.parquet    TABLE: events, samples, system, losses, counters, clock

Each part file is written whole, under a temporary name, then renamed: a file with its final
name is always complete, whatever happened to the recorder afterwards.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fdtrace.schema import TABLES as DECLARED

#: The tables of a recording, in the order of docs/recording.md.
TABLES: tuple[str, ...] = tuple(DECLARED)
#: Integers that are ids over all 64 bits (a stack's hash), so any value is possible.
UNBOUNDED = frozenset({"stack_id"})
#: Columns of times that only grow from row to row: delta-encoded, not dictionary-encoded.
GROWING = frozenset({"ts_ns", "time"})
#: Per table, the columns an engine scans for one value at a time (the rare kinds and the errnos
#: of ``analysis.engines.DERIVED``), with about how many distinct values they hold: each row group
#: gets a Bloom filter of them, so a scan for a rare kind skips the row groups that lack it (a
#: quarter of the time of ``info`` on a fleet of 64 M events; 47 bytes a column a row group).
BLOOM_FILTERED: dict[str, dict[str, int]] = {"events": {"kind": 32, "errno": 256}}
#: The false positive rate of those filters (a row group read for nothing, one time in a hundred).
BLOOM_FALSE_POSITIVES = 0.01


def checked_statistics(table: str) -> list[str]:
    """The columns whose footer statistics a reader checks before it lets an engine read a part
    as it is (``reader.doubts``): those that may not be null (their null counts), and the int64
    and time columns that may (their ranges)."""
    return [f.name for f in DECLARED[table].stored_fields if (
        not f.nullable or (f.arrow_type in ("int64", "timestamp_utc") and f.name not in UNBOUNDED))]


def parquet_options(table: str, columns: Iterable[str]) -> dict[str, Any]:
    """How a part of ``table`` with these columns is written (types and values are the same
    either way; this is only the encoding): zstd; the growing times delta-encoded (a tenth of
    the CPU and of the bytes of plain values, for a million distinct stamps a second); every
    other column dictionary-encoded as pyarrow does by default; statistics only of the columns
    a reader checks (``checked_statistics``): the others, mostly null, cost as much to sum up
    as to write; values encoded 8,192 at a time (pyarrow's 1,024 cost a fifth more CPU); Bloom
    filters of the columns scanned for one value (``BLOOM_FILTERED``)."""
    names = list(columns)
    growing = [name for name in names if name in GROWING]
    blooms = {name: {"ndv": values, "fpp": BLOOM_FALSE_POSITIVES}
              for name, values in BLOOM_FILTERED.get(table, {}).items() if name in names}
    return {"compression": "zstd",
            "use_dictionary": [name for name in names if name not in GROWING],
            "column_encoding": dict.fromkeys(growing, "DELTA_BINARY_PACKED"),
            "write_statistics": [name for name in checked_statistics(table) if name in names],
            "write_batch_size": 8192,
            "bloom_filter_options": blooms or None}
PART_GLOB = "part-*.parquet"
_PART_RE = re.compile(r"^part-(\d+)(?:-(\d+))?\.parquet$")


def part_name(first: int, last: int) -> str:
    """The file name of a part covering flushes ``first`` to ``last``."""
    return f"part-{first:06d}.parquet" if first == last else f"part-{first:06d}-{last:06d}.parquet"


def part_range(path: Path) -> tuple[int, int] | None:
    """The flushes a part file covers, from its name (None: not a part's name)."""
    match = _PART_RE.match(path.name)
    return None if match is None else (int(match[1]), int(match[2] or match[1]))


def part_names(names: Iterable[str]) -> list[str]:
    """Of the names in one table's folder of one host, the part files, in order, leaving out
    parts that a merged file also covers (left behind when a compaction was interrupted, or
    merged twice over)."""
    ranges = []
    for name in names:
        covered = part_range(Path(name))
        if covered:
            ranges.append((covered[0], -covered[1], name))
    kept = []
    reach = 0  # the last flush covered by the ranges so far; each later one starts no earlier
    for _first, negative_last, name in sorted(ranges):
        if -negative_last > reach:
            kept.append(name)
            reach = -negative_last
    return kept


def part_files(folder: Path) -> list[Path]:
    """``part_names`` of a folder, as paths."""
    return [folder / name for name in part_names(path.name for path in folder.glob(PART_GLOB))]


def lock_name(host: str) -> str:
    """The lock (in ``meta/``) that the recorder and ``fdtrace compact`` take while they delete a
    host's parts. It holds how many times ``fdtrace compact`` changed the parts (see
    ``compactions``)."""
    return f".host={host}.lock"


def lock_path(root: Path, host: str) -> Path:
    """The path of ``lock_name``."""
    return root / "meta" / lock_name(host)


def compactions(lock_fd: int) -> int:
    """How many times ``fdtrace compact`` changed a host's parts, from its lock file."""
    import os

    try:
        return int(os.pread(lock_fd, 32, 0).decode() or 0)
    except (OSError, ValueError):
        return -1  # unreadable: look at the parts again


def count_compaction(lock_fd: int) -> None:
    """Note in the lock file (held) that the parts changed."""
    import os

    count = max(compactions(lock_fd), 0) + 1
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, str(count).encode(), 0)


def host_folder(host: str) -> str:
    """The name of one host's partition folder in a table's folder."""
    return f"host={host}"


def meta_name(host: str) -> str:
    """The name of one host's metadata file in ``meta/``."""
    return f"host={host}.json"


def host_dir(root: Path, table: str, host: str) -> Path:
    """The folder of one table's part files for one host."""
    return root / table / f"host={host}"


def meta_path(root: Path, host: str) -> Path:
    """The metadata file of one host's recording."""
    return root / "meta" / f"host={host}.json"


