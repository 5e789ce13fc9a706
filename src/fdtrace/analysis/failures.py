"""The first failure of each process, and what followed it in the others."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd

from fdtrace.policy import FD_EXHAUSTION_ERRNOS


def failures(recording_or_events: Any) -> pd.DataFrame:
    """Every failure that ends or cripples a process: EMFILE/ENFILE from any syscall, OOM kills,
    kills by a signal and non-zero exits, with what it was."""
    events = getattr(recording_or_events, "events", recording_or_events)
    fd = events["errno"].isin(FD_EXHAUSTION_ERRNOS)
    oom = events["kind"] == "oom_kill"
    exits = events["kind"] == "process_exit"
    killed = exits & events["signal"].notna() & (events["signal"].astype(object) != "")
    bad_exit = exits & events["exit_code"].fillna(0).ne(0)
    chosen = events[fd | oom | killed | bad_exit].copy()
    signal = chosen["signal"].astype(object).fillna("").astype(str)
    what = pd.Series("", index=chosen.index)
    what[fd[chosen.index]] = chosen["syscall"].astype(str) + " " + chosen["errno"].astype(str)
    what[oom[chosen.index]] = "OOM kill"
    what[killed[chosen.index]] = "killed by " + signal[killed[chosen.index]]
    what[bad_exit[chosen.index]] = "exit " + chosen["exit_code"].astype("Int64").astype(str)
    chosen["failure"] = what
    return chosen[["time", "host", "pid", "start_ns", "comm", "kind", "failure"]].sort_values("time")


def incidents(recording_or_events: Any, window_s: float = 10.0) -> pd.DataFrame:
    """The first failure of each process, in time order, each with what followed it in the other
    processes within ``window_s``. See ``fdtrace.analysis`` for the full description."""
    all_failures = failures(recording_or_events)
    firsts = all_failures.groupby(["host", "pid", "start_ns"], observed=True, dropna=False).head(1)
    events = getattr(recording_or_events, "events", recording_or_events)
    symptoms = events[(events["errno"] != "") | events["kind"].isin(["process_exit", "oom_kill"])]
    rows = []
    for order, first in enumerate(firsts.itertuples(index=False)):
        end = first.time + pd.Timedelta(seconds=window_s)
        after = symptoms[(symptoms["time"] > first.time) & (symptoms["time"] <= end) & (symptoms["pid"] != first.pid)]
        labels = Counter(
            f"{comm}: {kind if not err else f'{sc} {err}'}"
            for comm, kind, sc, err in zip(after["comm"].astype(str), after["kind"].astype(str),
                                           after["syscall"].astype(str), after["errno"].astype(str), strict=True))
        total = int((all_failures["pid"] == first.pid).sum())
        rows.append({"time": first.time, "host": first.host, "pid": first.pid, "comm": first.comm,
                     "failure": first.failure, "first_overall": order == 0, "failures_of_process": total,
                     "followed_by": dict(labels.most_common())})
    return pd.DataFrame(rows, columns=["time", "host", "pid", "comm", "failure", "first_overall",
                                       "failures_of_process", "followed_by"])
