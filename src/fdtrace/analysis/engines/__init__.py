"""Where the analyses run. Each analysis is one SQL query (``fdtrace.analysis.queries``, DuckDB's
dialect) over the same views of a recording's tables, whatever holds the rows:

- ``pandas``: DuckDB over a loaded Recording's DataFrames (``load(...)``, the default);
- ``duckdb``: DuckDB over the Parquet files, out of core, reading only the columns a query needs;
- ``spark``: Apache Spark over the Parquet files, the query transpiled to Spark SQL by sqlglot.

Every view has the declared scalar columns of its table, ``host`` (text), and ``time_ns``
(integer UTC nanoseconds) in place of the ``time`` timestamp, so that no query depends on how
an engine types time. Results come back as pandas DataFrames.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from fdtrace.policy import FD_EXHAUSTION_ERRNOS
from fdtrace.recording.upgrade import RENAMED
from fdtrace.schema import TABLES
from fdtrace.schema.fields import Field

ENGINES = ("pandas", "duckdb", "spark")

#: SQL types (DuckDB's names; sqlglot renames them for Spark) of the declared scalar types.
SQL_TYPES = {"int64": "BIGINT", "int32": "INTEGER", "int16": "SMALLINT", "string": "VARCHAR",
             "dict_string": "VARCHAR", "bool": "BOOLEAN", "timestamp_utc": "BIGINT"}


def view_fields(table: str) -> list[Field]:
    """The declared columns of ``table`` that its view has (lists are left out; ``host`` comes from
    where the rows are)."""
    return [f for f in TABLES[table].fields if f.arrow_type in SQL_TYPES and f.name != "host"]


def quote(value: Any) -> str:
    """A SQL literal of a string or number."""
    if isinstance(value, bool) or value is None:
        raise TypeError(f"no SQL literal for {value!r}")
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def select_list(table: str, present: set[str], time_expr: str, host_expr: str,
                offsets: dict[str, int] | None = None) -> str:
    """The view's columns as a SELECT list: present columns cast to their declared types, absent
    ones NULL, ``time`` as ``time_ns`` (``time_expr``) less each host's clock offset (``offsets``:
    host -> ns its clock is ahead of the reference's)."""
    items = [f"CAST({host_expr} AS VARCHAR) AS host"]
    for spec in view_fields(table):
        sql_type = SQL_TYPES[spec.arrow_type]
        if spec.name == "time":
            shift = ""
            if offsets:
                cases = " ".join(f"WHEN {quote(h)} THEN {int(o)}" for h, o in sorted(offsets.items()) if o)
                shift = f" - CASE CAST({host_expr} AS VARCHAR) {cases} ELSE 0 END" if cases else ""
            items.append(f"CAST({time_expr} AS BIGINT){shift} AS time_ns" if spec.name in present
                         else "CAST(NULL AS BIGINT) AS time_ns")
        elif (table, spec.name) in RENAMED and RENAMED[(table, spec.name)][1] in present:
            old = RENAMED[(table, spec.name)][1]  # parts of older versions have it under its old name
            value = f'coalesce("{spec.name}", "{old}")' if spec.name in present else f'"{old}"'
            items.append(f'CAST({value} AS {sql_type}) AS "{spec.name}"')
        elif spec.name in present:
            items.append(f'CAST("{spec.name}" AS {sql_type}) AS "{spec.name}"')
        else:
            items.append(f'CAST(NULL AS {sql_type}) AS "{spec.name}"')
    return ", ".join(items)


@dataclass
class TableFiles:
    """What an engine reads of one table of a fleet: the part files it reads itself
    (``direct``, with the columns any of them has), and the rows of those that fdtrace's reader
    read instead (``read``: a ``pyarrow.Table`` of the view's columns with ``host`` and ``time``
    as integer ns, or None), because the engine could not take them as they are."""

    direct: list[str] = field(default_factory=list)
    present: set[str] = field(default_factory=set)
    read: Any = None


class PartGoneError(Exception):
    """A part file of the fleet's list went (a recorder merged it): list the parts again."""


