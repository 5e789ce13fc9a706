"""DuckDB: over a loaded Recording's DataFrames (engine ``pandas``) or, out of core, over a
fleet's Parquet files (engine ``duckdb``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from fdtrace.analysis.engines import Engine, quote, select_list, view_fields
from fdtrace.errors import FdtraceError
from fdtrace.recording.fleet import Fleet
from fdtrace.schema import TABLES

#: Where DuckDB's regular expression finds a part file's host in its path.
HOST_OF_PATH = r"host=([^/]+)/[^/]+$"


def _connect(memory_limit: str | None, threads: int | None) -> tuple[Any, Path]:
    import duckdb

    # Spilled data goes to a fresh private folder, never to a name another user could plant.
    spill = Path(tempfile.mkdtemp(prefix="fdtrace-duckdb-"))
    config: dict[str, Any] = {"temp_directory": str(spill), "enable_external_access": True}
    if memory_limit:
        config["memory_limit"] = memory_limit
    if threads:
        config["threads"] = threads
    return duckdb.connect(":memory:", config=config), spill


def _is_scalar(column: pd.Series) -> bool:
    return bool(pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column)
                or pd.api.types.is_string_dtype(column) or isinstance(column.dtype, pd.CategoricalDtype))


class DuckDBEngine(Engine):
    """DuckDB in this process. Use :meth:`over_frames` or :meth:`over_fleet`."""

    name = "duckdb"

    def __init__(self, connection: Any, spill: Path, columns: dict[str, frozenset[str]]) -> None:
        self._connection = connection
        self._spill = spill
        self._columns = columns

    @classmethod
    def over_frames(cls, frames: dict[str, pd.DataFrame], memory_limit: str | None = None) -> DuckDBEngine:
        """Views over DataFrames (a Recording's tables, or any frame with some of their columns)."""
        connection, spill = _connect(memory_limit, None)
        columns: dict[str, frozenset[str]] = {}
        for table in TABLES:
            frame = frames.get(table, pd.DataFrame())
            source = f"_frame_{table}"
            declared = {f.name for f in view_fields(table)}
            # Columns of the frame's own (``rank`` of aligned events) come along when scalar.
            wanted = [c for c in frame.columns if isinstance(c, str) and c != "host" and (
                c in declared or (c not in TABLES[table].columns and _is_scalar(frame[c])))]
            view = frame[["host", *wanted] if "host" in frame.columns else wanted]
            if "time" in view.columns:  # as integers: DuckDB would read pandas' ns timestamps as µs
                stamps = pd.to_datetime(view["time"], utc=True).dt.as_unit("ns")
                view = view.assign(time=stamps.dt.tz_localize(None).to_numpy().view("int64"))
            if view.columns.empty:
                connection.execute(f"CREATE VIEW {table} AS SELECT {select_list(table, set(), 'NULL', 'NULL')} "
                                   "FROM (SELECT 1) AS nothing WHERE false")
                columns[table] = frozenset()
                continue
            connection.register(source, view)
            present = set(view.columns)
            host = "host" if "host" in present else "NULL"
            listing = select_list(table, present, '"time"', host)
            extra = [c for c in wanted if c not in declared]
            listing += "".join(f', "{c}"' for c in extra)
            connection.execute(f"CREATE VIEW {table} AS SELECT {listing} FROM {source}")
            columns[table] = frozenset(present | {"host", "time_ns"})
        engine = cls(connection, spill, columns)
        engine.name = "pandas"
        return engine

    @classmethod
    def over_fleet(cls, fleet: Fleet, memory_limit: str | None = None, threads: int | None = None,
                   offsets: dict[str, int] | None = None) -> DuckDBEngine:
        """Views over every readable part file of the fleet. Files whose footer cannot be read
        (truncated, not Parquet) are left out and named in ``fleet.skipped``."""
        import pyarrow.parquet as pq

        connection, spill = _connect(memory_limit, threads)
        columns = {}
        for table in TABLES:
            files, present = [], set()
            for _, path in fleet.parts(table):
                try:
                    present |= set(pq.read_schema(path).names)
                except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
                    fleet.skipped.append(f"{path}: {' '.join(str(exc).split())[:200]}")
                    continue
                files.append(str(path))
            if files:
                listing = select_list(table, present, 'epoch_ns("time")',
                                      f"regexp_extract(filename, {quote(HOST_OF_PATH)}, 1)", offsets)
                source = (f"read_parquet([{', '.join(quote(f) for f in files)}], union_by_name=true, "
                          "filename=true, hive_partitioning=false)")
            else:
                listing = select_list(table, set(), "NULL", "NULL")
                source = "(SELECT 1) AS nothing WHERE false"
            connection.execute(f"CREATE VIEW {table} AS SELECT {listing} FROM {source}")
            columns[table] = frozenset({f.name for f in view_fields(table)} | {"host", "time_ns"})  # absent: NULL
        return cls(connection, spill, columns)

    def query(self, sql: str, inputs: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
        import duckdb

        for name, frame in (inputs or {}).items():
            self._connection.register(name, frame)
        try:
            return self._connection.execute(sql).df()
        except (duckdb.IOException, duckdb.InvalidInputException) as exc:
            raise FdtraceError(f"a recording file could not be read: {' '.join(str(exc).split())[:300]}") from None
        finally:
            for name in inputs or {}:
                self._connection.unregister(name)

    def columns(self, table: str) -> frozenset[str]:
        return self._columns[table]

    def close(self) -> None:
        self._connection.close()
        shutil.rmtree(self._spill, ignore_errors=True)
