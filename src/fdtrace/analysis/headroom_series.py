"""Headroom of each process over time, from the recording's samples: open FDs against
RLIMIT_NOFILE, and threads against the tightest of the limits that bound them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from fdtrace.analysis.engines import Engine, quote
from fdtrace.analysis.engines.dataset import engine_for
from fdtrace.analysis.failures import as_time
from fdtrace.procfs.golang import GO_DEFAULT_MAX_THREADS
from fdtrace.procfs.thread_limits import GO_SET_LIMIT, THREAD_LIMITS

if TYPE_CHECKING:
    from fdtrace.analysis.engines.dataset import Analyzable

#: Larger than any room a limit leaves (stands for "no such limit" in least()).
NO_ROOM = 1 << 62

COLUMNS = ["time", "host", "pid", "start_ns", "comm", "open_fds", "fd_soft_limit", "fd_hard_limit", "headroom",
           "usage", "seconds_to_exhaustion", "threads", "threads_per_s", "thread_limit_kind", "thread_limit",
           "thread_count", "thread_headroom", "thread_usage", "seconds_to_thread_limit"]


def _kind_sql(name: str, limit: str) -> str:
    """A limit's name in SQL (``thread_limits.limit_name``: Go's depends on the limit read)."""
    if name != "Go default":
        return quote(name)
    return f"CASE WHEN {limit} <> {GO_DEFAULT_MAX_THREADS} THEN {quote(GO_SET_LIMIT)} ELSE {quote(name)} END"


def headroom_sql(window_s: float) -> str:
    """One row per sample with its headroom, binding thread limit and times to each limit."""
    window_ns = int(window_s * 1e9)
    rooms = [(name, limit, count, f"room_{i}") for i, (name, limit, count) in enumerate(THREAD_LIMITS)]
    # The binding limit leaves the fewest threads to spare; the first in THREAD_LIMITS on a tie.
    least = f"least({', '.join(f'coalesce({room}, {NO_ROOM})' for *_, room in rooms)})"
    kind = " ".join(f"WHEN {room} = best THEN {_kind_sql(name, limit)}" for name, limit, _, room in rooms)
    limit = " ".join(f"WHEN {room} = best THEN {lim}" for _, lim, _, room in rooms)
    count = " ".join(f"WHEN {room} = best THEN {cnt}" for _, _, cnt, room in rooms)
    window = (f"OVER (PARTITION BY host, pid, start_ns ORDER BY ts_ns "
              f"RANGE BETWEEN {window_ns} PRECEDING AND CURRENT ROW)")

    def slope(column: str) -> str:
        return (f"CASE WHEN ts_ns > first_ts THEN CAST({column} - first_{column} AS DOUBLE) / "
                f"(CAST(ts_ns - first_ts AS DOUBLE) / 1e9) END")

    return f"""
WITH sys AS (SELECT host, ts_ns, max(threads_max) AS threads_max, max(threads_total) AS threads_total
             FROM system GROUP BY 1, 2),
joined AS (SELECT s.host, s.ts_ns, s.time_ns, s.pid, s.start_ns, s.comm, s.open_fds, s.fd_soft_limit,
                  s.fd_hard_limit, s.threads, s.go_max_threads, s.nproc_soft_limit, s.user_threads, s.pids_max,
                  s.pids_current, y.threads_max, y.threads_total
           FROM samples AS s LEFT JOIN sys AS y ON s.host = y.host AND s.ts_ns = y.ts_ns),
roomy AS (SELECT *, {", ".join(f"{lim} - {cnt} AS {room}" for _, lim, cnt, room in rooms)} FROM joined),
bound AS (SELECT *, CASE WHEN {least} < {NO_ROOM} THEN {least} END AS best FROM roomy),
limited AS (SELECT *, fd_soft_limit - open_fds AS headroom,
                   CASE WHEN fd_soft_limit > 0 THEN CAST(open_fds AS DOUBLE) / fd_soft_limit END AS usage,
                   CASE {kind} END AS thread_limit_kind, CASE {limit} END AS thread_limit,
                   CASE {count} END AS thread_count, best AS thread_headroom
            FROM bound),
windowed AS (SELECT *, first_value(ts_ns) {window} AS first_ts, first_value(open_fds) {window} AS first_open_fds,
                    first_value(threads) {window} AS first_threads,
                    first_value(thread_count) {window} AS first_thread_count
             FROM limited),
sloped AS (SELECT *, {slope("open_fds")} AS fd_slope, {slope("threads")} AS threads_per_s,
                  {slope("thread_count")} AS count_slope FROM windowed)
