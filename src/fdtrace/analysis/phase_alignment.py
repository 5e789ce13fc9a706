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
        by_rank.append({int(r.rank): r.phase for r in innermost.itertuples()})
        steps.append(sorted({int(s) for s in innermost["step"]}) if len(innermost) else [])
    labelled["phase_by_rank"] = by_rank
    labelled["steps"] = steps
    return labelled


def phase_stats(events: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, phase): instances, time spent, sockets opened and closed, connects, accepts,
    failed calls and threads started in it."""
    columns = ["rank", "phase", "instances", "seconds", "sockets", "closes", "connects", "accepts", "errors",
               "threads_started"]
    if phases.empty:
        return pd.DataFrame(columns=columns)
    spent = phases.assign(seconds=(phases["end_mono_ns"] - phases["start_mono_ns"]) / 1e9)
    spent["phase"] = np.where(spent["phase"] == "user", "user:" + spent["name"].fillna(""), spent["phase"])
    totals = spent.groupby(["rank", "phase"]).agg(instances=("phase", "size"), seconds=("seconds", "sum"))
    labelled = align_events(events, phases)
    labelled = labelled[labelled["rank"].notna()]
    kinds = labelled["kind"].astype(str)
    counted = pd.DataFrame({
        "rank": labelled["rank"].astype(int), "phase": labelled["phase"].astype(str),
        "sockets": (kinds == "socket") & (labelled["errno"] == ""), "closes": kinds == "close",
        "connects": kinds == "connect", "accepts": kinds == "accept",
        "errors": ~labelled["errno"].isin(NOT_FAILURES), "threads_started": kinds == "thread_start",
    }).groupby(["rank", "phase"]).sum()
    stats = totals.join(counted, how="outer").fillna(0).reset_index()
    for column in columns[4:] + ["instances"]:
        stats[column] = stats[column].astype("int64")
    return stats[columns].sort_values(["rank", "phase"], ignore_index=True)
