"""FD headroom of each process over time, from the recording's samples."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def headroom(recording: Any, window_s: float = 30.0) -> pd.DataFrame:
    """Per sample: open FDs against the limits and the estimated time to exhaustion.
    See ``fdtrace.analysis`` for the full description."""
    samples = recording.samples
    columns = ["time", "host", "pid", "start_ns", "comm", "open_fds", "fd_soft_limit", "fd_hard_limit",
               "headroom", "usage", "seconds_to_exhaustion", "threads", "threads_per_s"]
    if samples.empty or "open_fds" not in samples.columns:
        return pd.DataFrame(columns=columns)
    frame = samples.sort_values(["host", "pid", "start_ns", "ts_ns"]).reset_index(drop=True)
    frame["headroom"] = frame["fd_soft_limit"] - frame["open_fds"]
    frame["usage"] = frame["open_fds"] / frame["fd_soft_limit"]
    frame["seconds_to_exhaustion"] = np.nan
    frame["threads_per_s"] = np.nan
    window_ns = int(window_s * 1e9)
    for _, group in frame.groupby(["host", "pid", "start_ns"], observed=True, sort=False):
        ts = group["ts_ns"].to_numpy()
        fds = group["open_fds"].to_numpy(dtype=float)
        threads = group["threads"].to_numpy(dtype=float)
        first = np.searchsorted(ts, ts - window_ns, side="left")
        dt = (ts - ts[first]) / 1e9
        room = group["headroom"].to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):  # NaN where there is no slope yet
            fd_slope = np.where(dt > 0, (fds - fds[first]) / dt, np.nan)
            thread_slope = np.where(dt > 0, (threads - threads[first]) / dt, np.nan)
            eta = np.where(room <= 0, 0.0, np.where(fd_slope > 0, room / fd_slope, np.nan))
        frame.loc[group.index, "seconds_to_exhaustion"] = eta
        frame.loc[group.index, "threads_per_s"] = thread_slope
    return frame[columns]


def least_headroom(recording: Any) -> pd.DataFrame:
    """Per process, its fullest sample (highest usage), fullest processes first."""
    series = headroom(recording)
    if series.empty:
        return series
    fullest = series.sort_values("usage", ascending=False).groupby(["host", "pid", "start_ns"], observed=True).head(1)
    return fullest.reset_index(drop=True)
