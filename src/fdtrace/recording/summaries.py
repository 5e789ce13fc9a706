"""A small summary in the footer of every events part file: counts by kind, the failures (EMFILE
and ENFILE per process and syscall, each OOM kill and kill by a signal) and the connect() calls
by destination, with their first and last times. `fdtrace info` reads these instead of the
events, so it takes the same time for a fleet of 500 million events as for one of 5 million.

Merges write one (the recorder's `--rotate` and `fdtrace compact`, which also gives one to a
part that has none); a flush writes none, so that the recorder's writer spends its time on the
rows. Times are the
host's own (``time`` as integer UTC ns), before any clock correction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, BinaryIO

from fdtrace.policy import FD_EXHAUSTION_ERRNOS
from fdtrace.schema.failures import incident_mask

SUMMARY_KEY = b"fdtrace.summary"
VERSION = 1
#: The columns of each list of a summary.
KIND_COLUMNS = ["kind", "n", "first", "last"]
FAILED_COLUMNS = ["pid", "comm", "kind", "errno", "syscall", "signal", "anon_rss_kb", "at", "n", "first"]
CONNECT_COLUMNS = ["comm", "pid", "peer_addr", "peer_port", "errno", "n", "first", "last"]
_SUMMED = {"n"}
_FIRST = {"first"}
_LAST = {"last"}


def _rows(table: Any, keys: list[str], first: bool = True, last: bool = True) -> list[list[Any]]:
    """Group ``table`` by ``keys``: count, min and max of ``time_ns``, as lists."""
    aggregations = [("time_ns", "count")] + ([("time_ns", "min")] if first else []) + \
        ([("time_ns", "max")] if last else [])
    grouped = table.group_by(keys, use_threads=False).aggregate(aggregations)
    columns = [grouped[k].to_pylist() for k in keys] + [grouped["time_ns_count"].to_pylist()]
    columns += [grouped["time_ns_min"].to_pylist()] if first else []
    columns += [grouped["time_ns_max"].to_pylist()] if last else []
    return [list(row) for row in zip(*columns, strict=True)]


def _matches(column: Any, values: list[str]) -> Any:
    """A mask of the rows of a (dictionary) string column whose value is one of ``values``,
    found on the dictionary's indices: no string of the part is copied."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        masks = []
        for chunk in chunks:
            wanted = [i for i, v in enumerate(chunk.dictionary.to_pylist()) if v in values]
            masks.append(pc.fill_null(pc.is_in(chunk.indices, value_set=pa.array(wanted, chunk.indices.type)), False))
        return pa.chunked_array(masks, pa.bool_())
    return pc.fill_null(pc.is_in(column, value_set=pa.array(values, pa.string())), False)


def summarize(events: Any) -> dict[str, Any]:
    """The summary of one part's events (a ``pyarrow.Table`` of the events table)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def text(table: Any, name: str) -> Any:
        column = table[name] if name in table.column_names else pa.nulls(table.num_rows, pa.string())
        return column.cast(pa.string())

    def number(table: Any, name: str, kind: Any) -> Any:
        return table[name].cast(kind) if name in table.column_names else pa.nulls(table.num_rows, kind)

    def rows_of(table: Any) -> Any:
        return pa.table({"kind": text(table, "kind"), "errno": pc.fill_null(text(table, "errno"), ""),
                         "syscall": text(table, "syscall"), "comm": text(table, "comm"),
                         "signal": text(table, "signal"), "pid": number(table, "pid", pa.int64()),
                         "anon_rss_kb": number(table, "anon_rss_kb", pa.int64()),
                         "peer_addr": text(table, "peer_addr"), "peer_port": number(table, "peer_port", pa.int64()),
                         "time_ns": table["time"].cast(pa.int64())})

    kinds = pa.table({"kind": events["kind"], "time_ns": events["time"].cast(pa.int64())}).unify_dictionaries()
    fd_errnos = sorted(FD_EXHAUSTION_ERRNOS)
    ends = _matches(events["kind"], ["oom_kill", "process_exit", "go_thread_limit"])
    failing = pc.or_(_matches(events["errno"], fd_errnos), ends)
    failed = rows_of(events.filter(failing))  # few rows: these are copied as text
    # the incidents and the ends on request, listed apart (schema.failures: the one rule; these rows
    # have no exit code, so no non-zero exit is among them)
    failed = failed.filter(incident_mask(failed, exits=True))
    failed = failed.append_column("at", pc.if_else(pc.is_in(failed["errno"], value_set=pa.array(fd_errnos)),
                                                   pa.scalar(None, pa.int64()), failed["time_ns"]))
    connects = events.filter(_matches(events["kind"], ["connect"]))
    connects = rows_of(connects.filter(pc.is_valid(connects["peer_port"]))) if "peer_port" in events.column_names \
        else rows_of(connects.slice(0, 0))
    return {"version": VERSION,
            "kinds": [[str(k), *rest] for k, *rest in _rows(kinds, ["kind"])],
            "failed": _rows(failed, FAILED_COLUMNS[:8], last=False),
            "connects": _rows(connects, CONNECT_COLUMNS[:5])}


def merge(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary of several parts' summaries."""
    merged: dict[str, Any] = {"version": VERSION}
    for name, columns in (("kinds", KIND_COLUMNS), ("failed", FAILED_COLUMNS), ("connects", CONNECT_COLUMNS)):
        keys = [c for c in columns if c not in _SUMMED | _FIRST | _LAST]
        combined: dict[tuple[Any, ...], list[Any]] = {}
        for summary in summaries:
            for row in summary[name]:
                values = dict(zip(columns, row, strict=True))
                key = tuple(values[k] for k in keys)
                if key not in combined:
                    combined[key] = row[:]
                    continue
                kept = dict(zip(columns, combined[key], strict=True))
                kept["n"] += values["n"]
                for column, pick in (("first", min), ("last", max)):
                    if column in kept:
                        kept[column] = pick(kept[column], values[column])
                combined[key] = [kept[c] for c in columns]
        merged[name] = list(combined.values())
    return merged


