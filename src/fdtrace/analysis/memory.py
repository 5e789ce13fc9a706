"""Memory headroom from a recording's samples: each process's resident memory and the memory
cgroup that limits it, the memory a connection costs (fitted against its sockets), what its
connections will need against that limit, and each OOM kill's victim as it was last seen.

The fit and the advice are the advice layer's (``advice.memory``: ``memory_fit_levels``,
``connections_to_hold``, ``memory_change``), so doctor, ``info``, the report and the live view
say the same number in the same words."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from fdtrace.advice.memory import MemoryFit, connections_to_hold, memory_change, memory_fit_levels
from fdtrace.analysis.engines import Engine
from fdtrace.analysis.engines.dataset import engine_for
from fdtrace.analysis.headroom_series import processes_where
from fdtrace.analysis.needs import fd_needs_on
from fdtrace.policy import USAGE_WARN
from fdtrace.units import kib

if TYPE_CHECKING:
    from fdtrace.analysis.engines.dataset import Analyzable

#: Processes whose memory is judged: those nearest their cgroup's limit, and every OOM victim.
MAX_PROCESSES = 50
#: The window before an OOM kill whose RSS trend is told.
TREND_NS = 60_000_000_000

MEMORY_COLUMNS = ["host", "pid", "start_ns", "comm", "time", "rss_bytes", "memcg_limit_bytes", "memcg_usage_bytes",
                  "memcg_peak_bytes", "usage", "memcg_oom_kills", "per_connection", "fit", "connections",
                  "connections_from", "need", "basis", "change", "advice"]
VICTIM_COLUMNS = ["host", "pid", "start_ns", "comm", "time", "anon_rss_kb", "sampled", "open_fds", "sockets",
                  "threads", "rss_bytes", "rss_minute_ago_bytes", "memcg_limit_bytes", "memcg_usage_bytes",
                  "foreseen", "last_state"]

_RSS = "(rss_anon_kb + rss_file_kb + rss_shmem_kb) * 1024"
_MEMORY = f"coalesce(memcg_usage_bytes, {_RSS})"

# Each process's newest sample with a memory cgroup (a dying process's last one may have lost it),
# else its newest, with the cgroup's peak over all its samples and whether it was OOM-killed.
_LAST = f"""
WITH mem AS (SELECT host, pid, start_ns, comm, ts_ns, time_ns, {_RSS} AS rss_bytes, memcg_limit_bytes,
                    memcg_usage_bytes, memcg_oom_kills, UNIT,
                    row_number() OVER (PARTITION BY host, pid, start_ns
                                       ORDER BY CASE WHEN memcg_limit_bytes IS NULL THEN 1 ELSE 0 END, ts_ns DESC)
                        AS newest,
                    max(memcg_usage_bytes) OVER (PARTITION BY host, pid, start_ns) AS memcg_peak_bytes
             FROM samples WHERE rss_anon_kb IS NOT NULL OR memcg_usage_bytes IS NOT NULL),
oom AS (SELECT DISTINCT host, pid, start_ns FROM RARE_EVENTS WHERE kind = 'oom_kill')
SELECT m.host, m.pid, m.start_ns, m.comm, m.time_ns, m.rss_bytes, m.memcg_limit_bytes, m.memcg_usage_bytes,
       m.memcg_peak_bytes, m.memcg_oom_kills, m.unit,
       CASE WHEN m.memcg_limit_bytes > 0 THEN CAST(m.memcg_peak_bytes AS DOUBLE) / m.memcg_limit_bytes END AS usage,
       CASE WHEN o.pid IS NULL THEN 0 ELSE 1 END AS killed
FROM mem AS m LEFT JOIN oom AS o ON m.host = o.host AND m.pid = o.pid
                    AND (m.start_ns = o.start_ns OR o.start_ns IS NULL)
WHERE m.newest = 1
"""


def _series(engine: Engine, chosen: pd.DataFrame) -> pd.DataFrame:
    """(sockets, total memory, samples) per distinct socket count of the chosen processes: the
    fit's levels (``advice.memory.memory_levels``, summed here)."""
    return engine.query(
        f"SELECT host, pid, start_ns, sockets, sum({_MEMORY}) AS memory, count(*) AS n, "
        "max(CASE WHEN memcg_usage_bytes IS NULL THEN 0 ELSE 1 END) AS cgroup "
        f"FROM samples WHERE sockets IS NOT NULL AND ({processes_where(chosen)}) "
        f"AND ({_MEMORY}) IS NOT NULL GROUP BY host, pid, start_ns, sockets")


