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
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fdtrace.errors import FdtraceError
from fdtrace.schema import SCHEMA_VERSION

TABLES: tuple[str, ...] = ("events", "samples", "system", "losses", "counters", "clock", "haproxy", "phases")
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
        haproxy: HAProxy `show info` samples (with --haproxy-socket).
        phases: training phases per rank (recordings made by `fdtrace run --record`).
        meta: run metadata by host.
        skipped: part files that could not be read, with the reason (the rest was loaded).
    """

    events: Any
    samples: Any
    system: Any
    losses: Any
    counters: Any
    clock: Any
    haproxy: Any
    phases: Any
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


def read_parts(root: Path, table: str, host: str, skipped: list[str], columns: list[str] | None = None) -> Any:
    """One host's part files of ``table`` as one ``pyarrow.Table`` (None when there are none);
    unreadable parts are named in ``skipped``. ``columns``: only these (those a part has)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = []
    for path in part_files(host_dir(root, table, host)):
        try:
            if columns is None:
                parts.append(pq.read_table(path))
            else:
                present = set(pq.read_schema(path).names)
                parts.append(pq.read_table(path, columns=[c for c in columns if c in present]))
        except (OSError, pa.ArrowException) as exc:
            skipped.append(f"{path}: {' '.join(str(exc).split())[:200]}")
    return pa.concat_tables(parts, promote_options="default") if parts else None


def _read_table(root: Path, table: str, hosts: list[str], skipped: list[str], columns: list[str] | None) -> Any:
    import pandas as pd

    frames = []
    for host in hosts:
        data = read_parts(root, table, host, skipped, columns)
        if data is None:
            continue
        frame = data.to_pandas(split_blocks=True, self_destruct=True)  # frees Arrow memory as it goes
        del data
        frame.insert(0, "host", host)
        frames.append(frame)
    if not frames:
        return pd.DataFrame({"host": pd.Series([], dtype="category")})
    result = pd.concat(frames, ignore_index=True)
    result["host"] = result["host"].astype("category")
    for column in ("comm", "kind", "syscall", "errno", "signal"):
        if column in result.columns and result[column].dtype == object:
            result[column] = result[column].astype("category")
    # Wall time orders several hosts together; monotonic stamps only compare within one host.
    order = ["time"] if "time" in result.columns else ["host", "ts_ns"] if "ts_ns" in result.columns else []
    if order:
        result = result.sort_values(order, kind="stable", ignore_index=True)
    return result


def load(paths: str | Path | list[str | Path], columns: dict[str, list[str]] | None = None,
         phases: list[str | Path] | None = None) -> Recording:
    """Load one recording directory, or several (several hosts), into DataFrames.

    Part files that cannot be read (truncated, corrupt) are skipped and named in ``skipped``;
    a directory that is not a recording, or one of another schema version, raises FdtraceError.
    ``columns`` reads only some columns of some tables (``{"events": ["time", "pid", ...]}``),
    for recordings too large to hold whole. ``phases`` adds phase files to the phases table:
    what `fdtrace run --phases-out` wrote, or PyTorch profiler (Kineto) traces, which are put on
    the recording's clock (see ``fdtrace.phases.kineto``).
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
            wanted = (columns or {}).get(table)
            tables[table].append(_read_table(root, table, sorted(hosts), skipped, wanted))
    frames = {}
    for table, parts in tables.items():
        frame = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        if "host" in frame.columns:
            frame["host"] = frame["host"].astype("category")
        if len(parts) > 1 and "time" in frame.columns:  # several recordings: one wall-clock timeline
            frame = frame.sort_values("time", kind="stable", ignore_index=True)
        frames[table] = frame
    phases_frame = frames["phases"]
    if len(phases_frame) and "source" not in phases_frame.columns:
        phases_frame["source"] = "shim"  # recorded before other sources of phases existed
    recording = Recording(meta=meta, skipped=skipped, **frames)
    if phases:
        from fdtrace.phases.files import with_phase_files

        recording = with_phase_files(recording, list(phases))
    return recording
