"""`fdtrace report`: one self-contained HTML file (or Markdown) a postmortem reader can open
without Python: summary, timeline, spikes, headroom, incidents, losses and the limits to change."""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from fdtrace.analysis import call_sites
from fdtrace.analysis import headroom_series as headroom_module
from fdtrace.analysis.binning import binned_counts, pivot_rates
from fdtrace.analysis.destinations import destinations_on
from fdtrace.analysis.engines import Engine, quote
from fdtrace.analysis.engines.dataset import engine_for, thread_starts
from fdtrace.analysis.failures import as_time, failures_on, incidents_on
from fdtrace.analysis.fleet import cascade_from, fleet_heat_on
from fdtrace.analysis.phase_alignment import align_spikes, phase_stats_on
from fdtrace.analysis.spike_finder import spikes
from fdtrace.integrations.phases.collect import PHASE_COLOURS
from fdtrace.policy import FD_EXHAUSTION_ERRNOS, GO_THREADS_ADVICE, USAGE_WARN, with_margin
from fdtrace.schema import STATS

#: The event columns the report reads (a large recording is loaded with these only).
EVENT_COLUMNS = ("ts_ns", "time", "pid", "start_ns", "comm", "kind", "syscall", "errno", "signal", "exit_code",
                 "anon_rss_kb", "file_rss_kb", "oom_score_adj", "peer_addr", "peer_port", "tid", "stack_id")
SOCKET_KINDS = ["socket", "accept", "connect", "close"]


@dataclass
class Report:
    """The report's content, rendered by ``to_html`` or ``to_markdown``."""

    title: str
    summary: list[tuple[str, str]]
    socket_rate: pd.DataFrame
    fd_series: dict[str, pd.DataFrame]  # label -> frame of time, open_fds, fd_soft_limit
    error_rate: pd.DataFrame
    spikes: pd.DataFrame
    headroom: pd.DataFrame
    incidents: pd.DataFrame
    losses: pd.DataFrame
    recommendations: list[str] = field(default_factory=list)
    phase_stats: pd.DataFrame = field(default_factory=pd.DataFrame)
    destinations: pd.DataFrame = field(default_factory=pd.DataFrame)
    leaks: pd.DataFrame = field(default_factory=pd.DataFrame)
    threads: pd.DataFrame = field(default_factory=pd.DataFrame)  # census at each process's most threads
    thread_sites: pd.DataFrame = field(default_factory=pd.DataFrame)
    bands: list[tuple[pd.Timestamp, pd.Timestamp, str]] = field(default_factory=list)  # phases of one rank
    # Several hosts: hosts by time (fleet.fleet_heat_on), the order they failed in, their clocks.
    heat: pd.DataFrame = field(default_factory=pd.DataFrame)
    cascade: pd.DataFrame = field(default_factory=pd.DataFrame)
    clocks: pd.DataFrame = field(default_factory=pd.DataFrame)


def build(recording: Any, top: int = 3) -> Report:
    """Compute every section from a recording: loaded (``load()``) or in an engine
    (``load(..., engine="duckdb")``), whose tables are reduced there."""
    with engine_for(recording) as engine:
        return _build(recording, engine, top)


