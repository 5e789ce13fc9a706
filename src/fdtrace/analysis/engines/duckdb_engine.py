"""DuckDB: over a loaded Recording's DataFrames (engine ``pandas``) or, out of core, over a
fleet's Parquet files (engine ``duckdb``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from fdtrace.analysis.engines import (
    DERIVED,
    Engine,
    PartGoneError,
    TableFiles,
    quote,
    select_list,
    table_files,
    view_fields,
)
from fdtrace.errors import FdtraceError
from fdtrace.recording.fleet import Fleet
from fdtrace.schema import TABLES

#: Where DuckDB's regular expression finds a part file's host in its path.
HOST_OF_PATH = r"host=([^/]+)/[^/]+$"
#: How many times the views are made again after a file went or could not be read, at most.
RETRIES = 8


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
        self._files: dict[str, TableFiles] = {}  # per table, from the fleet's current part lists
        self._demoted: set[Path] = set()  # files DuckDB failed on: fdtrace's reader reads them
        self._kept: set[str] = set()  # the DERIVED relations kept (keep_derived)

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
    def over_fleet(cls, fleet: Fleet, memory_limit: str | None = None, threads: int | None = None) -> DuckDBEngine:
        """Views over every readable part file of the fleet, each host on its own clock
        (``shift_clocks`` puts them on one): those whose footer shows them sound are read by DuckDB
        from the files, the others by fdtrace's reader (``table_files``); files that cannot be
        read at all are left out and named in ``fleet.skipped``."""
        connection, spill = _connect(memory_limit, threads)
        # Each query of a command reads the same files: their footers are read once, not once a query.
        connection.execute("LOAD parquet")
        connection.execute("SET parquet_metadata_cache = true")
        engine = cls(connection, spill, {})
        engine._fleet = fleet
        try:
            engine._views()
        except BaseException:
            engine.close()
            raise
        return engine

    def shift_clocks(self, offsets: dict[str, int]) -> None:
        """Put each host's times on the reference clock (``offsets``: host -> ns its clock is ahead
        of the reference's): the views are made again with the shifts, over the same files."""
        self._offsets = offsets or None
        self._views()

    def _views(self) -> None:
        """(Re)create the views over the fleet's parts; when a file went (a recorder merged it),
        the parts are listed again; when DuckDB cannot take a file, fdtrace's reader reads it."""
        import duckdb

        self._kept.clear()  # read from the views as they were: read again from the new ones
        gone = 0
        while gone < RETRIES:
            try:
                self._create_views()
                return
            except PartGoneError:
                gone += 1
                self._refreshed()
            except duckdb.Error as exc:
                recovered = self._recover(exc, probe="DESCRIBE SELECT * FROM read_parquet({file})")
                if not recovered:
                    raise FdtraceError(f"a recording could not be read: {' '.join(str(exc).split())[:300]}") \
                        from None
                gone += recovered == "gone"
        raise FdtraceError("a recording could not be read: its part files kept changing while it was read")

    def _create_views(self) -> None:
        fleet, offsets, connection = self._fleet, self._offsets, self._connection
        assert fleet is not None
        columns = {}
        for table in TABLES:
            if table not in self._files:
                self._files[table] = table_files(fleet, table, self._demoted, enums=table != "events")
                if table == "events" and self._unknown_enums(self._files[table]):
                    self._files[table] = table_files(fleet, table, self._demoted, enums=False)
            files = self._files[table]
            sources = []
            if files.direct:
                listing = select_list(table, files.present, 'epoch_ns("time")',
                                      f"regexp_extract(filename, {quote(HOST_OF_PATH)}, 1)", offsets)
                sources.append(f"SELECT {listing} FROM read_parquet([{', '.join(quote(f) for f in files.direct)}], "
                               "union_by_name=true, filename=true, hive_partitioning=false)")
            if files.read is not None:
                connection.register(f"_read_{table}", files.read)
                listing = select_list(table, set(files.read.column_names), '"time"', '"host"', offsets)
                sources.append(f"SELECT {listing} FROM _read_{table}")
            if not sources:
                sources.append(f"SELECT {select_list(table, set(), 'NULL', 'NULL')} FROM (SELECT 1) AS nothing "
                               "WHERE false")
            connection.execute(f"CREATE OR REPLACE VIEW {table} AS {' UNION ALL '.join(sources)}")
            columns[table] = frozenset({f.name for f in view_fields(table)} | {"host", "time_ns"})  # absent: NULL
        self._columns = columns

    def _unknown_enums(self, files: TableFiles) -> bool:
        """Whether the events' parts DuckDB reads must be looked at one by one for a kind or errno
        fdtrace does not know: one DISTINCT over all of them says (reading each part's values in
        Python took seconds for a fleet). When one holds such values, or the DISTINCT cannot read
        one, the parts are looked at one by one (``unknown_enums``, which also names a part whose
        values cannot be read), and those found are left to fdtrace's reader (``_demoted``)."""
        import duckdb

        from fdtrace.recording.reader import known_enum, open_part, unknown_enums

        present = [name for name in ("kind", "errno") if name in files.present]
        if not files.direct or not present:
            return False
        listing = ", ".join(quote(f) for f in files.direct)
        for name in present:
            try:
                values = self._connection.sql(f'SELECT DISTINCT CAST("{name}" AS VARCHAR) FROM '
                                              f"read_parquet([{listing}], union_by_name=true)").fetchall()
                if all(known_enum(name, value) for (value,) in values):
                    continue
            except duckdb.Error:  # a part whose pages do not read: found below, as one fdtrace cannot read
                pass
            for path in map(Path, files.direct):
                try:
                    with open_part(path) as part:
                        unknown = bool(unknown_enums(part))
                except OSError:  # gone or unreadable now: fdtrace's reader says which
                    unknown = True
                if unknown:
                    self._demoted.add(path)
            return True
        return False

    def _refreshed(self) -> None:
        """List the fleet's parts again (a recorder merged some away)."""
        assert self._fleet is not None
        self._fleet.refresh()
        self._files.clear()

    def _recover(self, exc: Exception, probe: str) -> str:
        """After DuckDB failed on the files: whether the views can be made again without what
        failed. A listed file that went means the parts are listed again; a file DuckDB cannot
        read (named in its error, or found by running ``probe`` over each file alone) is read by
        fdtrace's reader instead, which names it when it cannot read it either. Returns "gone",
        "demoted" or "" (nothing to recover: the error is not a file's)."""
        import duckdb

        direct = [Path(f) for files in self._files.values() for f in files.direct]
        if any(not path.exists() for path in direct):
            self._refreshed()
            return "gone"
        message = str(exc)
        named = [path for path in direct if str(path) in message]
        if not named:
            for path in direct:
                try:
                    for _ in self._connection.sql(probe.format(file=quote(str(path)))).to_arrow_reader():
                        pass
                except (duckdb.Error, OSError):  # through Arrow's reader, DuckDB's error comes as an OSError
                    named.append(path)
        if not named:
            return ""
        self._demoted |= set(named)
        for table, files in list(self._files.items()):
            if any(str(path) in files.direct for path in named):
                del self._files[table]
        return "demoted"

    def derived(self, name: str) -> str:
        return f"_kept_{name} AS {name}" if name in self._kept else super().derived(name)

    def keep_derived(self) -> None:
        for name, sql in DERIVED.items():
            if name not in self._kept:
                self._connection.register(f"_kept_{name}", self._fetch(sql, None, arrow=True))
                self._kept.add(name)

    def query(self, sql: str, inputs: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
        frame: pd.DataFrame = self._fetch(sql, inputs)
        return frame

    def _fetch(self, sql: str, inputs: dict[str, pd.DataFrame] | None, arrow: bool = False) -> Any:
        """The result of ``sql`` as a DataFrame (or an Arrow table: ``arrow``), the views made again
        and the query run again after a file went or could not be read."""
        import duckdb

        for name, frame in (inputs or {}).items():
            self._connection.register(name, frame)
        try:
            gone = 0
            while True:
                try:
                    if arrow:
                        return self._connection.sql(sql).to_arrow_table()
                    return self._connection.execute(sql).df()
                except (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException):
                    raise  # a wrong query, not a wrong file
                except duckdb.Error as exc:
                    # A part whose footer reads but whose pages do not (damaged on disk or in a
                    # copy), or one a recorder merged away since the views were made: the views
                    # are made again without it, and the query run again.
                    recovered = self._recover(exc, probe="SELECT * FROM read_parquet({file})") \
                        if self._fleet is not None else ""
                    gone += recovered == "gone"
                    if not recovered or gone > RETRIES:
                        raise
                    self._views()
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
