"""One codec per table of a sampling round: records (``fdtrace.schema.records``) to the table's
Arrow rows, and rows back to records. The Parquet sink encodes with them and replay decodes with
them, so a column is mapped to a record's field in one place (tests/unit/test_codecs.py checks
each round trip and that each record has its table's columns)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fdtrace.schema.events import COUNTERS, STATS
from fdtrace.schema.fields import arrow_type
from fdtrace.schema.records import (
    ClockOffsets,
    ClockQuality,
    ProcessSample,
    ProcessTotals,
    SiteRow,
    Stack,
    ThreadCensus,
    ThreadState,
)
from fdtrace.schema.tables import PARTITION_COLUMN, TABLES

R = TypeVar("R")

#: Columns every round table has that no record holds: the host's monotonic and wall time.
TIME_COLUMNS = ("ts_ns", "time")


def wall_times(ts_ns: Sequence[int], realtime_offset_ns: int) -> Any:
    """The ``time`` column of rows taken at ``ts_ns`` (CLOCK_MONOTONIC) on a host whose
    CLOCK_REALTIME was ``realtime_offset_ns`` ahead."""
    import pyarrow as pa

    return pa.array([t + realtime_offset_ns for t in ts_ns], type=pa.int64()).cast(arrow_type("timestamp_utc"))


def declared_rows(table: str, columns: dict[str, list[Any]], realtime_offset_ns: int,
                  with_optional: tuple[str, ...] = ()) -> Any:
    """A declared table's rows, built in its final Arrow types from ``columns`` (every column but
    ``time``, which is computed from ``ts_ns`` where the table has it)."""
    import pyarrow as pa

    declared = TABLES[table].arrow_schema(with_optional)
    index = declared.get_field_index("time")
    if index < 0:  # a table without a wall time (clock, counters)
        return pa.Table.from_pydict({name: columns[name] for name in declared.names}, schema=declared)
    schema = declared.remove(index)
    data = pa.Table.from_pydict({name: columns[name] for name in schema.names}, schema=schema)
    return data.add_column(index, declared.field(index), wall_times(columns["ts_ns"], realtime_offset_ns))


def host_column(host: str, rows: int) -> Any:
    """The partition column of ``rows`` rows of one host, as the events' declared type has it (a
    dictionary of one name)."""
    import numpy as np
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, dtype=np.int32)), pa.array([host], pa.string()))


def without_host(rows: Any) -> Any:
    """Rows as a part file stores them: the host is the folder's name."""
    return rows.drop_columns([PARTITION_COLUMN]) if PARTITION_COLUMN in rows.column_names else rows


def with_host(rows: Any, host: str) -> Any:
    """Rows read from a host's folder with their host column given back (replaced if present)."""
    rows = without_host(rows)
    return rows.append_column(PARTITION_COLUMN, host_column(host, rows.num_rows))


@dataclass(frozen=True)
class RoundCodec(Generic[R]):
    """How one table's rows and one kind of record map onto each other.

    Attributes:
        table: the declared table.
        record: the record type its rows hold (None: rows are plain dicts, as for ``system``).
        to_columns: records of one round to the table's columns (all but ts_ns and time).
        from_row: one row (a dict of its columns, ``time`` as ``time_ns``) back to a record.
    """

    table: str
    record: type | None
    to_columns: Callable[[Sequence[R]], dict[str, list[Any]]]
    from_row: Callable[[dict[str, Any]], R]

    def encode(self, records: Sequence[R], ts_ns: int | Sequence[int], realtime_offset_ns: int,
               with_optional: tuple[str, ...] = ()) -> Any:
        """The rows of ``records``, taken at ``ts_ns`` (one time for all, or one each), as a
        ``pyarrow.Table`` of the declared schema."""
        columns = self.to_columns(records)
        rows = len(next(iter(columns.values()))) if columns else 0
        times = [ts_ns] * rows if isinstance(ts_ns, int) else list(ts_ns)
        return declared_rows(self.table, {"ts_ns": times, **columns}, realtime_offset_ns, with_optional)

    def decode(self, rows: Iterable[dict[str, Any]]) -> list[R]:
        """Records of ``rows`` (columns a recording of an older fdtrace lacks come back as None)."""
        return [self.from_row(row) for row in rows]


def record_columns(record: type) -> tuple[str, ...]:
    """The fields of a record type, in order."""
    return tuple(f.name for f in dataclasses.fields(record))


def _by_field(record: type, skip: tuple[str, ...] = ()) -> Callable[[Sequence[Any]], dict[str, list[Any]]]:
    names = tuple(n for n in record_columns(record) if n not in skip)

    def to_columns(records: Sequence[Any]) -> dict[str, list[Any]]:
        return {name: [getattr(r, name) for r in records] for name in names}
    return to_columns


def _from_fields(record: type) -> Callable[[dict[str, Any]], Any]:
    names = record_columns(record)

    def from_row(row: dict[str, Any]) -> Any:
        return record(**{name: row.get(name) for name in names})
    return from_row


def _census_columns(censuses: Sequence[ThreadCensus]) -> dict[str, list[Any]]:
    flat = [(c, s) for c in censuses for s in c.states]
    return {"pid": [c.pid for c, _ in flat], "comm": [c.comm for c, _ in flat],
            "syscall": [s.syscall for _, s in flat], "fd_kind": [s.fd_kind for _, s in flat],
            "site": [s.site for _, s in flat], "threads": [s.threads for _, s in flat]}