def merge_frames(frames: dict[str, Any]) -> dict[str, Any]:
    """The summaries of many parts (frames with ``host`` and a list's columns) merged per host:
    counts summed, first and last times the earliest and latest."""
    merged = {}
    for name, columns in (("kinds", KIND_COLUMNS), ("failed", FAILED_COLUMNS), ("connects", CONNECT_COLUMNS)):
        frame = frames[name]
        keys = ["host", *[c for c in columns if c not in _SUMMED | _FIRST | _LAST]]
        aggregations = {"n": "sum", **({"first": "min"} if "first" in columns else {}),
                        **({"last": "max"} if "last" in columns else {})}
        merged[name] = frame.groupby(keys, dropna=False, sort=False).agg(aggregations).reset_index() \
            if len(frame) else frame
    return merged


def encode(summary: dict[str, Any]) -> bytes:
    """The summary as footer metadata."""
    return json.dumps(summary, separators=(",", ":")).encode()


def without_summary(schema: Any) -> Any:
    """A schema without a summary in its metadata (a merged file gets its own at the end)."""
    kept = {k: v for k, v in (schema.metadata or {}).items() if k != SUMMARY_KEY}
    return schema.with_metadata(kept)


#: A summary larger than this is not read (a part's is a few KiB; a fleet's merged ones a few MiB).
MAX_SUMMARY_BYTES = 16 << 20
#: The type of each column of a summary's lists (None allowed where a value may be missing).
_TYPES: dict[str, type] = {"kind": str, "n": int, "first": int, "last": int, "pid": int, "comm": str, "errno": str,
                           "syscall": str,
          "signal": str, "anon_rss_kb": int, "at": int, "peer_addr": str, "peer_port": int}
#: The columns of each list that always have a value.
_REQUIRED = {"kinds": set(KIND_COLUMNS), "failed": {"pid", "kind", "errno", "n", "first"},
             "connects": {"pid", "errno", "n", "first", "last"}}
_LISTS = (("kinds", KIND_COLUMNS), ("failed", FAILED_COLUMNS), ("connects", CONNECT_COLUMNS))


def _row_problem(name: str, columns: list[str], row: Any) -> str:
    if not isinstance(row, list) or len(row) != len(columns):
        return f"a row of {name} is not a list of {len(columns)} values"
    for column, value in zip(columns, row, strict=True):
        if value is None and column not in _REQUIRED[name]:
            continue
        wanted = _TYPES[column]
        if isinstance(value, bool) or not isinstance(value, wanted):
            return f"the {column} of a row of {name} is {type(value).__name__}, not {wanted.__name__}"
        if column == "n" and isinstance(value, int) and value < 1:
            return f"a row of {name} counts {value} events"
    values = dict(zip(columns, row, strict=True))
    if "last" in values and values["last"] < values["first"]:
        return f"a row of {name} has its last time before its first"
    return ""