def _build(recording: Any, engine: Engine, top: int) -> Report:
    # One pass over the events for every rate the report draws.
    counted = binned_counts(engine, "1s", ("kind", "comm", "errno"))
    socket_rate = pivot_rates(counted, kind=SOCKET_KINDS, by="kind")
    error_rate = pivot_rates(counted, errno=sorted(FD_EXHAUSTION_ERRNOS), by=None)
    least = headroom_module.least_headroom_on(engine)
    fd_series = {}
    chosen = least.head(top)
    if len(chosen):
        which = " OR ".join(f"(host = {quote(str(r.host))} AND pid = {int(r.pid)} AND start_ns "
                            f"{'IS NULL' if pd.isna(r.start_ns) else f'= {int(r.start_ns)}'})"
                            for r in chosen.itertuples())
        series = headroom_module.headroom_on(engine, where=which)
        for row in chosen.itertuples():
            mine = series[(series["host"] == row.host) & (series["pid"] == row.pid)
                          & (series["start_ns"].fillna(-1) == (-1 if pd.isna(row.start_ns) else row.start_ns))]
            fd_series[f"{row.comm} [{row.pid}]"] = mine[["time", "open_fds", "fd_soft_limit"]]
    kinds = counted.groupby("kind").agg(n=("n", "sum"), first=("first", "min"), last=("last", "max")).reset_index()
    kinds = kinds.sort_values(["n", "kind"], ascending=[False, True])
    total = int(kinds["n"].sum()) if len(kinds) else 0
    spans = [(m.get("host"), m.get("kernel"), m.get("complete")) for m in recording.meta.values()]
    summary = [
        ("hosts", ", ".join(f"{h} (kernel {k}{'' if c else ', recorder did not stop cleanly'})" for h, k, c in spans)),
        ("span", f"{as_time(kinds['first']).min()} to {as_time(kinds['last']).max()}" if total else "no events"),
        ("events", f"{total:,}"),
    ]
    if total:
        summary.append(("by kind", ", ".join(f"{r.kind} {r.n:,}" for r in kinds.itertuples())))
    losses = recording.losses
    lost = {name: int(losses[name].sum()) for name in STATS if name in losses.columns}
    summary.append(("events lost", f"{sum(lost.values()):,}" + "".join(f", {k} {v:,}" for k, v in lost.items() if v)))
    if recording.skipped:
        summary.append(("unreadable files skipped", str(len(recording.skipped))))
    spike_table = spikes(pivot_rates(counted, kind=SOCKET_KINDS, by="comm"))
    phases = getattr(recording, "phases", pd.DataFrame())
    stats, bands = pd.DataFrame(), []
    if len(phases):
        stats = phase_stats_on(engine, phases)
        spike_table = align_spikes(spike_table, phases)
        first_rank = phases[phases["rank"] == phases["rank"].min()]
        for mark in first_rank[first_rank["phase"].isin(BAND_PHASES)].itertuples():
            bands.append((pd.Timestamp(mark.start_wall_ns, tz="UTC"), pd.Timestamp(mark.end_wall_ns, tz="UTC"),
                          mark.phase))
    loss_rows = losses[losses[list(lost)].sum(axis=1) > 0] if lost and len(losses) else pd.DataFrame()
    found = failures_on(engine)
    several = len(recording.meta) > 1
    clocks = getattr(recording, "clock_offsets", None)
    return Report(
        title=f"fdtrace report: {', '.join(recording.meta)}",
        summary=summary, socket_rate=socket_rate, fd_series=fd_series, error_rate=error_rate,
        spikes=spike_table, headroom=least, incidents=incidents_on(engine, found=found), losses=loss_rows,
        recommendations=recommendations(recording, least, engine), phase_stats=stats, bands=bands,
        destinations=destinations_on(engine), leaks=_leaks(recording), threads=_census_at_peak(recording),
        thread_sites=_thread_sites(engine, recording),
        heat=fleet_heat_on(engine) if several else pd.DataFrame(),
        cascade=cascade_from(found) if several else pd.DataFrame(),
        clocks=clocks if several and clocks is not None else pd.DataFrame(),
    )


def _leaks(recording: Any) -> pd.DataFrame:
    sites = getattr(recording, "fd_sites", None)
    if sites is None or not len(sites):
        return pd.DataFrame(columns=SITE_COLUMNS)
    end = int(recording.losses["ts_ns"].max()) if len(recording.losses) else None
    found = call_sites.leaks(sites, recording.stacks, end_ns=end)
    return found[SITE_COLUMNS].head(30)


def _census_at_peak(recording: Any) -> pd.DataFrame:
    """Each process's thread census at the round where it had the most threads."""
    census = call_sites.thread_census(getattr(recording, "thread_census", None))
    if not len(census):
        return census
    totals = census.groupby(["host", "pid", "time"], observed=True)["threads"].sum().reset_index()
    peaks = totals.loc[totals.groupby(["host", "pid"], observed=True)["threads"].idxmax()]
    at_peak = census.merge(peaks[["host", "pid", "time"]], on=["host", "pid", "time"])
    return at_peak[["time", "pid", "comm", "syscall", "fd_kind", "threads"]].head(40)


def _thread_sites(engine: Engine, recording: Any) -> pd.DataFrame:
    started = thread_starts(engine)
    if not len(started):
        return pd.DataFrame()
    return call_sites.thread_sites(started, getattr(recording, "stacks", None))[
        ["pid", "comm", "site", "threads", "first", "last"]].head(20)