SELECT time_ns, host, pid, start_ns, comm, open_fds, fd_soft_limit, fd_hard_limit, headroom, usage,
       CASE WHEN headroom <= 0 THEN 0.0 WHEN fd_slope > 0 THEN headroom / fd_slope END AS seconds_to_exhaustion,
       threads, threads_per_s, thread_limit_kind, thread_limit, thread_count, thread_headroom,
       CASE WHEN thread_limit > 0 THEN CAST(thread_count AS DOUBLE) / thread_limit END AS thread_usage,
       CASE WHEN thread_headroom <= 0 THEN 0.0 WHEN count_slope > 0 THEN thread_headroom / count_slope END
           AS seconds_to_thread_limit,
       ts_ns
FROM sloped"""


def _shaped(found: pd.DataFrame) -> pd.DataFrame:
    """An engine's rows as ``headroom()`` gives them."""
    found.insert(0, "time", as_time(found.pop("time_ns")))
    for column in ("pid", "open_fds", "threads"):
        found[column] = found[column].astype("int64")
    found["start_ns"] = found["start_ns"].astype("Int64")
    for column in ("fd_soft_limit", "fd_hard_limit", "headroom", "usage", "seconds_to_exhaustion", "threads_per_s",
                   "thread_limit", "thread_count", "thread_headroom", "thread_usage", "seconds_to_thread_limit"):
        found[column] = pd.to_numeric(found[column], errors="coerce").astype("float64")
    found["thread_limit_kind"] = found["thread_limit_kind"].astype(object).where(found["thread_limit_kind"].notna(),
                                                                                 None)
    return found


def processes_where(rows: pd.DataFrame) -> str:
    """A SQL condition that picks these processes (their host, pid and start_ns) out of a table."""
    return " OR ".join(f"(host = {quote(str(r.host))} AND pid = {int(r.pid)} AND start_ns "
                       f"{'IS NULL' if pd.isna(r.start_ns) else f'= {int(r.start_ns)}'})" for r in rows.itertuples())


def headroom_on(engine: Engine, window_s: float = 30.0, where: str | None = None) -> pd.DataFrame:
    """``headroom()`` computed by ``engine``; ``where``: only the rows that meet this SQL condition
    (on the result's columns, e.g. some processes)."""
    if "open_fds" not in engine.columns("samples"):
        return pd.DataFrame(columns=COLUMNS)
    chosen = f"WHERE {where}" if where else ""
    found = engine.query(f"SELECT * FROM ({headroom_sql(window_s)}) AS series {chosen} "
                         "ORDER BY host, pid, start_ns, ts_ns")
    return _shaped(found)[COLUMNS].reset_index(drop=True)


#: The column each resource's fullest sample is chosen by.
USAGE_OF = {"fds": "usage", "threads": "thread_usage"}


def least_headroom_on(engine: Engine, resource: str = "fds", window_s: float = 30.0) -> pd.DataFrame:
    """``least_headroom()`` computed by ``engine``: the fullest sample of each process is chosen in
    the engine, so only one row per process comes back."""
    return least_headrooms_on(engine, (resource,), window_s)[resource]


def least_headrooms_on(engine: Engine, resources: tuple[str, ...] = ("fds", "threads"),
                       window_s: float = 30.0) -> dict[str, pd.DataFrame]:
    """:func:`least_headroom_on` of several resources from one pass over the samples: by resource,
    each process's fullest sample of it, fullest processes first."""
    if "open_fds" not in engine.columns("samples"):
        return {resource: pd.DataFrame(columns=COLUMNS) for resource in resources}
    ranks = ", ".join(f"row_number() OVER (PARTITION BY host, pid, start_ns ORDER BY {USAGE_OF[resource]} DESC "
                      f"NULLS LAST, ts_ns) AS fullest_{resource}" for resource in resources)
    found = _shaped(engine.query(
        f"SELECT * FROM (SELECT *, {ranks} FROM ({headroom_sql(window_s)}) AS series) AS ranked "
        f"WHERE {' OR '.join(f'fullest_{resource} = 1' for resource in resources)}"))
    least = {}
    for resource in resources:
        usage = USAGE_OF[resource]
        mine = found[found[f"fullest_{resource}"] == 1]
        mine = mine.sort_values([usage, "time", "host", "pid"], ascending=[False, True, True, True],
                                na_position="last", kind="stable")
        least[resource] = mine[COLUMNS].reset_index(drop=True)
    return least


def headroom(recording: Analyzable, window_s: float = 30.0) -> pd.DataFrame:
    """Per sample: open FDs and threads against their limits, and the estimated time to each
    limit. See ``fdtrace.analysis.headroom`` for the full description."""
    with engine_for(recording) as engine:
        return headroom_on(engine, window_s=window_s)


def least_headroom(recording: Analyzable, resource: str = "fds") -> pd.DataFrame:
    """Per process, its fullest sample (highest usage of FDs, or of threads with
    ``resource="threads"``), fullest processes first."""
    with engine_for(recording) as engine:
        return least_headroom_on(engine, resource=resource)
