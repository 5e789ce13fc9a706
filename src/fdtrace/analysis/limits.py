"""Which limit was in force when, and who set it: each process's limits from its samples and from
the limit changes traced (setrlimit and prlimit64 of RLIMIT_NOFILE and RLIMIT_NPROC, the
``limit_change`` events of schema 7), so that a failure is judged by the limit it met, not by a
limit the process had before or after."""

from __future__ import annotations

from typing import Any

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
        "limit_hard AS hard, pid AS caller, comm AS caller_comm, syscall, errno "
        f"FROM {engine.derived('rare_events')} WHERE kind = 'limit_change' ORDER BY time_ns")
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
        elif row.caller == row.target and row.caller_comm.startswith("haproxy"):
            sources.append(f"set by haproxy itself at {at} (its configuration's ulimit-n, or what it computed "
                           "from maxconn)")
        elif row.caller == row.target:
            sources.append(f"set by the process itself at {at}")
        else:
            sources.append(f"set by {row.caller_comm} (pid {row.caller}) at {at}")
    found["source"] = sources
    return found[CHANGE_COLUMNS]


class ByProcess:
    """A frame's rows by process (its host as text, its pid), split once: a loop over processes
    takes each one's rows from here rather than filtering the whole frame every time (a fleet's
    hundreds of failing processes against its samples)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.empty = frame.iloc[:0]
        self._rows: dict[tuple[str, int], pd.DataFrame] = {}
        if len(frame):
            keys = [frame["host"].astype(str), frame["pid"]]
            self._rows = {(str(host), int(pid)): rows for (host, pid), rows in
                          frame.groupby(keys, sort=False, observed=True)}

    def __call__(self, host: str, pid: int) -> pd.DataFrame:
        """The rows of one process (none: an empty frame with the columns)."""
        return self._rows.get((host, int(pid)), self.empty)


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


#: Processes whose limit's source is looked for beyond the changes traced (the first, in the
#: needs' order: failed first, then the fullest), so that a fleet's thousands cost a bounded query.
MAX_SOURCES = 500


def name_inherited_sources(engine: Engine, found: pd.DataFrame, changes: pd.DataFrame | None = None) -> None:
    """Fill ``limit_source`` where no change of a process's limit explains it, from what was traced
    of its start: a change traced to the same limit ("set by prlimit (pid N) at ..."), the parent
    it forked from when the parent's limit in force then is the same ("inherited from pid N (comm),
    whose limit was set by ..."), or, for a process that systemd (pid 1) started, its unit
    ("inherited from systemd (pid 1): LimitNOFILE of unit X"). In place; left empty when not known."""
    if "ppid" not in engine.columns("events") or "limit_source" not in found.columns:
        return
    unknown = found[found["limit_source"].isna() & found["fd_soft_limit"].notna()]
    unknown = unknown.sort_values("emfile", ascending=False, kind="stable").head(MAX_SOURCES)
    if unknown.empty:
        return
    pids = ", ".join(str(int(p)) for p in sorted(set(unknown["pid"])))
    starts = engine.query(f"SELECT host, pid, start_ns, ppid, time_ns FROM {engine.derived('rare_events')} "
                          f"WHERE kind = 'process_start' AND pid IN ({pids}) AND ppid IS NOT NULL")
    changes = limit_changes_on(engine) if changes is None else changes
    parents = sorted({int(p) for p in starts["ppid"]})
    family = ", ".join(str(p) for p in sorted(set(parents) | {int(p) for p in unknown["pid"]})) or "-1"
    unit = "unit" if "unit" in engine.columns("samples") else "NULL AS unit"
    samples = engine.query(f"SELECT host, pid, comm, time_ns, fd_soft_limit, {unit} FROM samples "
                           f"WHERE pid IN ({family})")
    inherited: list[tuple[Any, str, int, str | None]] = []  # (row, host, parent, its limit's source): named below
    starts_of, samples_of = ByProcess(starts), ByProcess(samples)
    for index, row in unknown.iterrows():
        host, pid, soft = str(row["host"]), int(row["pid"]), int(row["fd_soft_limit"])
        own = changes[(changes["host"] == host) & (changes["target"] == pid) & changes["ok"]
                      & (changes["resource"] == "RLIMIT_NOFILE")] if len(changes) else changes
        own = own[own["soft"] == soft] if len(own) else own
        if len(own):
            found.at[index, "limit_source"] = str(own.iloc[-1]["source"])
            continue
        mine = starts_of(host, pid)
        if not pd.isna(row["start_ns"]):
            mine = mine[mine["start_ns"] == row["start_ns"]]
        if mine.empty:
            continue
        start = mine.iloc[-1]
        ppid, at = int(start["ppid"]), int(start["time_ns"])
        parent_soft, parent_source = limit_in_force(changes, samples_of(host, ppid), host, ppid, at)
        if parent_soft == soft:
            inherited.append((index, host, ppid, parent_source))
        elif ppid == 1:
            units = samples_of(host, pid)
            units = units[units["unit"].notna()]
            if len(units):
                found.at[index, "limit_source"] = (f"inherited from systemd (pid 1): LimitNOFILE of unit "
                                                   f"{units['unit'].iloc[-1]}")


    _name_parents(engine, found, samples_of, inherited)


def _name_parents(engine: Engine, found: pd.DataFrame, samples_of: ByProcess,
                  inherited: list[tuple[Any, str, int, str | None]]) -> None:
    """Say which parent each process inherited its limit from, by name: from the parents'
    samples, else from their events (one query, for the parents never sampled only: the events of
    a fleet are hundreds of millions of rows)."""
    unsampled = sorted({ppid for _, host, ppid, _ in inherited if samples_of(host, ppid).empty})
    names = engine.query("SELECT host, pid, min(comm) AS comm FROM events "
                         f"WHERE pid IN ({', '.join(map(str, unsampled))}) GROUP BY host, pid") if unsampled else \
        pd.DataFrame({"host": pd.Series(dtype=str), "pid": pd.Series(dtype="int64"), "comm": pd.Series(dtype=str)})
    names_of = ByProcess(names)
    for index, host, ppid, parent_source in inherited:
        found.at[index, "limit_source"] = (f"inherited from pid {ppid} ({_comm_of(samples_of, names_of, host, ppid)})"
                                           + (f", whose limit was {parent_source}" if parent_source else ""))


def _comm_of(samples_of: ByProcess, names_of: ByProcess, host: str, pid: int) -> str:
    for rows_of in (samples_of, names_of):
        mine = rows_of(host, pid)
        if len(mine):
            return str(mine["comm"].iloc[-1])
    return "?"