def recommendations(recording: Any, least: pd.DataFrame, engine: Engine | None = None) -> list[str]:
    """The configuration values to change, with the numbers the recording justifies."""
    if engine is None:
        with engine_for(recording) as own:
            return recommendations(recording, least, own)
    advice = []
    errnos = ", ".join(quote(e) for e in FD_EXHAUSTION_ERRNOS)
    fd_errors = engine.query(f"SELECT DISTINCT pid, start_ns FROM events WHERE errno IN ({errnos})")
    failed = set(zip(fd_errors["pid"], fd_errors["start_ns"], strict=True))
    several = least["host"].nunique() > 1 if len(least) else False
    for row in least.itertuples():
        hit = (row.pid, row.start_ns) in failed
        if row.usage < USAGE_WARN and not hit:
            continue
        need = with_margin(row.open_fds)
        where = f" on {row.host}" if several else ""
        text = (f"RLIMIT_NOFILE of {row.comm} [{row.pid}]{where}: peak {row.open_fds} open of a soft limit of "
                f"{row.fd_soft_limit:.0f}; set it to at least {need} (LimitNOFILE= in its systemd unit, or ulimit -n).")
        if hit:
            text += " It failed with EMFILE at its limit, so it needed more than it could show: allow well above that."
        advice.append(text)
    system = recording.system
    if len(system) and "file_nr" in system.columns:
        peak, file_max = int(system["file_nr"].max()), int(system["file_max"].min())
        if peak * 2 > file_max:
            advice.append(f"fs.file-max: file-nr peaked at {peak:,} of {file_max:,}; set fs.file-max to at least "
                          f"{peak * 3:,} (sysctl -w fs.file-max=...).")
        for column in ("listen_overflows", "listen_drops"):
            if column in system.columns and system[column].max() > system[column].min():
                moved = int(system[column].max() - system[column].min())
                advice.append(f"net.core.somaxconn: TcpExt {column} grew by {moved:,} during the recording (a "
                              "listen queue overflowed); raise somaxconn (65535) and the listeners' backlog.")
    advice += _thread_advice(engine)
    if not advice:
        advice.append("No limit was approached in this recording: nothing to change.")
    return advice


#: How to raise each kind of thread limit (see ``headroom()``), given the number to set.
THREAD_FIXES = {
    "Go default": lambda need: f"{GO_THREADS_ADVICE}({need})",
    "RLIMIT_NPROC": lambda need: f"set LimitNPROC={need} in its systemd unit (or ulimit -u {need}) for the user",
    "cgroup pids.max": lambda need: f"set TasksMax={need} in its unit (or pids.max of its cgroup)",
    "threads-max": lambda need: f"sysctl -w kernel.threads-max={need}",
}


THREADS_COUNTED = {"Go default": "threads", "RLIMIT_NPROC": "threads of its user",
                   "cgroup pids.max": "tasks in its cgroup", "threads-max": "tasks on the system"}


def _thread_advice(engine: Engine) -> list[str]:
    """A line per process whose threads came within 20 % of the limit binding them."""
    fullest = headroom_module.least_headroom_on(engine, resource="threads")
    advice = []
    for row in fullest.itertuples():
        if not isinstance(row.thread_limit_kind, str) or not row.thread_usage >= USAGE_WARN:
            continue
        need = with_margin(row.thread_count)
        counted = THREADS_COUNTED[row.thread_limit_kind]
        advice.append(f"{row.thread_limit_kind} of {row.comm} [{row.pid}]: peak {row.thread_count:.0f} {counted} of "
                      f"{row.thread_limit:.0f}; {THREAD_FIXES[row.thread_limit_kind](need)}.")
    return advice


# Rendering