def _census_row(row: dict[str, Any]) -> ThreadCensus:
    """One row as a census of one state; ``census_by_process`` groups a round's rows."""
    return ThreadCensus(row["pid"], row["comm"],
                        [ThreadState(row["syscall"], row.get("fd_kind"), row["threads"], row.get("site"))])


def census_by_process(rows: Iterable[dict[str, Any]]) -> list[tuple[int, ThreadCensus]]:
    """Thread census rows as one census per process and round: (round's time_ns, census)."""
    grouped: dict[tuple[int, int], ThreadCensus] = {}
    for row in rows:
        key = (row["time_ns"], row["pid"])
        one = _census_row(row)
        if key in grouped:
            grouped[key].states.extend(one.states)
        else:
            grouped[key] = one
    return [(when, census) for (when, _), census in grouped.items()]


def _clock_columns(offsets: Sequence[ClockOffsets]) -> dict[str, list[Any]]:
    quality = [o.quality for o in offsets]
    return {"realtime_offset_ns": [o.realtime_offset_ns for o in offsets],
            "boottime_offset_ns": [o.boottime_offset_ns for o in offsets],
            **{name: [getattr(q, name) if q is not None else None for q in quality]
               for name in record_columns(ClockQuality)}}


def _clock_row(row: dict[str, Any]) -> ClockOffsets:
    quality = {name: row.get(name) for name in record_columns(ClockQuality)}
    known = any(value is not None for value in quality.values())
    return ClockOffsets(row["ts_ns"], row["realtime_offset_ns"], row["boottime_offset_ns"],
                        ClockQuality(**quality) if known else None)


def _stack_columns(stacks: Sequence[Stack]) -> dict[str, list[Any]]:
    return {"stack_id": [s.stack_id for s in stacks], "pid": [s.pid for s in stacks],
            "comm": [s.comm for s in stacks], "frames": [list(s.frames) for s in stacks],
            "truncated": [s.truncated for s in stacks]}


def _stack_row(row: dict[str, Any]) -> Stack:
    return Stack(row["stack_id"], row["pid"], row["comm"], tuple(row["frames"]), row.get("truncated"), row["ts_ns"])


def _dict_columns(table: str) -> Callable[[Sequence[dict[str, Any]]], dict[str, list[Any]]]:
    names = tuple(c for c in TABLES[table].columns if c not in TIME_COLUMNS)

    def to_columns(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
        return {name: [row.get(name) for row in rows] for name in names}
    return to_columns


def _dict_row(table: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    names = tuple(c for c in TABLES[table].columns if c not in TIME_COLUMNS)

    def from_row(row: dict[str, Any]) -> dict[str, Any]:
        return {name: row.get(name) for name in names}
    return from_row


def _totals_columns(totals: Sequence[ProcessTotals]) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {"pid": [t.pid for t in totals], "first_ts": [t.first_ts for t in totals],
                                     "exit_ts": [t.exit_ts for t in totals], "comm": [t.comm for t in totals]}
    for name in COUNTERS:
        columns[name] = [t.counts[name] for t in totals]
    columns["errors"] = [[{"syscall": syscall, "errno": errno, "count": n}
                          for (syscall, errno), n in sorted(t.errors.items())] for t in totals]
    return columns


def _totals_row(row: dict[str, Any]) -> ProcessTotals:
    # A counter a recording lacks (written before it was counted) or left null counts nothing.
    return ProcessTotals(row["pid"], row["first_ts"], row["comm"], row.get("exit_ts"),
                         {name: row.get(name) or 0 for name in COUNTERS},
                         {(e["syscall"], e["errno"]): e["count"] for e in row.get("errors") or ()})


def loss_columns(ts_ns: int, totals: dict[str, int], before: dict[str, int]) -> dict[str, list[Any]]:
    """One ``losses`` row at ``ts_ns``: each counter of ``schema.STATS`` lost since ``before`` and
    in all (``NAME_total``), from cumulative counts (``declared_rows`` adds its time)."""
    row: dict[str, list[Any]] = {"ts_ns": [ts_ns]}
    for name in STATS:
        row[name] = [totals.get(name, 0) - before.get(name, 0)]
        row[f"{name}_total"] = [totals.get(name, 0)]
    return row


SAMPLES: RoundCodec[ProcessSample] = RoundCodec("samples", ProcessSample, _by_field(ProcessSample),
                                                _from_fields(ProcessSample))
FD_SITES: RoundCodec[SiteRow] = RoundCodec("fd_sites", SiteRow, _by_field(SiteRow), _from_fields(SiteRow))
THREAD_CENSUS: RoundCodec[ThreadCensus] = RoundCodec("thread_census", ThreadCensus, _census_columns, _census_row)
CLOCK: RoundCodec[ClockOffsets] = RoundCodec("clock", ClockOffsets, _clock_columns, _clock_row)
STACKS: RoundCodec[Stack] = RoundCodec("stacks", Stack, _stack_columns, _stack_row)
SYSTEM: RoundCodec[dict[str, Any]] = RoundCodec("system", None, _dict_columns("system"), _dict_row("system"))
HAPROXY: RoundCodec[dict[str, Any]] = RoundCodec("haproxy", None, _dict_columns("haproxy"), _dict_row("haproxy"))
PROCESS_COUNTERS: RoundCodec[ProcessTotals] = RoundCodec("counters", ProcessTotals, _totals_columns, _totals_row)

#: Every round table's codec, by table name.
CODECS: dict[str, RoundCodec[Any]] = {c.table: c for c in (SAMPLES, FD_SITES, THREAD_CENSUS, CLOCK, STACKS, SYSTEM,
                                                              HAPROXY, PROCESS_COUNTERS)}
