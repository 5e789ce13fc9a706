"""The on-disk layout of a recording, and reading it back.

A recording is a directory of plain Parquet files, one folder per table and one hive partition
per host, so that several hosts' recordings can sit side by side and be read as one dataset::

    DIR/meta/host=NAME.json                    run metadata (schema version, kernel, probes, ...)
    DIR/TABLE/host=NAME/part-000001.parquet    TABLE: events, samples, system, losses, counters, clock

Each part file is written whole, under a temporary name, then renamed: a file with its final
name is always complete, whatever happened to the recorder afterwards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fdtrace.errors import FdtraceError
from fdtrace.schema import SCHEMA_VERSION

TABLES: tuple[str, ...] = ("events", "samples", "system", "losses", "counters", "clock")
PART_GLOB = "part-*.parquet"


def host_dir(root: Path, table: str, host: str) -> Path:
    """The folder of one table's part files for one host."""
    return root / table / f"host={host}"


def meta_path(root: Path, host: str) -> Path:
    """The metadata file of one host's recording."""
    return root / "meta" / f"host={host}.json"


@dataclass
class Recording:
    """A loaded recording: one pandas DataFrame per table, all hosts together.

    Attributes:
        events: the event model of docs/format.md (``host`` categorical, ``time`` UTC).
        samples: per-process FD headroom samples.
        system: system-wide samples (file-nr, file-max, ...).
        losses: per-interval loss counts.
        counters: exact per-process counters, cumulative, at each flush.
        clock: CLOCK_REALTIME/BOOTTIME - CLOCK_MONOTONIC offsets sampled during the recording.
        meta: run metadata by host.
        skipped: part files that could not be read, with the reason (the rest was loaded).
    """

    events: Any
    samples: Any
    system: Any
    losses: Any
    counters: Any
    clock: Any
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def read_meta(root: Path) -> dict[str, dict[str, Any]]:
    """Metadata of every host in a recording directory; raises if it is not a readable recording."""
    if not root.is_dir():
        raise FdtraceError(f"{root}: no such recording directory")
    files = sorted((root / "meta").glob("host=*.json"))
    if not files:
        raise FdtraceError(f"{root}: not an fdtrace recording (no meta/host=*.json)")
    metas = {}
    for path in files:
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise FdtraceError(f"{path}: unreadable recording metadata ({exc})") from None
        version = meta.get("schema_version")
        if version != SCHEMA_VERSION:
            raise FdtraceError(
                f"{path}: recording schema version {version}, this fdtrace reads version {SCHEMA_VERSION}"
            )
        metas[meta["host"]] = meta
    return metas


def _read_table(root: Path, table: str, hosts: list[str], skipped: list[str]) -> Any:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    frames = []
    for host in hosts:
        parts = []
        for path in sorted(host_dir(root, table, host).glob(PART_GLOB)):
            try:
                parts.append(pq.read_table(path))
            except (OSError, pa.ArrowException) as exc:
                skipped.append(f"{path}: {' '.join(str(exc).split())[:200]}")
        if not parts:
            continue
        frame = pa.concat_tables(parts, promote_options="default").to_pandas()
        frame.insert(0, "host", host)
        frames.append(frame)
    if not frames:
        return pd.DataFrame({"host": pd.Series([], dtype="category")})
    result = pd.concat(frames, ignore_index=True)
    result["host"] = result["host"].astype("category")
    for column in result.columns:
        if result[column].dtype == object and column in ("comm", "kind", "syscall", "errno", "signal"):
            result[column] = result[column].astype("category")
    if "ts_ns" in result.columns:
        result = result.sort_values("ts_ns", kind="stable", ignore_index=True)
    return result


def load(paths: str | Path | list[str | Path]) -> Recording:
    """Load one recording directory, or several (several hosts), into DataFrames.

    Part files that cannot be read (truncated, corrupt) are skipped and named in ``skipped``;
    a directory that is not a recording, or one of another schema version, raises FdtraceError.
    """
    import pandas as pd

    roots = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
    meta: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    tables: dict[str, list[Any]] = {t: [] for t in TABLES}
    for root in roots:
        hosts = read_meta(root)
        meta.update(hosts)
        for table in TABLES:
            tables[table].append(_read_table(root, table, sorted(hosts), skipped))
    frames = {}
    for table, parts in tables.items():
        frame = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        if "host" in frame.columns:
            frame["host"] = frame["host"].astype("category")
        frames[table] = frame
    return Recording(meta=meta, skipped=skipped, **frames)