def _svg_lines(series: dict[str, tuple[list[float], list[float]]], dashed: dict[str, tuple[list[float], list[float]]],
               title: str, width: int = 900, height: int = 180,
               bands: list[tuple[float, float, str]] | None = None) -> str:
    """A small line chart as inline SVG (x: seconds from the start)."""
    xs = [x for values in [*series.values(), *dashed.values()] for x in values[0]]
    ys = [y for values in [*series.values(), *dashed.values()] for y in values[1]]
    if not xs:
        return f"<p><em>{html.escape(title)}: no data</em></p>"
    x0, x1 = min(xs), max(xs) or 1.0
    y1 = max(ys) or 1.0
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"]

    def point(x: float, y: float) -> str:
        px = 50 + (x - x0) / max(x1 - x0, 1e-9) * (width - 60)
        py = height - 25 - y / y1 * (height - 45)
        return f"{px:.1f},{py:.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<text x="50" y="14" font-size="13">{html.escape(title)}</text>',
             f'<text x="5" y="{height - 25}" font-size="11">0</text><text x="5" y="35" font-size="11">{y1:,.0f}</text>',
             f'<text x="{width - 80}" y="{height - 5}" font-size="11">{x1 - x0:,.0f} s</text>']
    for start, end, label in bands or []:  # phases behind the lines
        left, right = (float(p.split(",")[0]) for p in (point(start, 0), point(end, 0)))
        fill = PHASE_COLOURS.get(label, "#eee")
        parts.append(f'<rect x="{left:.1f}" y="20" width="{max(right - left, 1):.1f}" height="{height - 45}" '
                     f'fill="{fill}" opacity="0.35"><title>{html.escape(label)}</title></rect>')
    # Solid lines with their labels; dashed ones (limits) in the colour of the line they go with.
    for style, lines in (('stroke-width="1.5"', series), ('stroke-dasharray="4 3" stroke-width="1"', dashed)):
        for i, (label, (x, y)) in enumerate(lines.items()):
            colour = palette[i % len(palette)]
            parts.append(f'<polyline fill="none" stroke="{colour}" {style} '
                         f'points="{" ".join(point(a, b) for a, b in zip(x, y, strict=True))}"/>')
            if lines is series:
                parts.append(f'<text x="{60 + 150 * i}" y="{height - 5}" font-size="11" fill="{colour}">'
                             f'{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _svg_heat(heat: pd.DataFrame, value: str, title: str, maximum: float | None = None) -> str:
    """Hosts (rows) by time (columns) as inline SVG, each cell shaded by ``value`` (darker: more)."""
    cells = heat.dropna(subset=[value])
    if not len(cells) or not (cells[value] > 0).any():
        return f"<p><em>{html.escape(title)}: none</em></p>"
    hosts = sorted(heat["host"].astype(str).unique())
    # Every bin from the first to the last, so that the columns keep time's proportions.
    step = pd.Timedelta(seconds=heat.attrs.get("width_s", 1))
    times = list(pd.date_range(heat["time"].min(), heat["time"].max(), freq=step))
    top = maximum if maximum is not None else float(cells[value].max())
    cell_w, cell_h, left = max(2, min(12, 840 // max(len(times), 1))), max(4, min(14, 640 // len(hosts))), 90
    width, height = left + cell_w * len(times) + 10, 40 + cell_h * len(hosts)
    column = {t: i for i, t in enumerate(times)}
    row = {h: i for i, h in enumerate(hosts)}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<text x="{left}" y="14" font-size="13">{html.escape(title)}</text>']
    for host, i in row.items():
        parts.append(f'<text x="2" y="{24 + i * cell_h + cell_h - 2}" font-size="{min(11, cell_h)}">'
                     f'{html.escape(host[:14])}</text>')
    for cell in cells[cells[value] > 0].itertuples():
        share = min(1.0, float(getattr(cell, value)) / top) if top else 0.0
        shade = int(235 - 200 * share)
        x, y = left + column[cell.time] * cell_w, 22 + row[str(cell.host)] * cell_h
        parts.append(f'<rect x="{x}" y="{y}" width="{cell_w}" height="{cell_h}" fill="rgb(235,{shade},{shade})">'
                     f'<title>{html.escape(str(cell.host))} {pd.Timestamp(cell.time):%H:%M:%S}: '
                     f'{getattr(cell, value):,.3g}</title></rect>')
    first, last = pd.Timestamp(times[0]), pd.Timestamp(times[-1])
    parts.append(f'<text x="{left}" y="{height - 4}" font-size="11">{first:%Y-%m-%d %H:%M:%S} UTC</text>'
                 f'<text x="{width - 70}" y="{height - 4}" font-size="11">{last:%H:%M:%S}</text></svg>')
    return "".join(parts)


def _fleet_html(report: Report) -> list[str]:
    if not len(report.heat) and not len(report.cascade):
        return []
    width = report.heat.attrs.get("width_s", 1)
    return [f"<h2>{FLEET_SECTIONS[0]}</h2>",
            _svg_heat(report.heat, "fd_errors", f"EMFILE and ENFILE per host, per {width} s"),
            _svg_heat(report.heat, "fd_usage", "the fullest process's FD table, per host (darkest: full)", 1.0),
            _svg_heat(report.heat, "thread_usage", "the nearest thread limit, per host (darkest: reached)", 1.0),
            f"<h2>{FLEET_SECTIONS[1]}</h2>", _frame_html(report.cascade, NO_INCIDENTS),
            f"<h2>{FLEET_SECTIONS[2]}</h2>", _frame_html(report.clocks, NO_CLOCKS)]


def _fleet_md(report: Report) -> list[str]:
    if not len(report.heat) and not len(report.cascade):
        return []
    per_host = pd.DataFrame()
    if len(report.heat):
        per_host = report.heat.groupby("host").agg(fd_errors=("fd_errors", "sum"), fd_usage=("fd_usage", "max"),
                                                   thread_usage=("thread_usage", "max")).reset_index()
    return ["", f"## {FLEET_SECTIONS[0]}", "", _frame_md(per_host, "No events."),
            "", f"## {FLEET_SECTIONS[1]}", "", _frame_md(report.cascade, NO_INCIDENTS),
            "", f"## {FLEET_SECTIONS[2]}", "", _frame_md(report.clocks, NO_CLOCKS)]


def _xy(times: pd.Series | pd.Index, values: pd.Series, origin: pd.Timestamp) -> tuple[list[float], list[float]]:
    seconds = [(t - origin).total_seconds() for t in times]
    return seconds, [float(v) for v in values]


def timeline_svgs(report: Report) -> list[str]:
    """The timeline charts: socket calls, open FDs against limits (dashed), FD errors."""
    origins = [f.index.min() for f in (report.socket_rate, report.error_rate) if len(f)]
    origins += [s["time"].min() for s in report.fd_series.values() if len(s)]
    if not origins:
        return []
    origin = min(origins)
    calls = {str(c): _xy(report.socket_rate.index, report.socket_rate[c], origin) for c in report.socket_rate.columns}
    fds = {k: _xy(v["time"], v["open_fds"], origin) for k, v in report.fd_series.items()}
    limits = {k: _xy(v["time"], v["fd_soft_limit"], origin) for k, v in report.fd_series.items()}
    errors = {"EMFILE + ENFILE": _xy(report.error_rate.index, report.error_rate["count"], origin)} \
        if len(report.error_rate) else {}
    bands = [((s - origin).total_seconds(), (e - origin).total_seconds(), label) for s, e, label in report.bands]
    title = "socket calls per second, by syscall" + (" (bands: the first rank's phases)" if bands else "")
    return [_svg_lines(calls, {}, title, bands=bands),
            _svg_lines(fds, limits, "open FDs of the fullest processes (dashed: their soft limits)"),
            _svg_lines(errors, {}, "EMFILE and ENFILE per second")]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:,.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} x{v}" for k, v in value.items()) or "nothing"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _frame_html(frame: pd.DataFrame, empty: str) -> str:
    if frame.empty:
        return f"<p>{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f"<table><tr>{head}</tr>{body}</table>"


def _frame_md(frame: pd.DataFrame, empty: str) -> str:
    if frame.empty:
        return empty
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(_cell(v).replace("|", "\\|") for v in row) + " |"
              for row in frame.itertuples(index=False)]
    return "\n".join(lines)


SECTIONS = ("Summary", "Timeline", "Spikes in socket calls", "Training phases", "FD headroom",
            "Incidents: first failure and symptoms", "Connect destinations", "Losses during the recording",
            "What to change", "Open descriptors by call site", "What the threads were doing")
NO_SITES = "No call sites in this recording (record with --stacks to have them)."
NO_CENSUS = "No thread census in this recording."
SITE_COLUMNS = ["pid", "comm", "site", "open", "opened", "closed", "oldest_age_s", "growth_per_min"]
NO_DESTINATIONS = "No connect() with a destination in this recording."
NO_PHASES = "No training phases in this recording (record with fdtrace run --record to have them)."
BAND_PHASES = ("init_process_group", "forward", "backward", "optimizer", "checkpoint_save", "checkpoint_load",
               "barrier")
HEADROOM_COLUMNS = ["comm", "pid", "open_fds", "fd_soft_limit", "fd_hard_limit", "headroom", "usage", "time"]
NO_SPIKES = "No spike: no bin rose far above its recent baseline."
NO_INCIDENTS = "No EMFILE, ENFILE, OOM kill or abnormal exit."
NO_LOSSES = "No event was lost."
FLEET_SECTIONS = ("Fleet: hosts by time", "Fleet: the cascade (first failure of each host, in order)",
                  "Fleet: one clock (each host's offset from the reference, from the connections between them)")
NO_CLOCKS = "No connections between the recorded hosts in both directions: each host's own clock is used."


def to_html(report: Report) -> str:
    """The report as one self-contained HTML page."""
    style = ("body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}h2{margin-top:1.5em}")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(report.title)}</title>",
             f"<style>{style}</style></head><body><h1>{html.escape(report.title)}</h1>",
             f"<p>made {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</p>",
             f"<h2>{SECTIONS[0]}</h2><table>"]
    parts += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in report.summary]
    parts.append("</table>")
    parts += _fleet_html(report)
    parts.append(f"<h2>{SECTIONS[1]}</h2>")
    parts += timeline_svgs(report) or ["<p>No events.</p>"]
    parts += [f"<h2>{SECTIONS[2]}</h2>", _frame_html(report.spikes, NO_SPIKES),
              f"<h2>{SECTIONS[3]}</h2>", _frame_html(report.phase_stats, NO_PHASES),
              f"<h2>{SECTIONS[4]}</h2>", _frame_html(_headroom_view(report), "No samples."),
              f"<h2>{SECTIONS[5]}</h2>", _frame_html(report.incidents, NO_INCIDENTS),
              f"<h2>{SECTIONS[6]}</h2>", _frame_html(report.destinations.head(20), NO_DESTINATIONS),
              f"<h2>{SECTIONS[9]}</h2>", _frame_html(report.leaks, NO_SITES),
              f"<h2>{SECTIONS[10]}</h2>", _frame_html(report.threads, NO_CENSUS),
              *([_frame_html(report.thread_sites, "")] if len(report.thread_sites) else []),
              f"<h2>{SECTIONS[7]}</h2>", _frame_html(report.losses, NO_LOSSES),
              f"<h2>{SECTIONS[8]}</h2><ul>", *(f"<li>{html.escape(r)}</li>" for r in report.recommendations),
              "</ul></body></html>"]
    return "".join(parts)