def _maxconns(engine: Engine) -> pd.DataFrame:
    if "maxconn" not in engine.columns("haproxy"):
        return pd.DataFrame(columns=["host", "pid", "maxconn"])
    return engine.query("SELECT host, haproxy_pid AS pid, max(maxconn) AS maxconn FROM haproxy "
                        "WHERE haproxy_pid IS NOT NULL AND maxconn IS NOT NULL GROUP BY host, haproxy_pid")


def fits_on(engine: Engine, chosen: pd.DataFrame) -> dict[tuple[str, int, Any], MemoryFit]:
    """The memory fit of each chosen process (host, pid, start_ns) that has one."""
    if not len(chosen):
        return {}
    points = _series(engine, chosen)
    found = {}
    for (host, pid, start), mine in points.groupby(["host", "pid", "start_ns"], dropna=False, sort=False):
        measure = "cgroup usage" if mine["cgroup"].max() else "RSS"
        fit = memory_fit_levels([(int(s), int(m), int(n)) for s, m, n in
                                 zip(mine["sockets"], mine["memory"], mine["n"], strict=True)], measure)
        if fit is not None:
            found[(str(host), int(pid), None if pd.isna(start) else int(start))] = fit
    return found


def memory_needs_on(engine: Engine, fd_needs: pd.DataFrame | None = None) -> pd.DataFrame:
    """``memory_needs()`` computed by ``engine``; ``fd_needs``: ``fd_needs_on(engine)`` when the
    caller has it already (it is computed here otherwise, when a process's fit needs it)."""
    if "memcg_usage_bytes" not in engine.columns("samples"):
        return pd.DataFrame(columns=MEMORY_COLUMNS)
    # the systemd unit whose MemoryMax is to change (recordings before units were sampled have none)
    unit = "unit" if "unit" in engine.columns("samples") else "CAST(NULL AS VARCHAR) AS unit"
    last = engine.query(_LAST.replace("UNIT", unit).replace("RARE_EVENTS", engine.derived("rare_events")))
    if last.empty:
        return pd.DataFrame(columns=MEMORY_COLUMNS)
    last = last.sort_values(["killed", "usage", "rss_bytes"], ascending=False, na_position="last")
    chosen = pd.concat([last[last["killed"] == 1], last[last["killed"] == 0].head(MAX_PROCESSES)])
    fits = fits_on(engine, chosen)
    maxconns = _maxconns(engine)
    if fd_needs is None:
        fd_needs = fd_needs_on(engine) if fits else pd.DataFrame(columns=["host", "pid", "start_ns", "recommended"])
    rows = []
    for row in chosen.itertuples():
        key = (str(row.host), int(row.pid), None if pd.isna(row.start_ns) else int(row.start_ns))
        limit = None if pd.isna(row.memcg_limit_bytes) else int(row.memcg_limit_bytes)
        peak = None if pd.isna(row.memcg_peak_bytes) else int(row.memcg_peak_bytes)
        fit = fits.get(key)
        connections, what = _connections(row, maxconns, fd_needs) if fit is not None else (None, "")
        said = memory_change(str(row.comm), limit, peak, fit, connections, what,
                             None if pd.isna(row.unit) else str(row.unit))
        found: dict[str, Any] = {
            "per_connection": None if fit is None else fit.per_connection, "fit": "" if fit is None else fit.describe(),
            "connections": connections if said.need is not None else None,
            "connections_from": what if said.need is not None else "", "need": said.need,
            "basis": said.why if said.need is not None else "", "change": said.change.command if said.change else "",
            "advice": said.change}
        rows.append({"host": row.host, "pid": int(row.pid), "start_ns": row.start_ns, "comm": row.comm,
                     "time": pd.Timestamp(int(row.time_ns), unit="ns", tz="UTC"), "rss_bytes": row.rss_bytes,
                     "memcg_limit_bytes": row.memcg_limit_bytes, "memcg_usage_bytes": row.memcg_usage_bytes,
                     "memcg_peak_bytes": row.memcg_peak_bytes, "usage": row.usage,
                     "memcg_oom_kills": row.memcg_oom_kills, **found})
    return pd.DataFrame(rows, columns=MEMORY_COLUMNS)


