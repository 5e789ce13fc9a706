"""Headroom of each process over time, from the recording's samples: open FDs against
RLIMIT_NOFILE, and threads against the tightest of the limits that bound them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fdtrace.procfs.thread_limits import THREAD_LIMITS

COLUMNS = ["time", "host", "pid", "start_ns", "comm", "open_fds", "fd_soft_limit", "fd_hard_limit", "headroom",
           "usage", "seconds_to_exhaustion", "threads", "threads_per_s", "thread_limit_kind", "thread_limit",
           "thread_count", "thread_headroom", "thread_usage", "seconds_to_thread_limit"]


def _window_slope(ts: np.ndarray, values: np.ndarray, window_ns: int) -> np.ndarray:
    """Growth per second of ``values`` over the previous window at each sample (NaN at the first)."""
    first = np.searchsorted(ts, ts - window_ns, side="left")
    dt = (ts - ts[first]) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(dt > 0, (values - values[first]) / dt, np.nan)


def _with_system(frame: pd.DataFrame, system: pd.DataFrame) -> pd.DataFrame:
    """The system's threads-max and task count joined to each sample taken in the same round."""
    wanted = ["host", "ts_ns", "threads_max", "threads_total"]
    if system is None or system.empty or not set(wanted) <= set(system.columns):
        return frame.assign(threads_max=np.nan, threads_total=np.nan)
    figures = system[wanted].drop_duplicates(["host", "ts_ns"])
    figures = figures.assign(host=figures["host"].astype(str))
    merged = frame.assign(host=frame["host"].astype(str)).merge(figures, on=["host", "ts_ns"], how="left")
    return merged.assign(host=merged["host"].astype("category"))


def _thread_limits(frame: pd.DataFrame) -> pd.DataFrame:
    """The binding thread limit of every sample: the one with the least room left."""
    rooms, limits, counts = [], [], []
    for _, limit_column, count_column in THREAD_LIMITS:
        limit = pd.to_numeric(frame.get(limit_column, pd.Series(np.nan, index=frame.index)), errors="coerce")
        count = pd.to_numeric(frame.get(count_column, pd.Series(np.nan, index=frame.index)), errors="coerce")
        limits.append(limit.to_numpy(dtype=float))
        counts.append(count.to_numpy(dtype=float))
        rooms.append((limit - count).to_numpy(dtype=float))
    room = np.vstack(rooms)
    known = ~np.isnan(room)
    binding = np.argmin(np.where(known, room, np.inf), axis=0)
    has_limit = known.any(axis=0)
    rows = np.arange(len(frame))
    names = np.array([name for name, _, _ in THREAD_LIMITS], dtype=object)
    frame["thread_limit_kind"] = np.where(has_limit, names[binding], None)
    frame["thread_limit"] = np.where(has_limit, np.vstack(limits)[binding, rows], np.nan)
    frame["thread_count"] = np.where(has_limit, np.vstack(counts)[binding, rows], np.nan)
    frame["thread_headroom"] = np.where(has_limit, room[binding, rows], np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["thread_usage"] = frame["thread_count"] / frame["thread_limit"]
    return frame


def headroom(recording: Any, window_s: float = 30.0) -> pd.DataFrame:
    """Per sample: open FDs and threads against their limits, and the estimated time to each
    limit. See ``fdtrace.analysis.headroom`` for the full description."""
    samples = recording.samples
    if samples.empty or "open_fds" not in samples.columns:
        return pd.DataFrame(columns=COLUMNS)
    frame = _with_system(samples, getattr(recording, "system", None))
    frame = frame.sort_values(["host", "pid", "start_ns", "ts_ns"]).reset_index(drop=True)
    frame["headroom"] = frame["fd_soft_limit"] - frame["open_fds"]
    frame["usage"] = frame["open_fds"] / frame["fd_soft_limit"]
    frame = _thread_limits(frame)
    frame["seconds_to_exhaustion"] = np.nan
    frame["threads_per_s"] = np.nan
    frame["seconds_to_thread_limit"] = np.nan
    window_ns = int(window_s * 1e9)
    for _, group in frame.groupby(["host", "pid", "start_ns"], observed=True, sort=False):
        ts = group["ts_ns"].to_numpy()
        fd_slope = _window_slope(ts, group["open_fds"].to_numpy(dtype=float), window_ns)
        room = group["headroom"].to_numpy(dtype=float)
        thread_room = group["thread_headroom"].to_numpy(dtype=float)
        # The count a shared limit compares with (the user's threads, the cgroup's tasks) grows
        # with other processes too: its own growth, not this process's, says when it runs out.
        count_slope = _window_slope(ts, group["thread_count"].to_numpy(dtype=float), window_ns)
        with np.errstate(divide="ignore", invalid="ignore"):
            eta = np.where(room <= 0, 0.0, np.where(fd_slope > 0, room / fd_slope, np.nan))
            thread_eta = np.where(thread_room <= 0, 0.0,
                                  np.where(count_slope > 0, thread_room / count_slope, np.nan))
        frame.loc[group.index, "seconds_to_exhaustion"] = eta
        frame.loc[group.index, "threads_per_s"] = _window_slope(ts, group["threads"].to_numpy(dtype=float),
                                                                window_ns)
        frame.loc[group.index, "seconds_to_thread_limit"] = thread_eta
    return frame[COLUMNS]


def least_headroom(recording: Any, resource: str = "fds") -> pd.DataFrame:
    """Per process, its fullest sample (highest usage of FDs, or of threads with
    ``resource="threads"``), fullest processes first."""
    series = headroom(recording)
    if series.empty:
        return series
    usage = {"fds": "usage", "threads": "thread_usage"}[resource]
    fullest = series.sort_values(usage, ascending=False).groupby(["host", "pid", "start_ns"], observed=True).head(1)
    return fullest.reset_index(drop=True)