def to_markdown(report: Report) -> str:
    """The report as Markdown (the timeline as a table of per-second counts)."""
    parts = [f"# {report.title}", "", f"## {SECTIONS[0]}", ""]
    parts += [f"- **{k}**: {v}" for k, v in report.summary]
    parts += _fleet_md(report)
    timeline = report.socket_rate.join(report.error_rate.rename(columns={"count": "EMFILE+ENFILE"}), how="outer")
    parts += ["", f"## {SECTIONS[1]}", "", _frame_md(timeline.fillna(0).astype(int).reset_index(), "No events."),
              "", f"## {SECTIONS[2]}", "", _frame_md(report.spikes, NO_SPIKES),
              "", f"## {SECTIONS[3]}", "", _frame_md(report.phase_stats, NO_PHASES),
              "", f"## {SECTIONS[4]}", "", _frame_md(_headroom_view(report), "No samples."),
              "", f"## {SECTIONS[5]}", "", _frame_md(report.incidents, NO_INCIDENTS),
              "", f"## {SECTIONS[6]}", "", _frame_md(report.destinations.head(20), NO_DESTINATIONS),
              "", f"## {SECTIONS[9]}", "", _frame_md(report.leaks, NO_SITES),
              "", f"## {SECTIONS[10]}", "", _frame_md(report.threads, NO_CENSUS),
              *(["", _frame_md(report.thread_sites, "")] if len(report.thread_sites) else []),
              "", f"## {SECTIONS[7]}", "", _frame_md(report.losses, NO_LOSSES),
              "", f"## {SECTIONS[8]}", ""]
    parts += [f"- {r}" for r in report.recommendations]
    return "\n".join(parts) + "\n"


def _headroom_view(report: Report) -> pd.DataFrame:
    frame = report.headroom
    return frame[HEADROOM_COLUMNS].head(20) if not frame.empty else frame
