"""Where processes connected to: connect() calls by destination, with their failures."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from fdtrace.analysis.engines import Engine
from fdtrace.analysis.engines.dataset import engine_for
from fdtrace.analysis.failures import as_time
from fdtrace.schema import NOT_FAILURES

if TYPE_CHECKING:
    from fdtrace.analysis.engines.dataset import Analyzable

COLUMNS = ["host", "comm", "pid", "peer_addr", "peer_port", "calls", "failed", "errors", "first", "last"]
KEYS = ["host", "comm", "pid", "peer_addr", "peer_port"]


def destinations_on(engine: Engine) -> pd.DataFrame:
    """``destinations()`` computed by ``engine``."""
    if not {"peer_addr", "peer_port"} <= engine.columns("events"):
        if engine.rows("events") == 0:
            return pd.DataFrame(columns=COLUMNS)
        raise ValueError("destinations() needs the events' peer_addr and peer_port: load them (load(columns=...))")
    grouped = engine.query(
        "SELECT host, comm, pid, peer_addr, peer_port, coalesce(errno, '') AS errno, count(*) AS n, "
        "min(time_ns) AS first, max(time_ns) AS last FROM events WHERE kind = 'connect' AND peer_port IS NOT NULL "
        "GROUP BY 1, 2, 3, 4, 5, 6")
    return destinations_from(grouped)


def destinations_from(grouped: pd.DataFrame) -> pd.DataFrame:
    """``destinations()`` from connect() calls counted per process, destination and errno
    (``host``, ``comm``, ``pid``, ``peer_addr``, ``peer_port``, ``errno``, ``n``, ``first``,
    ``last``), as the engine's query or the recording's part summaries give them."""
    if grouped.empty:
        return pd.DataFrame(columns=COLUMNS)
    grouped = grouped.assign(errno=grouped["errno"].fillna("").astype(str))
    grouped["failed"] = ~grouped["errno"].isin(NOT_FAILURES)
    grouped["peer_port"] = grouped["peer_port"].astype("int64")
    grouped["pid"] = grouped["pid"].astype("int64")
    grouped["peer_addr"] = grouped["peer_addr"].fillna("").astype(str)
    grouped["failed_n"] = grouped["n"].where(grouped["failed"], 0)
    table = grouped.groupby(KEYS, sort=False).agg(calls=("n", "sum"), failed=("failed_n", "sum"),
                                                  first=("first", "min"), last=("last", "max")).reset_index()
    errors: dict[tuple[Any, ...], dict[str, int]] = {}
    for row in grouped[grouped["failed"]].sort_values(["n", "errno"], ascending=[False, True]).itertuples():
        errors.setdefault((row.host, row.comm, row.pid, row.peer_addr, row.peer_port), {})[row.errno] = int(row.n)
    table["errors"] = [errors.get(tuple(key), {}) for key in table[KEYS].itertuples(index=False)]
    table["first"] = as_time(table["first"])
    table["last"] = as_time(table["last"])
    table[["calls", "failed"]] = table[["calls", "failed"]].astype("int64")
    table = table.sort_values(["failed", "calls", "host", "pid", "peer_addr", "peer_port"],
                              ascending=[False, False, True, True, True, True], kind="stable", ignore_index=True)
    return table[COLUMNS]


def destinations(recording: Analyzable) -> pd.DataFrame:
    """One row per (process, destination address and port) of connect() calls, most failures
    first. See ``fdtrace.analysis.destinations`` for the columns."""
    with engine_for(recording) as engine:
        return destinations_on(engine)
