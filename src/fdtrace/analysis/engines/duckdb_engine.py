"""DuckDB: over a loaded Recording's DataFrames (engine ``pandas``) or, out of core, over a
fleet's Parquet files (engine ``duckdb``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from fdtrace.analysis.engines import Engine, quote, readable_parts, select_list, view_fields
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
    try:
        return duckdb.connect(":memory:", config=config), spill
    except duckdb.Error as exc:
        shutil.rmtree(spill, ignore_errors=True)
        raise FdtraceError(f"DuckDB refused its settings: {' '.join(str(exc).split())[:200]}") from None


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
        self._fleet: Fleet | None = None
        self._offsets: dict[str, int] | None = None

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
        connection, spill = _connect(memory_limit, threads)
        engine = cls(connection, spill, {})
        engine._fleet, engine._offsets = fleet, offsets
        engine._views()
        return engine

    def _views(self) -> None:
        """(Re)create the views over the fleet's readable parts."""
        fleet, offsets, connection = self._fleet, self._offsets, self._connection
        assert fleet is not None
        columns = {}
        for table in TABLES:
            files, present = readable_parts(fleet, table)
            if files:
                listing = select_list(table, present, 'epoch_ns("time")',
                                      f"regexp_extract(filename, {quote(HOST_OF_PATH)}, 1)", offsets)
                source = (f"read_parquet([{', '.join(quote(f) for f in files)}], union_by_name=true, "
                          "filename=true, hive_partitioning=false)")
            else:
                listing = select_list(table, set(), "NULL", "NULL")
                source = "(SELECT 1) AS nothing WHERE false"
            connection.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT {listing} FROM {source}")
            columns[table] = frozenset({f.name for f in view_fields(table)} | {"host", "time_ns"})  # absent: NULL
        self._columns = columns

    def _leave_out_damaged(self) -> bool:
        """After a read failed: find the part files whose data (not only their footer) cannot be
        read, name them in the fleet's ``skipped``, and build the views without them. Whether
        there were any."""
        import pyarrow.parquet as pq

        if self._fleet is None:
            return False
        found = False
        for table in TABLES:
            for _, path in self._fleet.parts(table):
                try:
                    pq.ParquetFile(path).read()
                except (OSError, ValueError) as exc:  # ArrowInvalid and ArrowIOError among them
                    self._fleet.damaged.add(path)
                    self._fleet.skipped.append(f"{path}: {' '.join(str(exc).split())[:200]}")
                    found = True
        if found:
            self._views()
        return found

    def query(self, sql: str, inputs: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
        import duckdb

        for name, frame in (inputs or {}).items():
            self._connection.register(name, frame)
        try:
            try:
                return self._connection.execute(sql).df()
            except (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException):
                raise  # a wrong query, not a wrong file
            except duckdb.Error:
                # A part whose footer reads but whose pages do not (damaged on disk or in a copy):
                # left out, named, and the query run again over the rest.
                if not self._leave_out_damaged():
                    raise
                return self._connection.execute(sql).df()
        except duckdb.Error as exc:
            raise FdtraceError(f"a recording could not be read: {' '.join(str(exc).split())[:300]}") from None
        finally:
            for name in inputs or {}:
                self._connection.unregister(name)

    def columns(self, table: str) -> frozenset[str]:
        return self._columns[table]

    def close(self) -> None:
        self._connection.close()
        shutil.rmtree(self._spill, ignore_errors=True)
