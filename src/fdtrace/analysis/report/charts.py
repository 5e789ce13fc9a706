"""The report's charts: one Plotly figure whose panels share one zoomable wall-clock axis, written
into the page with plotly.js itself, so that the report opens offline."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fdtrace.display import html_shown
from fdtrace.integrations.phases.collect import PHASE_COLOURS

if TYPE_CHECKING:
    from fdtrace.analysis.report.model import Report

#: One colour per process, the same in every panel.
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
#: Marker symbols of the failures drawn one by one.
MARKER_SYMBOLS = {"OOM kill": "x", "Go thread limit": "star", "killed by a signal": "diamond",
                  "first failure": "triangle-up"}
PANEL_HEIGHT = 230


def _naive(times: Any) -> pd.DatetimeIndex:
    """UTC times without their zone: Plotly then shows them as they are, on a UTC axis."""
    index = pd.DatetimeIndex(times)
    return index.tz_convert("UTC").tz_localize(None) if index.tz is not None else index


def panels_of(report: Report) -> list[str]:
    """The titles of the panels the report has data for, top to bottom."""
    titles = []
    if report.fd_series:
        titles.append("Open FDs of the fullest processes (dashed: their soft limits)")
    if len(report.failure_rate.columns) or len(report.markers):
        titles.append("EMFILE/ENFILE per second, by process (markers: OOM kills, Go thread limits, kills, "
                      "first failures)")
    if report.thread_series:
        titles.append("Threads of the processes nearest a thread limit (dashed: the limit, where it counts "
                      "their own threads and is near them; others are said below the chart)")
    if report.memory_series:
        titles.append("Memory of the processes nearest their memory cgroup's limit: each cgroup's usage, % of its "
                      "own limit (dashed: 100 %)")
    if len(report.call_rate.columns):
        titles.append("socket, accept, connect and close calls per second, by process (log scale)")
    if len(report.phase_marks):
        titles.append("Training phases, per rank")
    return titles


def figure(report: Report) -> go.Figure | None:
    """The report's figure, or None when the recording has nothing to draw."""
    titles = panels_of(report)
    if not titles:
        return None
    height = PANEL_HEIGHT * len(titles) + 160
    fig = make_subplots(rows=len(titles), cols=1, shared_xaxes=True, vertical_spacing=75 / height,
                        subplot_titles=titles)
    colours: dict[str, str] = {}

    def colour(label: str) -> str:
        return colours.setdefault(label, PALETTE[len(colours) % len(PALETTE)])

    row = 0

    def next_row() -> int:
        nonlocal row
        row += 1
        return row

    if report.fd_series:
        at = next_row()
        for raw, frame in report.fd_series.items():
            label = html_shown(raw)  # Plotly reads HTML in names: a process's name is text
            times = _naive(frame["time"])
            fig.add_trace(go.Scatter(x=times, y=frame["open_fds"], name=label, legendgroup=label,
                                     line={"color": colour(label)},
                                     hovertemplate="%{x|%H:%M:%S.%L}<br>%{y} open FDs<extra>" + label + "</extra>"),
                          row=at, col=1)
            fig.add_trace(go.Scatter(x=times, y=frame["fd_soft_limit"], name=f"{label} soft limit", legendgroup=label,
                                     showlegend=False, line={"color": colour(label), "dash": "dash", "width": 1},
                                     hovertemplate="soft limit %{y}<extra>" + label + "</extra>"), row=at, col=1)
        fig.update_yaxes(title_text="open FDs", row=at, col=1)
    if len(report.failure_rate.columns) or len(report.markers):
        at = next_row()
        times = _naive(report.failure_rate.index)
        for raw in report.failure_rate.columns:
            label = html_shown(raw)
            fig.add_trace(go.Scatter(x=times, y=report.failure_rate[raw], name=label, legendgroup=label,
                                     showlegend=label not in colours, line={"color": colour(label)},
                                     hovertemplate="%{x|%H:%M:%S}<br>%{y} EMFILE/ENFILE<extra>" + label + "</extra>"),
                          row=at, col=1)
        for kind, marks in report.markers.groupby("marker", sort=False):
            fig.add_trace(go.Scatter(x=_naive(marks["time"]), y=[0] * len(marks), mode="markers", name=html_shown(kind),
                                     marker={"symbol": MARKER_SYMBOLS.get(str(kind), "circle"), "size": 11,
                                             "color": "black"},
                                     text=[html_shown(t) for t in marks["text"]],
                                     hovertemplate="%{x|%H:%M:%S.%L}<br>%{text}<extra></extra>"),
                          row=at, col=1)
        fig.update_yaxes(title_text="failures / s", row=at, col=1)
    # Threads, then memory: each process's line and its limit dashed; (series, axis title, (column,
    # hover), (limit column, hover), the column naming the limit in its hover).
    for series, unit, value, limit, named in (
            (report.thread_series, "threads", ("threads", "%{x|%H:%M:%S}<br>%{y} threads"),
             ("thread_limit", "%{text} %{y}"), "thread_limit_kind"),
            (report.memory_series, "% of its cgroup's limit", ("memory_pct", "%{x|%H:%M:%S}<br>%{y:.1f} %"),
             ("limit_pct", "cgroup limit"), None)):
        if not series:
            continue
        at = next_row()
        for raw, frame in series.items():
            label = html_shown(raw)
            legend = label not in colours
            _with_limit(fig, at, label, colour(label), legend, frame, value, limit, frame[named] if named else None)
        fig.update_yaxes(title_text=unit, row=at, col=1)
    if len(report.call_rate.columns):
        at = next_row()
        times = _naive(report.call_rate.index)
        for raw in report.call_rate.columns:
            label = html_shown(raw)
            fig.add_trace(go.Scatter(x=times, y=report.call_rate[raw].where(report.call_rate[raw] > 0), name=label,
                                     legendgroup=label, showlegend=label not in colours, line={"color": colour(label)},
                                     connectgaps=False,
                                     hovertemplate="%{x|%H:%M:%S}<br>%{y} calls<extra>" + label + "</extra>"),
                          row=at, col=1)
        fig.update_yaxes(title_text="calls / s", type="log", row=at, col=1)
    if len(report.phase_marks):
        _phase_bands(fig, report.phase_marks, next_row())
    fig.update_xaxes(type="date", showticklabels=True, tickformat="%H:%M:%S\n%Y-%m-%d")
    fig.update_xaxes(title_text="time (UTC)", row=len(titles), col=1)
    fig.update_layout(height=height, margin={"l": 70, "r": 20, "t": 110, "b": 50}, hovermode="closest",
                      legend={"orientation": "h", "x": 0, "y": 1 + 70 / height, "yanchor": "bottom"},
                      template="plotly_white")
    return fig


