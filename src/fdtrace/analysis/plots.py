"""Plots of what the analysis functions computed (needs matplotlib: ``pip install
'fdtrace[plots]'``). Each takes the DataFrame a computing function returned and an optional
matplotlib Axes, draws on it, and returns it; none computes anything of its own.

    from fdtrace.analysis import load, rates, headroom
    from fdtrace.analysis import plots
    rec = load("rec")
    ax = plots.rates(rates(rec, kind="socket"))
    plots.phase_bands(rec.phases, ax=ax)
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from fdtrace.integrations.phases.collect import PHASE_COLOURS


def _axes(ax: Any) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(10, 4))[1]


def rates(counts: pd.DataFrame, ax: Any = None, title: str = "events per bin") -> Any:
    """One line per column of a ``rates()`` frame, over its time index."""
    ax = _axes(ax)
    for column in counts.columns:
        ax.plot(counts.index, counts[column].to_numpy(), label=str(column), drawstyle="steps-post")
    ax.set_title(title)
    ax.set_ylabel("count")
    if len(counts.columns) > 1:
        ax.legend(loc="upper left", fontsize="small")
    return ax


def spikes(found: pd.DataFrame, ax: Any = None) -> Any:
    """Shade each interval of a ``spikes()`` frame and mark its peak."""
    ax = _axes(ax)
    for spike in found.itertuples():
        ax.axvspan(spike.start, spike.end, color="#e53935", alpha=0.15, linewidth=0)
        ax.annotate(f"peak {spike.peak:g}", (spike.peak_time, spike.peak), fontsize="small", color="#b71c1c")
    return ax


def headroom(series: pd.DataFrame, pid: int, ax: Any = None, resource: str = "fds") -> Any:
    """One process's open FDs (or threads, ``resource="threads"``) against its limit, from a
    ``headroom()`` frame."""
    ax = _axes(ax)
    mine = series[series["pid"] == pid].sort_values("time")
    used, limit, label = (("open_fds", "fd_soft_limit", "open FDs") if resource == "fds"
                          else ("thread_count", "thread_limit", "threads (as the limit counts them)"))
    ax.plot(mine["time"], mine[used].to_numpy(dtype=float), label=label)
    ax.plot(mine["time"], mine[limit].to_numpy(dtype=float), label="limit", linestyle="--", color="#c62828")
    comm = mine["comm"].iloc[0] if len(mine) else "?"
    ax.set_title(f"pid {pid} ({comm}): {label} against the limit")
    ax.legend(loc="upper left", fontsize="small")
    return ax


def phase_bands(phases: pd.DataFrame, ax: Any = None, rank: int | None = None) -> Any:
    """The training phases of one rank (the lowest when not given) as bands behind the plot,
    innermost on top, from a recording's ``phases`` table."""
    ax = _axes(ax)
    if phases is None or len(phases) == 0:
        return ax
    chosen = rank if rank is not None else int(phases["rank"].dropna().min())
    mine = phases[phases["rank"] == chosen].sort_values("start_wall_ns")
    drawn = set()
    for row in mine.itertuples():
        start = pd.Timestamp(row.start_wall_ns, unit="ns", tz="UTC")
        end = pd.Timestamp(row.end_wall_ns, unit="ns", tz="UTC")
        label = row.phase if row.phase not in drawn else "_nolegend_"
        drawn.add(row.phase)
        ax.axvspan(start, end, color=PHASE_COLOURS.get(row.phase, "#e0e0e0"), alpha=0.5, linewidth=0,
                   label=label, zorder=0)
    return ax
