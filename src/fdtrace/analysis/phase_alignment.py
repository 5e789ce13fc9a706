"""Events and spikes labelled with the training phase they happened in."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fdtrace.schema import NOT_FAILURES

OUTSIDE = "outside any phase"


def align_events(events: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """Each event with ``rank``, ``step`` and ``phase`` of its process (the innermost phase that
    contains it: an all-reduce bucket rather than the backward around it)."""
    labelled = events.copy()
    labelled["rank"] = pd.array([pd.NA] * len(events), dtype="Int32")
    labelled["step"] = pd.array([pd.NA] * len(events), dtype="Int64")
    phase = np.full(len(events), OUTSIDE, dtype=object)
    ranks = labelled["rank"].to_numpy(dtype=object)
    steps = labelled["step"].to_numpy(dtype=object)
    if len(events) and len(phases):
        positions = np.arange(len(events))
        for pid, marks in phases.groupby("pid"):
            mine = positions[events["pid"].to_numpy() == pid]
            if not len(mine):
                continue
            ts = events["ts_ns"].to_numpy()[mine]
            order = np.argsort(ts, kind="stable")
            sorted_ts = ts[order]
            rank = marks["rank"].iloc[0]
            ranks[mine] = rank
            # Paint the longest phases first, so the innermost one is what stays.
            by_length = marks.assign(length=marks["end_mono_ns"] - marks["start_mono_ns"]).sort_values(
                "length", ascending=False)
            for mark in by_length.itertuples():
                lo = np.searchsorted(sorted_ts, mark.start_mono_ns, side="left")
                hi = np.searchsorted(sorted_ts, mark.end_mono_ns, side="right")
                chosen = mine[order[lo:hi]]
                phase[chosen] = mark.phase if mark.phase != "user" else f"user:{mark.name}"
                steps[chosen] = mark.step
    labelled["rank"] = pd.array(ranks, dtype="Int32")
    labelled["step"] = pd.array(steps, dtype="Int64")
    labelled["phase"] = pd.Categorical(phase)
    return labelled


def align_spikes(spikes: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """Each spike with the phase every rank was in at its peak (``phase_by_rank``) and the
    steps, by wall time."""
    labelled = spikes.copy()
    by_rank: list[dict[Any, str]] = []
    steps: list[list[int]] = []
    starts = pd.to_datetime(phases.get("start_wall_ns", pd.Series(dtype="int64")), utc=True)
    ends = pd.to_datetime(phases.get("end_wall_ns", pd.Series(dtype="int64")), utc=True)
    for peak in labelled.get("peak_time", pd.Series(dtype=object)):
        active = phases[(starts <= peak) & (ends >= peak)] if len(phases) else phases
        innermost = active.assign(length=active["end_mono_ns"] - active["start_mono_ns"]).sort_values("length") \
            .groupby("rank").head(1) if len(active) else active
        by_rank.append({int(r.rank): r.phase for r in innermost.itertuples() if pd.notna(r.rank)})
        steps.append(sorted({int(s) for s in innermost["step"].dropna()}) if len(innermost) else [])
    labelled["phase_by_rank"] = by_rank
    labelled["steps"] = steps
    return labelled


STAT_COLUMNS = ["rank", "phase", "instances", "seconds", "sockets", "closes", "connects", "accepts", "errors",
                "threads_started"]


def phase_stats_on(engine: Any, phases: pd.DataFrame) -> pd.DataFrame:
    """``phase_stats()`` with the events counted in ``engine`` (an ``fdtrace.analysis.engines``
    Engine): each event of a rank's process labelled with its innermost phase (the shortest that
    contains it; of equal ones the later mark, as ``align_events`` paints them) by a join in the
    engine, so that only the counts come back."""
    from fdtrace.analysis.engines import quote

    # A phase without a rank or an end (its part lacked them, or the job died in it) is counted nowhere.
    phases = phases[phases["rank"].notna() & phases["end_mono_ns"].notna()] if not phases.empty else phases
    if phases.empty:
        return pd.DataFrame(columns=STAT_COLUMNS)
    spent = phases.assign(seconds=(phases["end_mono_ns"] - phases["start_mono_ns"]) / 1e9)
    spent["phase"] = np.where(spent["phase"] == "user", "user:" + spent["name"].fillna(""), spent["phase"])
    totals = spent.groupby(["rank", "phase"]).agg(instances=("phase", "size"), seconds=("seconds", "sum"))
    hosts = phases["host"].astype(str) if "host" in phases.columns else pd.Series("", index=phases.index)
    marks = pd.DataFrame({"host": hosts.to_numpy(), "pid": phases["pid"].astype("int64").to_numpy(),
                          "label": spent["phase"].astype(str).to_numpy(),
                          "s": phases["start_mono_ns"].astype("int64").to_numpy(),
                          "e": phases["end_mono_ns"].astype("int64").to_numpy(), "seq": np.arange(len(phases))})
    first_rank = marks.assign(rank=phases["rank"].to_numpy()).groupby(["host", "pid"], sort=False)["rank"].first()
    ranks = first_rank.reset_index()
    ranks["rank"] = ranks["rank"].astype("int64")
    by_host = "host" in phases.columns
    same_host = "AND ev.host = m.host " if by_host else ""
    rank_host = " AND i.host = r.host" if by_host else ""
    answers = ", ".join(quote(e) for e in NOT_FAILURES)
    counted = engine.query(f"""
WITH ev AS (SELECT e.host, e.pid, e.tid, e.ts_ns, e.kind, coalesce(e.errno, '') AS errno, count(*) AS n
            FROM events AS e WHERE e.pid IN (SELECT pid FROM phase_ranks) GROUP BY 1, 2, 3, 4, 5, 6),
hits AS (SELECT ev.*, m.label, m.e - m.s AS length, m.seq FROM ev LEFT JOIN phase_marks AS m
         ON ev.pid = m.pid {same_host}AND ev.ts_ns >= m.s AND ev.ts_ns <= m.e),
innermost AS (SELECT *, row_number() OVER (PARTITION BY host, pid, tid, ts_ns, kind, errno
                                           ORDER BY length NULLS LAST, seq DESC) AS r FROM hits)
SELECT r.rank, coalesce(i.label, {quote(OUTSIDE)}) AS phase,
       sum(CASE WHEN i.kind = 'socket' AND i.errno = '' THEN i.n ELSE 0 END) AS sockets,
       sum(CASE WHEN i.kind = 'close' THEN i.n ELSE 0 END) AS closes,
       sum(CASE WHEN i.kind = 'connect' THEN i.n ELSE 0 END) AS connects,
       sum(CASE WHEN i.kind = 'accept' THEN i.n ELSE 0 END) AS accepts,
       sum(CASE WHEN i.errno NOT IN ({answers}) THEN i.n ELSE 0 END) AS errors,
       sum(CASE WHEN i.kind = 'thread_start' THEN i.n ELSE 0 END) AS threads_started
FROM innermost AS i JOIN phase_ranks AS r ON i.pid = r.pid{rank_host} WHERE i.r = 1 GROUP BY 1, 2""",
                           inputs={"phase_marks": marks, "phase_ranks": ranks})
    counted = counted.set_index(["rank", "phase"])
    stats = totals.join(counted, how="outer").fillna(0).reset_index()
    for column in STAT_COLUMNS[4:] + ["instances"]:
        stats[column] = stats[column].astype("int64")
    return stats[STAT_COLUMNS].sort_values(["rank", "phase"], ignore_index=True)