def summary_problem(summary: Any) -> str:
    """Why ``summary`` is not a summary this fdtrace reads ("" when it is one): its shape, the
    number and type of every value."""
    if not isinstance(summary, dict) or summary.get("version") != VERSION:
        return "not a version 1 summary"
    for name, columns in _LISTS:
        rows = summary.get(name)
        if not isinstance(rows, list):
            return f"it has no list of {name}"
        for row in rows:
            problem = _row_problem(name, columns, row)
            if problem:
                return problem
    kinds = [row[0] for row in summary["kinds"]]
    if len(set(kinds)) != len(kinds):
        return "it counts a kind twice"
    return ""


def disagreement(summary: dict[str, Any], rows: int, times: tuple[int, int] | None) -> str:
    """Where a well-formed summary disagrees with what its part's footer says ("" when it does
    not): the rows it counts, the times against the part's own lowest and highest time
    (``times``, when the footer has them), and the failures it lists against the kinds it counts
    (every fd_error event is an EMFILE or ENFILE; every OOM kill and Go thread limit is listed)."""
    kinds = {row[0]: row[1] for row in summary["kinds"]}
    counted = sum(kinds.values())
    if counted != rows:
        return f"it counts {counted:,} events, its part holds {rows:,}"
    if times is not None:
        low, high = times
        stamps = [t for row in summary["kinds"] for t in row[2:4]]
        stamps += [t for row in summary["failed"] for t in (row[7], row[9]) if t is not None]
        stamps += [t for row in summary["connects"] for t in row[6:8]]
        outside = [t for t in stamps if not low <= t <= high]
        if outside:
            return f"it names a time ({outside[0]}) outside its part's ({low} to {high})"
    listed: dict[str, int] = {}
    for row in summary["failed"]:
        kind = row[2]
        if kind not in kinds:
            return f"it lists a failure of kind {str(kind)[:40]!r}, which it does not count"
        listed[kind] = listed.get(kind, 0) + row[8]
        if row[3] not in FD_EXHAUSTION_ERRNOS and kind not in ("oom_kill", "go_thread_limit", "process_exit"):
            return f"it lists a {str(kind)[:40]} failing with {str(row[3])[:40]!r} as a failure"
    for kind in ("fd_error", "oom_kill", "go_thread_limit"):
        if listed.get(kind, 0) != kinds.get(kind, 0):
            return (f"it counts {kinds.get(kind, 0):,} {kind} event{'s' if kinds.get(kind, 0) != 1 else ''} but lists "
                    f"{listed.get(kind, 0):,} among the failures")
    for kind, n in listed.items():
        if n > kinds[kind]:
            return f"it lists {n:,} failures of {kinds[kind]:,} {kind} events"
    connects = sum(row[5] for row in summary["connects"])
    if connects > kinds.get("connect", 0):
        return f"it lists {connects:,} connect() calls of {kinds.get('connect', 0):,}"
    return ""


def summary_of(part: Any) -> tuple[dict[str, Any] | None, str]:
    """The summary in an opened part's footer (``fdtrace.recording.reader.Part``) and, when it
    has one that cannot be believed, why: (None, "") when it has none, (None, why) when it is
    not one this fdtrace reads or disagrees with the part's own footer (its rows, its times)."""
    from fdtrace.recording.reader import TIME_LIMIT, loads_bounded

    raw = part.key_value(SUMMARY_KEY)
    if raw is None:
        return None, ""
    if len(raw) > MAX_SUMMARY_BYTES:
        return None, f"{len(raw):,} bytes, more than fdtrace reads"
    try:
        summary = loads_bounded(raw)
    except ValueError as exc:
        return None, f"unreadable: {' '.join(str(exc).split())[:120]}"
    problem = summary_problem(summary)
    if problem:
        return None, problem
    stats = part.statistics("time")
    times = None
    if stats and all(low is not None for _, low, _, _ in stats):
        times = (min(int(low) for _, low, _, _ in stats), max(int(high) for _, _, high, _ in stats))
        if not 0 <= times[0] <= times[1] < TIME_LIMIT:  # the reader leaves such rows out: its counts would not be
            return None, "its part holds impossible times"
    problem = disagreement(summary, part.rows, times)
    return (None, problem) if problem else (summary, "")


def read_summary(path: Path | BinaryIO) -> dict[str, Any] | None:
    """The summary in a part file's footer (None: it has none, or not one this fdtrace reads,
    or one that disagrees with its part's footer); ``path`` may be an open file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fdtrace.recording.reader import Part

    try:
        if isinstance(path, Path):
            from fdtrace.recording.reader import open_part

            with open_part(path) as part:
                return summary_of(part)[0]
        parquet = pq.ParquetFile(path)
        part = Part(Path("?"), path, parquet, int(parquet.metadata.num_rows))
        return summary_of(part)[0]
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None