def _connections(row: Any, maxconns: pd.DataFrame, fd_needs: pd.DataFrame) -> tuple[int | None, str]:
    """How many connections the process must hold (``advice.memory.connections_to_hold``):
    HAProxy's maxconn, else the FD limit the needs model recommends."""
    mine = maxconns[(maxconns["host"].astype(str) == str(row.host)) & (maxconns["pid"] == row.pid)]
    need = fd_needs[(fd_needs["host"].astype(str) == str(row.host)) & (fd_needs["pid"] == row.pid)]
    return connections_to_hold(int(mine["maxconn"].iloc[0]) if len(mine) else None,
                               int(need["recommended"].iloc[0]) if len(need) else None)


def memory_needs(recording: Analyzable) -> pd.DataFrame:
    """Per process with memory figures (the OOM victims first, then those nearest their memory
    cgroup's limit): its last resident memory and cgroup limit and usage, the cgroup's peak usage
    against its limit (``usage``), the memory a connection costs (``per_connection``, bytes, and
    ``fit`` in words), and for the connections it must hold (HAProxy's maxconn, else the FD limit
    recommended for it) the memory ``need``, its ``basis`` and what to ``change`` (in words; the
    advice layer's ``Change`` itself, its MemoryMax value in bytes, in ``advice``; one also for a
    cgroup that peaked near its limit without a fit)."""
    with engine_for(recording) as engine:
        return memory_needs_on(engine)


def oom_victims_on(engine: Engine) -> pd.DataFrame:
    """``oom_victims()`` computed by ``engine``."""
    kills = engine.query("SELECT host, pid, start_ns, comm, time_ns, ts_ns, anon_rss_kb "
                         f"FROM {engine.derived('rare_events')} "
                         "WHERE kind = 'oom_kill' ORDER BY time_ns")
    if kills.empty:
        return pd.DataFrame(columns=VICTIM_COLUMNS)
    has_memory = "memcg_usage_bytes" in engine.columns("samples")
    memory = f"{_RSS} AS rss_bytes, memcg_limit_bytes, memcg_usage_bytes" if has_memory else \
        "NULL AS rss_bytes, NULL AS memcg_limit_bytes, NULL AS memcg_usage_bytes"
    pids = ", ".join(str(int(p)) for p in sorted(set(kills["pid"])))
    samples = engine.query(f"SELECT host, pid, ts_ns, open_fds, sockets, threads, {memory} FROM samples "
                           f"WHERE pid IN ({pids}) ORDER BY ts_ns")
    rows = []
    for kill in kills.itertuples():
        before = samples[(samples["host"].astype(str) == str(kill.host)) & (samples["pid"] == kill.pid)
                         & (samples["ts_ns"] <= kill.ts_ns)]
        row = {"host": kill.host, "pid": int(kill.pid), "start_ns": kill.start_ns, "comm": kill.comm,
               "time": pd.Timestamp(int(kill.time_ns), unit="ns", tz="UTC"), "anon_rss_kb": kill.anon_rss_kb,
               "sampled": None, "open_fds": None, "sockets": None, "threads": None, "rss_bytes": None,
               "rss_minute_ago_bytes": None, "memcg_limit_bytes": None, "memcg_usage_bytes": None,
               "foreseen": False, "last_state": "never sampled"}
        if len(before):
            last = before.iloc[-1]
            # its memory as the newest sample that still saw its cgroup (a dying process's may not)
            limited = before[before["memcg_limit_bytes"].notna()]
            memory = limited.iloc[-1] if len(limited) else last
            minute = before[before["ts_ns"] >= kill.ts_ns - TREND_NS]
            row.update(sampled=(kill.ts_ns - int(last["ts_ns"])) / 1e9, open_fds=last["open_fds"],
                       sockets=last["sockets"], threads=last["threads"], rss_bytes=memory["rss_bytes"],
                       rss_minute_ago_bytes=minute["rss_bytes"].iloc[0] if len(minute) else None,
                       memcg_limit_bytes=memory["memcg_limit_bytes"], memcg_usage_bytes=memory["memcg_usage_bytes"])
            row["foreseen"] = bool(pd.notna(row["memcg_limit_bytes"]) and pd.notna(row["memcg_usage_bytes"])
                                   and row["memcg_usage_bytes"] >= USAGE_WARN * row["memcg_limit_bytes"])
            row["last_state"] = last_state(row)
        rows.append(row)
    return pd.DataFrame(rows, columns=VICTIM_COLUMNS)


