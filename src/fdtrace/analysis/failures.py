"""Failures of every kind, and the incidents they make: grouped by program, ranked by severity,
with what followed the first of each in the other processes."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fdtrace.analysis.binning import where
from fdtrace.analysis.engines import Engine
from fdtrace.analysis.engines.dataset import engine_for
from fdtrace.policy import FD_EXHAUSTION_ERRNOS
from fdtrace.schema.failures import (
    BAD_EXIT_SQL,
    FAILURE_CLASSES,
    FD_SQL,
    HARM,
    REQUESTED_SIGNALS,
    REQUESTED_SQL,
    failed_call_sql,
    oom_ends,
)
from fdtrace.schema.failures import FAILURE_SQL as IS_FAILURE

COLUMNS = ["time", "host", "pid", "start_ns", "comm", "kind", "failure"]
INCIDENT_COLUMNS = ["severity", "host", "comm", "failure", "count", "processes", "first", "last", "first_pid",
                    "first_overall", "followed_by"]

#: What each failure is called, the first that applies (a kill also has a non-zero exit code).
FAILURE_SQL = (f"CASE WHEN {FD_SQL} THEN concat(syscall, ' ', errno) WHEN kind = 'oom_kill' THEN 'OOM kill' "
               "WHEN kind = 'go_thread_limit' AND ret IS NULL THEN 'Go thread limit exceeded' "
               "WHEN kind = 'go_thread_limit' THEN concat('Go thread limit ', CAST(ret AS VARCHAR), ' exceeded') "
               f"WHEN {REQUESTED_SQL} THEN concat('ended by ', signal) "
               "WHEN kind = 'process_exit' AND signal IS NOT NULL AND signal <> '' THEN concat('killed by ', signal) "
               f"WHEN {BAD_EXIT_SQL} THEN concat('exit ', CAST(exit_code AS VARCHAR)) END")


def is_symptom(alias: str) -> str:
    """What counts as a symptom in the other processes: any failed call (not EAGAIN and
    EINPROGRESS, the answers of non-blocking sockets), any end, any OOM kill."""
    return f"{failed_call_sql(alias)} OR {alias}.kind IN ('process_exit', 'oom_kill')"


def as_time(ns: pd.Series) -> pd.Series:
    """UTC timestamps of integer ns."""
    return pd.to_datetime(ns.astype("int64"), unit="ns", utc=True)


def failures_on(engine: Engine) -> pd.DataFrame:
    """``failures()`` computed by ``engine``."""
    found = engine.query(f"SELECT time_ns, host, pid, start_ns, comm, kind, {FAILURE_SQL} AS failure FROM events "
                         f"{where(IS_FAILURE)} ORDER BY time_ns, host, pid")
    # an OOM kill's victim ends by SIGKILL: that end is the kill's, counted once (schema.failures)
    if (found["failure"] == "OOM kill").any():  # rare: the join only then
        after_oom = oom_ends(found["pid"], found["time_ns"], found["kind"].astype(str),
                             found["failure"].where(found["failure"] != "killed by SIGKILL", "SIGKILL"),
                             found["host"])
        found = found[~after_oom]
    found.insert(0, "time", as_time(found.pop("time_ns")))
    found["pid"] = found["pid"].astype("int64")
    found["start_ns"] = found["start_ns"].astype("Int64")
    return found[COLUMNS].reset_index(drop=True)


def failures(recording_or_events: Any) -> pd.DataFrame:
    """Every failure that ends or cripples a process: EMFILE/ENFILE from any syscall, OOM kills,
    kills by a signal and non-zero exits, with what it was (an OOM kill's victim once: its
    SIGKILL exit is the kill's end, not listed)."""
    with engine_for(recording_or_events) as engine:
        return failures_on(engine)


#: Failure classes, most severe first.
SEVERITIES: tuple[str, ...] = (*FAILURE_CLASSES, "other")

#: Symptoms kept per incident row, the most frequent.
SYMPTOMS_SHOWN = 3


def severity_of(failure: str) -> tuple[int, str]:
    """(rank, class) of a ``failure`` text, rank 0 the most harmful (``schema.failures.HARM``:
    EMFILE/ENFILE and OOM kills alike, then Go's thread limit, crashes, ends on request, non-zero
    exits)."""
    if failure.rsplit(" ", 1)[-1] in FD_EXHAUSTION_ERRNOS:
        name = "EMFILE/ENFILE"
    elif failure == "OOM kill":
        name = "OOM kill"
    elif failure.startswith("Go thread limit "):
        name = "Go thread limit"
    elif failure.startswith("ended by ") or (failure.startswith("killed by ")
                                              and failure.rsplit(" ", 1)[-1] in REQUESTED_SIGNALS):
        name = "ended on request"
    elif failure.startswith("killed by "):
        name = "killed by a signal"
    elif failure.startswith("exit "):
        name = "non-zero exit"
    else:
        return len(FAILURE_CLASSES), SEVERITIES[-1]
    return HARM[name], name


def incidents_on(engine: Engine, window_s: float = 10.0, found: pd.DataFrame | None = None,
                 exits: bool = False) -> pd.DataFrame:
    """``incidents()`` computed by ``engine`` (``found``: its ``failures()``, when known)."""
    all_failures = failures_on(engine) if found is None else found
    if not exits:  # ends on request and non-zero exits are listed apart (failures()), never an incident
        all_failures = all_failures[~all_failures["failure"].str.startswith(("exit ", "ended by "))]
    if all_failures.empty:
        return pd.DataFrame(columns=INCIDENT_COLUMNS)
    all_failures = all_failures.reset_index(drop=True)
    ranks = all_failures["failure"].map(severity_of)
    all_failures = all_failures.assign(rank=[r for r, _ in ranks], severity=[name for _, name in ranks])
    groups = all_failures.groupby(["host", "comm", "failure"], sort=False, observed=True)
    firsts = groups.head(1).reset_index(drop=True)
    window_ns = int(window_s * 1e9)
    starts = pd.DataFrame({"incident": range(len(firsts)), "pid": firsts["pid"].astype("int64"),
                           "time_ns": firsts["time"].astype("int64")})
    label = "concat(e.comm, ': ', CASE WHEN e.errno IS NULL OR e.errno = '' THEN e.kind " \
            "ELSE concat(e.syscall, ' ', e.errno) END)"
    # The symptoms are few (failures and ends) and inside the span of the first failures: both
    # conditions go first, so that the join sees only them.
    span = f"time_ns > {int(starts['time_ns'].min())} AND time_ns <= {int(starts['time_ns'].max()) + window_ns}"
    after = engine.query(
        f"WITH e AS (SELECT time_ns, pid, comm, kind, syscall, errno FROM events AS e WHERE {span} AND "
        f"({is_symptom('e')})) "
        f"SELECT f.incident, {label} AS symptom, count(*) AS n FROM first_failures AS f JOIN e "
        f"ON e.time_ns > f.time_ns AND e.time_ns <= f.time_ns + {window_ns} AND e.pid <> f.pid GROUP BY 1, 2",
        inputs={"first_failures": starts})
    followed: dict[int, dict[str, int]] = {i: {} for i in range(len(firsts))}
    for row in after.sort_values(["incident", "n", "symptom"], ascending=[True, False, True]).itertuples():
        if len(followed[int(row.incident)]) < SYMPTOMS_SHOWN:
            followed[int(row.incident)][str(row.symptom)] = int(row.n)
    sizes = groups.size()
    processes = groups["pid"].nunique()
    lasts = groups["time"].max()
    rows = [{"severity": first.severity, "host": first.host, "comm": first.comm, "failure": first.failure,
             "count": int(sizes[key]), "processes": int(processes[key]), "first": first.time,
             "last": lasts[key], "first_pid": first.pid, "first_overall": order == 0,
             "followed_by": followed[order], "_rank": first.rank}
            for order, first in enumerate(firsts.itertuples(index=False))
            for key in [(first.host, first.comm, first.failure)]]
    ranked = pd.DataFrame(rows).sort_values(["_rank", "count", "first"], ascending=[True, False, True],
                                            kind="stable")
    return ranked.drop(columns="_rank")[INCIDENT_COLUMNS].reset_index(drop=True)


def incidents(recording_or_events: Any, window_s: float = 10.0, exits: bool = False) -> pd.DataFrame:
    """The failures grouped by host, program and failure, by harm (``schema.failures.HARM``), then
    the most failures, then the first to fail. See ``fdtrace.analysis`` for the full description."""
    with engine_for(recording_or_events) as engine:
        return incidents_on(engine, window_s=window_s, exits=exits)