def table_files(fleet: Any, table: str, demoted: set[Path] | frozenset[Path] = frozenset(),
                enums: bool = True) -> TableFiles:
    """The part files of ``table`` (``fleet.parts``) an engine reads, and the rows of the others:
    a part whose footer shows it to be sound (``reader.doubts``) is read by the engine from the
    file; any other (or one in ``demoted``: the engine could not read it) is read by fdtrace's
    reader, which checks every value, and what it leaves out is named in the fleet's ``notes``;
    one that cannot be read at all is named in its ``skipped``. The parts read by fdtrace are
    in ``fleet.doubted``. ``enums``: the events' kinds and errnos are checked part by part (an
    engine that checks them over all its direct parts at once passes False). Raises
    PartGoneError when a listed file went meanwhile (only where a host is not read as one steady
    state: ``Fleet.steady``)."""
    import pyarrow as pa

    from fdtrace.recording.reader import doubts, open_part, read_part

    found = TableFiles()
    read = []
    wanted = [f.name for f in view_fields(table)]
    for recording, path in fleet.parts(table):
        try:
            with open_part(path) as part:
                if path not in demoted and not doubts(part, table, recording.version, enums):
                    found.direct.append(str(path))
                    found.present |= set(part.schema.names)
                    fleet.doubted.discard(path)
                    continue
                notes: list[str] = []
                data = read_part(part, table, recording.version, wanted, notes)
        except FileNotFoundError as exc:
            if not fleet.steady(recording):  # listed without the readers' lock: list again
                raise PartGoneError(str(path)) from None
            fleet.damaged.add(path)  # its manifest names it, its recorder cannot have deleted it
            fleet.skip(f"{path}: {' '.join(str(exc).split())[:200]}")
            continue
        except (OSError, ValueError, pa.ArrowException) as exc:  # pyarrow's ArrowInvalid is a ValueError
            fleet.damaged.add(path)
            fleet.skip(f"{path}: {' '.join(str(exc).split())[:200]}")
            continue
        fleet.doubted.add(path)
        fleet.notes += [n for n in notes if n not in fleet.notes]
        columns = {"host": pa.array([recording.host] * data.num_rows, pa.string())}
        for name in data.column_names:
            column = data[name]
            columns[name] = column.cast(pa.int64()) if pa.types.is_timestamp(column.type) else column
        read.append(pa.table(columns))
    if read:
        found.read = pa.concat_tables(read, promote_options="default")
    return found


#: The events of these kinds are few (a process's start, a limit changed, an OOM kill, Go's thread
#: limit), however many events a recording holds: ``rare_events`` has their rows.
RARE_KINDS = ("go_thread_limit", "limit_change", "oom_kill", "process_start")
#: The columns of ``rare_events``: those the analyses of the rare kinds read.
RARE_COLUMNS = ("host", "time_ns", "ts_ns", "pid", "start_ns", "comm", "kind", "syscall", "errno", "ret", "ppid",
                "anon_rss_kb", "limit_target", "limit_resource", "limit_soft", "limit_hard")
def _each(values: tuple[str, ...] | list[str], column: str, select: str) -> str:
    """``select`` over the events with ``column`` equal to each of ``values`` in turn, as one
    relation: an engine reading Parquet skips the row groups whose dictionary lacks the value, which
    it does not do for ``column IN (...)``."""
    return " UNION ALL ".join(f"SELECT {select} FROM events WHERE {column} = {quote(v)}" for v in values)


#: Relations over the events that several analyses read, each small whatever the events' count
#: (``Engine.derived``): the rows of the rare kinds, and the calls that failed with EMFILE or ENFILE
#: counted per process, call and second (``n``, and the first one's time, ``first_ns``).
DERIVED = {
    "rare_events": _each(RARE_KINDS, "kind", ", ".join(RARE_COLUMNS)),
    "fd_failures": "SELECT host, pid, start_ns, comm, kind, syscall, errno, second, count(*) AS n, "
                   "min(time_ns) AS first_ns FROM ("
                   + _each(sorted(FD_EXHAUSTION_ERRNOS), "errno", "host, pid, start_ns, comm, kind, syscall, errno, "
                           "time_ns // 1000000000 AS second, time_ns")
                   + ") AS failed GROUP BY host, pid, start_ns, comm, kind, syscall, errno, second",
}


class Engine(ABC):
    """Runs the analyses' SQL over the views of one recording or fleet."""

    name: str

    def derived(self, name: str) -> str:
        """The relation ``name`` of :data:`DERIVED`, for a query's FROM: the table kept by
        :meth:`keep_derived`, else the query over the events (the same rows either way)."""
        return f"({DERIVED[name]}) AS {name}"

    def keep_derived(self) -> None:
        """Read the :data:`DERIVED` relations from the events once and keep them, so that the
        analyses of the rare kinds that follow read them instead of the events (a command running
        several of them: ``info``). An engine that cannot keep them reads the events each time."""
        return

    @abstractmethod
    def query(self, sql: str, inputs: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
        """The result of ``sql`` (DuckDB's dialect) as a DataFrame; ``inputs`` are small frames
        the query joins with, by name."""

    @abstractmethod
    def columns(self, table: str) -> frozenset[str]:
        """The columns the view of ``table`` has."""

    def rows(self, table: str) -> int:
        """How many rows ``table`` has."""
        return int(self.query(f"SELECT count(*) AS n FROM {table}")["n"].iloc[0])

    @abstractmethod
    def close(self) -> None:
        """Free what the engine holds."""


def empty_frame(columns: list[str]) -> pd.DataFrame:
    """An empty result with these columns."""
    return pd.DataFrame({c: pd.Series([], dtype=object) for c in columns})
