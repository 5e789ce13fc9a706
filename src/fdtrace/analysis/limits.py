"""Which limit was in force when, and who set it: each process's limits from its samples and from
the limit changes traced (setrlimit and prlimit64 of RLIMIT_NOFILE and RLIMIT_NPROC, the
``limit_change`` events of schema 7), so that a failure is judged by the limit it met, not by a
limit the process had before or after."""

from __future__ import annotations

import pandas as pd

from fdtrace.analysis.engines import Engine

CHANGE_COLUMNS = ["host", "time_ns", "target", "resource", "soft", "hard", "caller", "caller_comm", "syscall",
                  "errno", "ok", "source"]


def _clock(ns: int) -> str:
    return str(pd.Timestamp(int(ns), unit="ns", tz="UTC").strftime("%H:%M:%S UTC"))


def _limit(value: object) -> str:
    return "unlimited" if pd.isna(value) else str(int(value))  # type: ignore[call-overload]


def limit_changes_on(engine: Engine) -> pd.DataFrame:
    """Every limit change the recording saw, oldest first: whose (``target``), which limit, to
    what, by whom, whether it took (``ok``), and ``source``, the words that name it ("set by the
    process itself at 03:44:10 UTC", "set by prlimit (pid 4242) at ...")."""
    if "limit_target" not in engine.columns("events"):
        return pd.DataFrame(columns=CHANGE_COLUMNS)
    found = engine.query(
        "SELECT host, time_ns, limit_target AS target, limit_resource AS resource, limit_soft AS soft, "
        "limit_hard AS hard, pid AS caller, comm AS caller_comm, syscall, errno FROM events "
        "WHERE kind = 'limit_change' ORDER BY time_ns")
    if found.empty:
        return pd.DataFrame(columns=CHANGE_COLUMNS)
    found["ok"] = found["errno"].isna() | (found["errno"].astype(str) == "")
    for column in ("host", "resource", "caller_comm", "syscall", "errno"):
        found[column] = found[column].astype(str)
    sources = []
    for row in found.itertuples():
        at = _clock(row.time_ns)
        if not row.ok:
            sources.append(f"{row.caller_comm} (pid {row.caller}) asked for {_limit(row.soft)} at {at}, refused "
                           f"({row.errno})")
        elif row.caller == row.target:
            sources.append(f"set by the process itself at {at}")
        else:
            sources.append(f"set by {row.caller_comm} (pid {row.caller}) at {at}")
    found["source"] = sources
    return found[CHANGE_COLUMNS]


def limit_in_force(changes: pd.DataFrame, samples: pd.DataFrame, host: str, pid: int, at_ns: int,
                   since_ns: int | None = None, resource: str = "RLIMIT_NOFILE",
                   sample_column: str = "fd_soft_limit") -> tuple[int | None, str | None]:
    """(the soft limit in force at ``at_ns``, where it came from) for one process: the later of
    its last sample before then and the last change of it that took before then (after
    ``since_ns``, when the process was first seen: a pid is reused). (None, None) when neither is
    known; a limit known only from a sample has no source."""
    sample_at, sample_soft = None, None
    if len(samples):
        mine = samples[(samples["host"].astype(str) == host) & (samples["pid"] == pid)
                       & (samples["time_ns"] <= at_ns)]
        if len(mine):
            last = mine.sort_values("time_ns").iloc[-1]
            sample_at = int(last["time_ns"])
            sample_soft = None if pd.isna(last[sample_column]) else int(last[sample_column])
    if len(changes):
        mine = changes[(changes["host"] == host) & (changes["target"] == pid) & (changes["resource"] == resource)
                       & changes["ok"] & (changes["time_ns"] <= at_ns)]
        if since_ns is not None:
            mine = mine[mine["time_ns"] >= since_ns]
        if len(mine):
            change = mine.iloc[-1]
            soft = None if pd.isna(change["soft"]) else int(change["soft"])
            if sample_at is None or int(change["time_ns"]) >= sample_at or sample_soft == soft:
                return soft, str(change["source"])
    if sample_at is None:
        return None, None
    return sample_soft, None
