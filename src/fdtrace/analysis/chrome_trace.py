"""A recording as a Chrome Trace Event file, the format Perfetto and chrome://tracing open and
PyTorch's profiler writes: per host and process, counter tracks of open FDs against the soft
limit, of threads against the limit that binds them and of EMFILE/ENFILE per second; an instant
event for each failure (EMFILE/ENFILE, OOM kill, Go thread limit, kill, non-zero exit); and the
training phases of each rank as slices. ``merge`` adds the same to a PyTorch profiler (Kineto)
trace of the run, on its clock: Kineto's stamps are microseconds after its
``baseTimeNanoseconds`` on the wall clock, which is the clock of the recording's ``time``.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from fdtrace.analysis.engines.dataset import engine_for
from fdtrace.analysis.failures import failures_on, severity_of
from fdtrace.analysis.headroom_series import COLUMNS as HEADROOM_COLUMNS
from fdtrace.analysis.headroom_series import headroom_on, least_headrooms_on, processes_where
from fdtrace.errors import FdtraceError
from fdtrace.integrations.phases.kineto import read_trace
from fdtrace.policy import FD_EXHAUSTION_ERRNOS

if TYPE_CHECKING:
    from fdtrace.analysis.engines.dataset import Dataset

#: Category of every event fdtrace adds (Perfetto and HTA can filter on it).
CATEGORY = "fdtrace"
#: Synthetic thread ids of fdtrace's own tracks inside a process: far above any real tid.
PHASES_TID, ALLREDUCE_TID, FAILURES_TID = 1 << 30, (1 << 30) + 1, (1 << 30) + 2
#: Process ids given to processes of a second, third ... host (so that hosts never share a pid).
HOST_PID_STRIDE = 1 << 22
#: Instant events at most (an EMFILE storm makes tens of thousands): the rest are in the counter.
MAX_INSTANTS = 20_000


def _us(wall_ns: Any, base_ns: int) -> float:
    return (int(wall_ns) - base_ns) / 1000.0


def chrome_trace(recording: Dataset, top: int = 20, base_ns: int | None = None, host: str | None = None,
                 pids: set[int] | None = None, named: set[int] | None = None) -> dict[str, Any]:
    """The recording's tracks as a Chrome trace (``{"traceEvents": [...], ...}``).

    Args:
        top: processes with counter tracks: those that failed, the ranks of training jobs, and
            the ones nearest an FD or thread limit, this many in all at most (failures beyond
            them still get their instant events).
        base_ns: the wall time of ``ts`` 0 (a Kineto trace's ``baseTimeNanoseconds``); by
            default the recording's first event.
        host: only this host's processes (a merge); by default every host's, each host's
            processes moved to their own pid range.
        pids: processes that get tracks whatever ``top`` says (the ranks of a merged trace).
        named: the processes of a trace this is merged into: their names are not given again, and
            only their phases are added (the trace is theirs).
    """
    with engine_for(recording) as engine:
        found = failures_on(engine)
        both = least_headrooms_on(engine)
        fullest, threads = both["fds"], both["threads"]
        rates = engine.query(
            "SELECT host, pid, min(comm) AS comm, time_ns // 1000000000 AS second, count(*) AS n FROM events "
            f"WHERE errno IN ({', '.join(repr(e) for e in sorted(FD_EXHAUSTION_ERRNOS))}) "
            "GROUP BY host, pid, time_ns // 1000000000")
        first = engine.query("SELECT min(time_ns) AS t FROM events")
        phases = recording.table("phases")
        phases = pd.DataFrame() if phases is None else phases
        hosts = sorted({str(h) for h in recording.meta})
        if host is not None:
            if host not in hosts:
                raise FdtraceError(f"--host {host}: the recording has hosts {', '.join(hosts)}", exit_code=2)
            hosts = [host]
            found = found[found["host"].astype(str) == host]
            fullest, threads = (f[f["host"].astype(str) == host] for f in (fullest, threads))
            rates = rates[rates["host"].astype(str) == host]
        chosen = _chosen(found, fullest, threads, phases, top, pids or set())
        series = headroom_on(engine, where=processes_where(chosen)) if len(chosen) else \
            pd.DataFrame(columns=HEADROOM_COLUMNS)
    if base_ns is None:
        base_ns = int(first["t"].iloc[0]) if len(first) and pd.notna(first["t"].iloc[0]) else 0
    offset = {h: i * HOST_PID_STRIDE for i, h in enumerate(hosts)} if host is None else {hosts[0]: 0}
    several = len(hosts) > 1

    def pid_of(row_host: Any, pid: Any) -> int:
        return offset.get(str(row_host), 0) + int(pid)

    events: list[dict[str, Any]] = []
    known: set[int] = set()

    def name_process(row_host: Any, pid: Any, comm: Any) -> int:
        traced = pid_of(row_host, pid)
        if traced not in known:
            known.add(traced)
            label = f"{row_host}: {comm} [{pid}]" if several else f"{comm} [{pid}]"
            if traced not in (named or set()):
                events.append({"ph": "M", "name": "process_name", "pid": traced, "tid": 0, "args": {"name": label}})
            events.append({"ph": "M", "name": "thread_name", "pid": traced, "tid": FAILURES_TID,
                           "args": {"name": "fdtrace: failures"}})
        return traced

    for (row_host, pid, _start), rows in series.groupby(["host", "pid", series["start_ns"].fillna(-1)], sort=True):
        traced = name_process(row_host, pid, rows["comm"].iloc[0])
        for row in rows.itertuples():
            ts = _us(row.time.value, base_ns)
            events.append(_counter(traced, ts, "open FDs", row.open_fds))
            if pd.notna(row.fd_soft_limit):
                events.append(_counter(traced, ts, "FD soft limit", row.fd_soft_limit))
            events.append(_counter(traced, ts, "threads", row.threads))
            if isinstance(row.thread_limit_kind, str) and pd.notna(row.thread_limit):
                events.append(_counter(traced, ts, f"thread limit ({row.thread_limit_kind})", row.thread_limit))
    for row in rates.sort_values(["host", "pid", "second"]).itertuples():
        traced = name_process(row.host, row.pid, row.comm)
        second_ns = int(row.second) * 1_000_000_000
        events.append(_counter(traced, _us(second_ns, base_ns), "EMFILE/ENFILE per second", row.n))
        events.append(_counter(traced, _us(second_ns + 1_000_000_000, base_ns), "EMFILE/ENFILE per second", 0))
    for row in found.head(MAX_INSTANTS).itertuples():
        traced = name_process(row.host, row.pid, row.comm)
        wall_ns = int(row.time.value)
        events.append({"ph": "i", "s": "t", "name": str(row.failure), "cat": CATEGORY, "pid": traced,
                       "tid": FAILURES_TID, "ts": _us(wall_ns, base_ns),
                       "args": {"severity": severity_of(str(row.failure))[1], "kind": str(row.kind),
                                "wall_ns": wall_ns}})
    if host is not None and len(phases) and "host" in phases.columns:
        phases = phases[phases["host"].astype(str) == host]
    if named and len(phases):  # a merge: the phases of the traced processes only
        phases = phases[phases["pid"].isin(named)]
    events += _phase_slices(phases, base_ns, name_process)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"fdtrace.base_wall_ns": base_ns, "fdtrace.hosts": hosts,
                          "fdtrace.failures": len(found), "fdtrace.failures_shown": min(len(found), MAX_INSTANTS)}}


def _counter(pid: int, ts: float, name: str, value: Any) -> dict[str, Any]:
    return {"ph": "C", "name": name, "cat": CATEGORY, "pid": pid, "tid": 0, "ts": ts,
            "args": {"value": float(value) if not isinstance(value, int) else value}}


def _chosen(found: pd.DataFrame, fullest: pd.DataFrame, threads: pd.DataFrame, phases: pd.DataFrame, top: int,
            pids: set[int]) -> pd.DataFrame:
    """(host, pid, start_ns) of the processes that get counter tracks, ``top`` at most: the ranks
    (of the phases, and ``pids``), then those that failed (the most severe first), then those
    nearest an FD limit, then those nearest a thread limit."""
    keys = ["host", "pid", "start_ns"]
    ranks = pids | (set(phases["pid"].dropna().astype(int)) if len(phases) else set())
    failed = found.assign(rank=[severity_of(str(f))[0] for f in found["failure"]]).sort_values(["rank", "time"])
    wanted = [fullest[fullest["pid"].isin(ranks)][keys], failed[keys], fullest[keys],
              threads[threads["thread_limit"].notna()][keys]]
    return pd.concat(wanted).drop_duplicates().head(top)


def _phase_slices(phases: pd.DataFrame, base_ns: int, name_process: Any) -> list[dict[str, Any]]:
    """Each rank's phases on two tracks of its process: the phases, and the all-reduce buckets
    (which overlap the backward pass)."""
    if not len(phases):
        return []
    own = phases[phases["source"].fillna("shim") != "kineto"] if "source" in phases.columns else phases
    own = own[own["end_wall_ns"].notna()]
    events: list[dict[str, Any]] = []
    hosts = own["host"].astype(str) if "host" in own.columns else pd.Series([""] * len(own), index=own.index)
    for (host, pid), rows in own.groupby([hosts, "pid"], sort=True):
        rank = rows["rank"].dropna()
        label = f"rank {int(rank.iloc[0])}" if len(rank) else f"pid {int(pid)}"
        traced = name_process(host, pid, f"training process, {label}")
        events.append({"ph": "M", "name": "thread_name", "pid": traced, "tid": PHASES_TID,
                       "args": {"name": f"fdtrace: phases ({label})"}})
        events.append({"ph": "M", "name": "thread_name", "pid": traced, "tid": ALLREDUCE_TID,
                       "args": {"name": f"fdtrace: all-reduce buckets ({label})"}})
        for row in rows.sort_values("start_wall_ns").itertuples():
            args = {"rank": None if pd.isna(row.rank) else int(row.rank),
                    "step": None if pd.isna(row.step) else int(row.step)}
            if pd.notna(getattr(row, "bucket", None)):
                args["bucket"] = int(row.bucket)
            if isinstance(getattr(row, "name", None), str):
                args["name"] = row.name
            start = _us(row.start_wall_ns, base_ns)
            events.append({"ph": "X", "name": str(row.phase), "cat": f"{CATEGORY}.phase", "pid": traced,
                           "tid": ALLREDUCE_TID if row.phase == "allreduce" else PHASES_TID, "ts": start,
                           "dur": max(_us(row.end_wall_ns, base_ns) - start, 0.001), "args": args})
    return events


def merge_into_kineto(recording: Dataset, kineto_path: Path, top: int = 20, host: str | None = None) -> dict[str, Any]:
    """A PyTorch profiler trace with the recording's tracks added, on the trace's clock: the
    rank's own process gets its counters, failures and the shim's phases beside Kineto's."""
    trace = read_trace(kineto_path)
    hosts = sorted(str(h) for h in recording.meta)
    if host is None:
        if len(hosts) > 1:
            raise FdtraceError(f"the recording has hosts {', '.join(hosts)}: say which one ran {kineto_path.name} "
                               "with --host", exit_code=2)
        host = hosts[0]
    ranks = {int(e["pid"]) for e in trace["traceEvents"] if str(e.get("pid", "")).isdigit()}
    ours = chrome_trace(recording, top=top, base_ns=int(trace["baseTimeNanoseconds"]), host=host, pids=ranks,
                        named=ranks)
    # The trace's own keys first and the events last, as Kineto writes them: tools find the rank by
    # the first '"rank": N' in the file (Holistic Trace Analysis does), which must be distributedInfo's.
    merged = {key: value for key, value in trace.items() if key != "traceEvents"}
    other = merged.get("otherData")
    merged["otherData"] = {**(other if isinstance(other, dict) else {}), **ours["otherData"]}
    merged["traceEvents"] = [*trace["traceEvents"], *_within(ours["traceEvents"], trace["traceEvents"])]
    return merged


def _within(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our events inside the span the profiler traced (slices cut to it): what lies before would
    move the trace's start, which tools take as their time zero. A counter's last value before
    the span is put at its start, so that each track has a value all along."""
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0) or 0)) for e in theirs
             if isinstance(e.get("ts"), int | float) and e.get("ph") != "M"]
    if not spans:
        return [e for e in ours if e["ph"] == "M"]
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    kept = []
    before: dict[tuple[Any, str], dict[str, Any]] = {}
    for event in ours:
        if event["ph"] == "C" and event["ts"] < first:
            key = (event["pid"], event["name"])
            if key not in before or before[key]["ts"] <= event["ts"]:
                before[key] = event
    kept += [{**event, "ts": first} for event in before.values()]
    for event in ours:
        if event["ph"] == "M":
            kept.append(event)
        elif event["ph"] == "X":
            start, end = max(event["ts"], first), min(event["ts"] + event["dur"], last)
            if start < end:
                kept.append({**event, "ts": start, "dur": end - start})
        elif first <= event["ts"] <= last:
            kept.append(event)
    return kept


def trace_bytes(trace: dict[str, Any], gzipped: bool) -> bytes:
    """The trace as JSON bytes, gzipped or not."""
    # JSON's usual ", " and ": " (not the compact form): '"rank": N' is how tools look for the rank.
    text = json.dumps(trace, allow_nan=False, default=_plain).encode()
    return gzip.compress(text, mtime=0) if gzipped else text


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
        if isinstance(value, float) and math.isnan(value):
            return None
        return value
    raise TypeError(f"{type(value).__name__} is not JSON")
