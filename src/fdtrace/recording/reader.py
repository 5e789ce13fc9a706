"""Reading recordings back: metadata, part files upgraded to the current tables, and ``load()``
into pandas."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fdtrace.errors import FdtraceError
from fdtrace.recording.layout import TABLES, host_dir, part_files
from fdtrace.recording.upgrade import stored_names, upgrade
from fdtrace.safe_files import is_regular, read_regular
from fdtrace.schema import META_FIELDS, SCHEMA_VERSION, VERSIONS
from fdtrace.schema import TABLES as TABLES_DECLARED


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
        stacks: user stacks of failures, descriptors and thread creations (--stacks).
        fd_sites: open descriptors per process and call site, when they changed (--stacks).
        thread_census: threads of the processes nearest a thread limit, by blocking syscall.
        connections: TCP connections becoming established, for clock offsets between hosts.
        clock_offsets: each host's clock offset from a reference host's (``fdtrace.analysis.load``
            estimates them; ``time`` columns are then corrected by them).
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
    stacks: Any = None
    fd_sites: Any = None
    thread_census: Any = None
    connections: Any = None
    clock_offsets: Any = None
    clock_corrected: bool = False
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


#: A metadata file is read up to this size.
MAX_META_BYTES = 4 << 20


def _meta_problem(path: Path, host: str) -> tuple[dict[str, Any] | None, str]:
    """One metadata file: (its content, "") or (None, why it cannot be used)."""
    try:
        meta = json.loads(read_regular(path, MAX_META_BYTES))
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return None, f"{path}: unreadable recording metadata ({' '.join(reason.split())[:200]})"
    if not isinstance(meta, dict):
        return None, f"{path}: unreadable recording metadata (not a JSON object)"
    version = meta.get("schema_version")
    if not isinstance(version, int) or version not in VERSIONS:
        return None, (f"{path}: recording schema version {version!r:.40}, "
                      f"this fdtrace reads versions 1 to {SCHEMA_VERSION}")
    if meta.get("host") != host:
        return None, f"{path}: its host is {meta.get('host')!r:.80}, not {host!r} as its name says"
    wrong = sorted(name for name, types in META_FIELDS.items() if name in meta and (
        not isinstance(meta[name], types) or (isinstance(meta[name], bool) and bool not in types)))
    for name in wrong:
        del meta[name]
    return meta, f"{path}: ignored fields of the wrong type: {', '.join(wrong)}" if wrong else ""


def read_meta(root: Path, skipped: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Metadata of every host in a recording directory. A host whose metadata cannot be used is
    left out and named in ``skipped`` (when given); raises FdtraceError when no host can be
    read (with the first reason), or when it is not a recording."""
    if not root.is_dir():
        raise FdtraceError(f"{root}: no such recording directory")
    files = sorted((root / "meta").glob("host=*.json"))
    if not files:
        raise FdtraceError(f"{root}: not an fdtrace recording (no meta/host=*.json)")
    metas = {}
    problems = []
    for path in files:
        host = path.name.removeprefix("host=").removesuffix(".json")
        meta, problem = _meta_problem(path, host)
        if problem:
            problems.append(problem)
        if meta is not None:
            metas[host] = meta
        elif skipped is None:
            raise FdtraceError(problem)
    if not metas:
        raise FdtraceError(problems[0])
    if skipped is not None:
        skipped.extend(problems)
    return metas


def read_parts(root: Path, table: str, host: str, skipped: list[str], columns: list[str] | None = None,
               version: int = SCHEMA_VERSION) -> Any:
    """One host's part files of ``table`` as one ``pyarrow.Table`` of the current declaration of
    that table (None when there are none), whatever version wrote them: the one upgrade step.
    Unreadable parts are named in ``skipped``. ``columns``: only these; ``version``: the schema
    version its metadata gives."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = []
    for path in part_files(host_dir(root, table, host)):
        if not is_regular(path):
            skipped.append(f"{path}: not a regular file")
            continue
        try:
            present = set(pq.read_schema(path).names)
            wanted = None if columns is None else [c for c in stored_names(table, columns, version) if c in present]
            parts.append(upgrade(table, pq.read_table(path, columns=wanted), version, columns))
        except (OSError, pa.ArrowException, ValueError) as exc:
            skipped.append(f"{path}: {' '.join(str(exc).split())[:200]}")
    return pa.concat_tables(parts, promote_options="default") if parts else None


def read_table(root: Path, table: str, hosts: dict[str, int], skipped: list[str],
               columns: list[str] | None = None) -> Any:
    """One table of some hosts of a recording as a DataFrame (``host`` categorical, in time
    order), upgraded to the current declaration; unreadable parts are named in ``skipped``."""
    import pandas as pd
    import pyarrow as pa

    frames = []
    for host, version in sorted(hosts.items()):
        data = read_parts(root, table, host, skipped, columns, version)
        if data is None:
            continue
        # 64-bit stack ids do not survive float64 (pandas' type for an int column with nulls)
        ids = data["stack_id"].to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get) \
            if "stack_id" in data.column_names else None
        frame = data.to_pandas(split_blocks=True, self_destruct=True)  # frees Arrow memory as it goes
        del data
        if ids is not None:
            frame["stack_id"] = ids.values
        frame.insert(0, "host", host)
        frames.append(frame)
    if not frames:  # no rows: still the declared columns, so an empty recording reports as empty
        schema = TABLES_DECLARED[table].arrow_schema(with_optional=())
        empty = schema.empty_table().to_pandas()
        if "host" not in empty.columns:
            empty.insert(0, "host", pd.Series([], dtype="category"))
        if columns is not None:
            empty = empty[[c for c in empty.columns if c in columns or c == "host"]]
        return empty
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
    the recording's clock (see ``fdtrace.integrations.phases.kineto``).
    """
    import pandas as pd

    roots = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
    meta: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    tables: dict[str, list[Any]] = {t: [] for t in TABLES}
    for root in roots:
        hosts = read_meta(root, skipped)
        meta.update(hosts)
        for table in TABLES:
            wanted = (columns or {}).get(table)
            versions = {host: meta.get("schema_version", SCHEMA_VERSION) for host, meta in hosts.items()}
            tables[table].append(read_table(root, table, versions, skipped, wanted))
    frames = {}
    for table, parts in tables.items():
        frame = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        if "host" in frame.columns:
            frame["host"] = frame["host"].astype("category")
        if len(parts) > 1 and "time" in frame.columns:  # several recordings: one wall-clock timeline
            frame = frame.sort_values("time", kind="stable", ignore_index=True)
        frames[table] = frame
    recording = Recording(meta=meta, skipped=skipped, **frames)
    if phases:
        from fdtrace.integrations.phases.files import with_phase_files

        recording = with_phase_files(recording, list(phases))
    return recording