def last_state(row: dict[str, Any]) -> str:
    """An OOM victim as last seen, in words: "1.0 s before: 1,382 FDs (1,377 sockets), 1 thread,
    RSS 147 MiB (+12 MiB in the last minute); its cgroup at 149 MiB of 150 MiB (99 %): foreseen"."""
    def known(value: Any) -> bool:
        return value is not None and pd.notna(value)

    parts = [f"{row['sampled']:.1f} s before: {int(row['open_fds']):,} FDs"
             + (f" ({int(row['sockets']):,} sockets)" if known(row["sockets"]) else "")
             + f", {int(row['threads'])} thread{'s' if int(row['threads']) != 1 else ''}"]
    if known(row["rss_bytes"]):
        trend = ""
        if known(row["rss_minute_ago_bytes"]):
            grown = float(row["rss_bytes"]) - float(row["rss_minute_ago_bytes"])
            trend = f" ({'+' if grown >= 0 else '-'}{kib(abs(grown))} in the last minute)"
        parts.append(f"RSS {kib(float(row['rss_bytes']))}{trend}")
    text = ", ".join(parts)
    if known(row["memcg_limit_bytes"]) and known(row["memcg_usage_bytes"]):
        usage, limit = float(row["memcg_usage_bytes"]), float(row["memcg_limit_bytes"])
        text += (f"; its cgroup at {kib(usage)} of {kib(limit)} ({usage / limit:.0%}): "
                 + ("foreseen (fdtrace showed it at its cgroup's limit)" if row["foreseen"] else "not foreseen"))
    return text


def oom_victims(recording: Analyzable) -> pd.DataFrame:
    """Each OOM kill with its victim as the last sample before it saw it: descriptors, sockets,
    threads, resident memory and its trend over the last minute, its memory cgroup's limit and
    usage, and whether fdtrace had it at 80 % or more of that limit (``foreseen``)."""
    with engine_for(recording) as engine:
        return oom_victims_on(engine)


def memory_advice_lines(needs: pd.DataFrame, victims: pd.DataFrame | None = None, several: bool = False) -> list[str]:
    """One line per process whose memory cgroup came near its limit, that was OOM-killed, or whose
    connections will not fit: what it used, what it needs and what to change (``memory_needs()``),
    the same words in ``info``, the report and doctor."""
    killed = set() if victims is None else {(str(r.host), int(r.pid)) for r in victims.itertuples()}
    lines = []
    for row in needs.itertuples():
        was_killed = (str(row.host), int(row.pid)) in killed
        near = pd.notna(row.usage) and row.usage >= USAGE_WARN
        if not (was_killed or near or row.change):
            continue
        where = f" on {row.host}" if several else ""
        text = f"memory of {row.comm} [{row.pid}]{where}: "
        if pd.notna(row.memcg_limit_bytes) and pd.notna(row.memcg_peak_bytes):
            text += (f"its cgroup peaked at {kib(float(row.memcg_peak_bytes))} of {kib(float(row.memcg_limit_bytes))} "
                     f"({row.usage:.0%})")
        elif pd.notna(row.rss_bytes):
            text += f"RSS {kib(float(row.rss_bytes))}, no memory cgroup limit"
        text += ", OOM-killed" if was_killed else ""
        if row.basis:
            text += f"; {row.basis}"
        elif row.fit:
            text += f"; {row.fit}"
        text += f"; {row.change}." if row.change else "."
        lines.append(text)
    return lines


def memory_series_on(engine: Engine, chosen: pd.DataFrame) -> pd.DataFrame:
    """The chosen processes' memory over time: its cgroup's usage and limit, its RSS, and its cgroup."""
    if not len(chosen) or "memcg_usage_bytes" not in engine.columns("samples"):
        return pd.DataFrame(columns=["host", "pid", "start_ns", "time", "rss_bytes", "memcg_usage_bytes",
                                     "memcg_limit_bytes", "cgroup"])
    cgroup = "cgroup" if "cgroup" in engine.columns("samples") else "CAST(NULL AS VARCHAR) AS cgroup"
    found = engine.query(f"SELECT host, pid, start_ns, time_ns, {_RSS} AS rss_bytes, memcg_usage_bytes, "
                         f"memcg_limit_bytes, {cgroup} FROM samples WHERE {processes_where(chosen)} ORDER BY ts_ns")
    found.insert(3, "time", pd.to_datetime(found.pop("time_ns"), unit="ns", utc=True))
    return found