def _with_limit(fig: go.Figure, at: int, label: str, colour: str, legend: bool, frame: pd.DataFrame,
                value: tuple[str, str], limit: tuple[str, str], limit_text: Any = None) -> None:
    """One process's line in the panel ``at`` and its limit dashed in the same colour: ``value``
    and ``limit`` are (column, hover template)."""
    times = _naive(frame["time"])
    fig.add_trace(go.Scatter(x=times, y=frame[value[0]], name=label, legendgroup=label, showlegend=legend,
                             line={"color": colour}, hovertemplate=value[1] + "<extra>" + label + "</extra>"),
                  row=at, col=1)
    fig.add_trace(go.Scatter(x=times, y=frame[limit[0]], legendgroup=label, showlegend=False,
                             line={"color": colour, "dash": "dash", "width": 1}, text=limit_text,
                             hovertemplate=limit[1] + "<extra>" + label + "</extra>"), row=at, col=1)


def _phase_bands(fig: go.Figure, marks: pd.DataFrame, at: int) -> None:
    """Each rank's phases as bars on its own line (all-reduces in the upper half: they overlap
    the backward pass), one trace per phase."""
    for phase, rows in marks.groupby("phase", sort=True):
        xs: list[Any] = []
        ys: list[Any] = []
        low, high = (0.05, 0.4) if phase == "allreduce" else (-0.4, 0.0)
        for mark in rows.itertuples():
            start, end = (pd.Timestamp(int(mark.start_wall_ns)), pd.Timestamp(int(mark.end_wall_ns)))
            xs += [start, end, end, start, start, None]
            ys += [mark.rank + low, mark.rank + low, mark.rank + high, mark.rank + high, mark.rank + low, None]
        fig.add_trace(go.Scatter(x=xs, y=ys, fill="toself", mode="lines", name=html_shown(phase), line={"width": 0},
                                 fillcolor=PHASE_COLOURS.get(str(phase), "#cccccc"), hoveron="fills",
                                 hoverinfo="name"), row=at, col=1)
    fig.update_yaxes(title_text="rank", dtick=1, row=at, col=1)


def figure_html(report: Report) -> str:
    """The figure as an HTML fragment holding plotly.js (no network needed to open it)."""
    fig = figure(report)
    if fig is None:
        return "<p>No events.</p>"
    return str(fig.to_html(full_html=False, include_plotlyjs=True, config={"displaylogo": False}))


def scale_figure_html(curve: pd.DataFrame) -> str:
    """Each owner's descriptors against the world size, per kind of rank (the store's host and the
    others), on log axes: an HTML fragment that uses the plotly.js the timeline's figure carries."""
    if curve.empty:
        return ""
    roles = list(dict.fromkeys(curve["role"]))
    fig = make_subplots(rows=1, cols=len(roles), subplot_titles=roles, shared_yaxes=True)
    for column, role in enumerate(roles, start=1):
        mine = curve[curve["role"] == role]
        for owner, line in mine.groupby("owner", sort=False):
            if not line["descriptors"].any():
                continue
            fig.add_trace(go.Scatter(x=line["world"], y=line["descriptors"], mode="lines+markers", name=str(owner),
                                     legendgroup=str(owner), showlegend=column == 1), row=1, col=column)
        fig.update_xaxes(type="log", title_text="world size (ranks)", row=1, col=column)
    fig.update_yaxes(type="log")  # every panel's: shared axes of two types are not matched (plotly.js warns)
    fig.update_yaxes(title_text="descriptors", row=1, col=1)
    fig.update_layout(height=380, margin={"t": 40, "b": 40}, title_text="Descriptors by owner against the world size")
    return str(fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False}))
