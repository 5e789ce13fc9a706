"""Many hosts at once: where and when FD errors and full tables were (hosts by time), and the
order in which the hosts failed (the cascade), on the fleet's one clock."""

from __future__ import annotations

import pandas as pd

from fdtrace.analysis.engines import Engine, quote
from fdtrace.analysis.failures import as_time, failures_on
from fdtrace.analysis.headroom_series import headroom_sql
from fdtrace.analysis.span import Span, span_on
from fdtrace.policy import FD_EXHAUSTION_ERRNOS

HEAT_COLUMNS = ["host", "time", "fd_errors", "fd_usage", "thread_usage"]
CASCADE_COLUMNS = ["order", "host", "time", "after_first_s", "pid", "comm", "failure", "failures_on_host"]


def heat_width_ns(engine: Engine, bins: int, span: Span | None = None) -> tuple[int, int, Span]:
    """(start, width) in ns of ``bins`` whole-second bins over the recording's span
    (``span.span_on``: events far outside it are left out), and the span."""
    span = span or span_on(engine)
    if span.first_ns is None or span.last_ns is None:
        return 0, 1_000_000_000, span
    inside = engine.query(f"SELECT min(time_ns) AS first, max(time_ns) AS last FROM events WHERE {span.condition()}")
    if inside.empty or pd.isna(inside["first"].iloc[0]):
        return 0, 1_000_000_000, span
    first, last = int(inside["first"].iloc[0]), int(inside["last"].iloc[0])
    width = max(1, -(-(last - first) // (bins * 1_000_000_000))) * 1_000_000_000
    return first - first % width, width, span


def fleet_heat_on(engine: Engine, bins: int = 120, span: Span | None = None) -> pd.DataFrame:
    """Per host and time bin (whole seconds, about ``bins`` of them over the recording's span):
    ``fd_errors`` (EMFILE/ENFILE calls), ``fd_usage`` (the fullest process's open FDs over its
    soft limit) and ``thread_usage`` (the same for threads against their binding limit)."""
    _, width, span = heat_width_ns(engine, bins, span)
    inside = span.condition()
    errnos = ", ".join(quote(e) for e in FD_EXHAUSTION_ERRNOS)
    errors = engine.query(f"SELECT host, time_ns // {width} AS bin, count(*) AS fd_errors FROM events "
                          f"WHERE errno IN ({errnos}) AND {inside} GROUP BY 1, 2")
    usage = engine.query(f"SELECT host, time_ns // {width} AS bin, max(usage) AS fd_usage, "
                         f"max(thread_usage) AS thread_usage FROM ({headroom_sql(30.0)}) AS series WHERE {inside} "
                         "GROUP BY 1, 2") \
        if "open_fds" in engine.columns("samples") else pd.DataFrame(columns=["host", "bin", "fd_usage",
                                                                               "thread_usage"])
    heat = errors.merge(usage, on=["host", "bin"], how="outer")
    if heat.empty:
        return pd.DataFrame(columns=HEAT_COLUMNS)
    heat["fd_errors"] = heat["fd_errors"].fillna(0).astype("int64")
    heat["time"] = as_time(heat["bin"].astype("int64") * width)
    heat = heat.sort_values(["host", "time"], ignore_index=True)
    heat.attrs["width_s"] = width // 1_000_000_000
    return heat[HEAT_COLUMNS]


def cascade_from(found: pd.DataFrame) -> pd.DataFrame:
    """``cascade()`` of a ``failures()`` frame."""
    if found.empty:
        return pd.DataFrame(columns=CASCADE_COLUMNS)
    chosen = found[~found["failure"].str.startswith("exit ")]  # exit codes are no failure of their host
    if chosen.empty:
        chosen = found
    counts = chosen.groupby("host", observed=True).size()
    firsts = chosen.sort_values(["time", "host", "pid"]).groupby("host", observed=True, sort=False).head(1)
    firsts = firsts.sort_values(["time", "host"], ignore_index=True)
    firsts["order"] = range(1, len(firsts) + 1)
    firsts["after_first_s"] = (firsts["time"] - firsts["time"].iloc[0]).dt.total_seconds()
    firsts["failures_on_host"] = [int(counts[h]) for h in firsts["host"]]
    firsts["host"] = firsts["host"].astype(str)
    return firsts[CASCADE_COLUMNS]


def cascade_on(engine: Engine) -> pd.DataFrame:
    """The first failure of each host (EMFILE/ENFILE, OOM kill, kill by a signal), hosts in the
    order they failed, with the seconds after the fleet's first failure."""
    return cascade_from(failures_on(engine))
