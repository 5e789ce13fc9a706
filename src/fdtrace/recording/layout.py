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
from pathlib import Path

from fdtrace.schema import TABLES as DECLARED

#: The tables of a recording, in the order of docs/recording.md.
TABLES: tuple[str, ...] = tuple(DECLARED)
PART_GLOB = "part-*.parquet"
_PART_RE = re.compile(r"^part-(\d+)(?:-(\d+))?\.parquet$")


def part_name(first: int, last: int) -> str:
    """The file name of a part covering flushes ``first`` to ``last``."""
    return f"part-{first:06d}.parquet" if first == last else f"part-{first:06d}-{last:06d}.parquet"


def part_files(folder: Path) -> list[Path]:
    """The part files of one table and host, in order, leaving out parts that a merged file
    also covers (left behind when a compaction was interrupted)."""
    ranges = []
    for path in folder.glob(PART_GLOB):
        match = _PART_RE.match(path.name)
        if match:
            first = int(match[1])
            ranges.append((first, int(match[2] or first), path))
    merged = [(first, last) for first, last, _ in ranges if last > first]
    kept = [(first, last, path) for first, last, path in ranges
            if last > first or not any(lo <= first <= hi for lo, hi in merged)]
    return [path for _, _, path in sorted(kept)]


def host_dir(root: Path, table: str, host: str) -> Path:
    """The folder of one table's part files for one host."""
    return root / table / f"host={host}"


def meta_path(root: Path, host: str) -> Path:
    """The metadata file of one host's recording."""
    return root / "meta" / f"host={host}.json"


