"""Apache Spark over a fleet's Parquet files (engine ``spark``): ``local[2]`` by default, a cluster
with ``master="spark://HOST:7077"``, or Spark Connect when ``SPARK_REMOTE`` is set. The analyses'
SQL is transpiled from DuckDB's dialect to Spark's by sqlglot. On a cluster the recordings must
be at the same paths on every worker (shared storage)."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pandas as pd

from fdtrace.analysis.engines import Engine, PartGoneError, quote, select_list, table_files, view_fields
from fdtrace.errors import FdtraceError
from fdtrace.recording.fleet import Fleet
from fdtrace.recording.layout import TABLES

HOST_OF_PATH = r"host=([^/]+)/[^/]+$"
#: How many times the parts are listed again when a file went meanwhile, at most.
RETRIES = 8


def to_spark_sql(sql: str) -> str:
    """``sql`` in DuckDB's dialect, as Spark SQL."""
    import sqlglot

    return str(sqlglot.transpile(sql, read="duckdb", write="spark")[0])


def spark_session(master: str | None = None) -> Any:
    """A Spark session for fdtrace's views: timestamps read as integer nanoseconds, UTC, no UI."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise FdtraceError("the spark engine needs pyspark (pip install pyspark) and a Java runtime") from None
    builder = SparkSession.builder.appName("fdtrace")
    if os.environ.get("SPARK_REMOTE") and not master:
        builder = builder.remote(os.environ["SPARK_REMOTE"])
    else:
        builder = builder.master(master or "local[2]")
        if not master or master.startswith("local"):
            builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        builder = builder.config("spark.ui.enabled", "false")
    builder = (builder.config("spark.sql.legacy.parquet.nanosAsLong", "true")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.sql.shuffle.partitions", "8")
               .config("spark.ui.showConsoleProgress", "false"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # pyspark's note on pandas 3
            session = builder.getOrCreate()
    except Exception as exc:  # Java missing, master unreachable: py4j and Spark raise their own types
        raise FdtraceError(f"cannot start Spark: {' '.join(str(exc).split())[:300]}") from None
    session.sparkContext.setLogLevel("ERROR")
    return session


class SparkEngine(Engine):
    """Views over a fleet's part files in a Spark session."""

    name = "spark"

    def __init__(self, session: Any, columns: dict[str, frozenset[str]]) -> None:
        self._session = session
        self._columns = columns

    @classmethod
    def over_fleet(cls, fleet: Fleet, master: str | None = None,
                   offsets: dict[str, int] | None = None) -> SparkEngine:
        """Views over every readable part file of the fleet (footers checked as DuckDB's are)."""
        session = spark_session(master)
        columns = {}
        for table in TABLES:
            for _ in range(RETRIES):
                try:
                    files = table_files(fleet, table)
                    break
                except PartGoneError:  # a recorder merged a file away: list the parts again
                    fleet.refresh()
            else:
                raise FdtraceError("a recording could not be read: its part files kept changing while it was read")
            sources = []
            if files.direct:
                source = f"_files_{table}"
                read = session.read.option("mergeSchema", "true").parquet(*files.direct)
                read.withColumn("_file", read["_metadata.file_path"]).createOrReplaceTempView(source)
                host = f"regexp_extract(_file, {quote(HOST_OF_PATH)}, 1)"
                listing = select_list(table, files.present, '"time"', host, offsets)
                sources.append(f"SELECT {listing} FROM {source}")
            if files.read is not None:
                source = f"_read_{table}"
                session.createDataFrame(files.read.to_pandas()).createOrReplaceTempView(source)
                listing = select_list(table, set(files.read.column_names), '"time"', '"host"', offsets)
                sources.append(f"SELECT {listing} FROM {source}")
            if not sources:
                sources.append(f"SELECT {select_list(table, set(), 'NULL', 'NULL')} FROM (SELECT 1) AS nothing "
                               "WHERE false")
            session.sql(to_spark_sql(" UNION ALL ".join(sources))).createOrReplaceTempView(table)
            columns[table] = frozenset({f.name for f in view_fields(table)} | {"host", "time_ns"})  # absent: NULL
        return cls(session, columns)

    def query(self, sql: str, inputs: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
        for name, frame in (inputs or {}).items():
            self._session.createDataFrame(frame).createOrReplaceTempView(name)
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        with warnings.catch_warnings():
            # pyspark's notes on pandas 3 (its conversions use deprecated arguments)
            warnings.filterwarnings("ignore", module=r"pyspark\.")
            try:
                return self._session.sql(to_spark_sql(sql)).toPandas()
            except (PySparkException, Py4JError) as exc:  # a damaged file, a lost executor
                lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
                why = next((line for line in lines[1:] if "Exception:" in line), lines[0])
                raise FdtraceError(f"Spark could not run a query: {why[:300]}") from None

    def columns(self, table: str) -> frozenset[str]:
        return self._columns[table]

    def close(self) -> None:
        self._session.stop()
