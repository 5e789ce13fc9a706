"""The report rendered: one self-contained HTML page (its Plotly charts from ``charts``) or
Markdown, from a computed ``Report``. "What to change" comes first after the summary."""

from __future__ import annotations

import math
import time
from typing import Any

import pandas as pd

from fdtrace.analysis.report.charts import figure_html, scale_figure_html
from fdtrace.analysis.report.model import Report, time_text
from fdtrace.display import html_shown, markdown_shown


def _svg_heat(heat: pd.DataFrame, value: str, title: str, maximum: float | None = None) -> str:
    """Hosts (rows) by time (columns) as inline SVG, each cell shaded by ``value`` (darker: more)."""
    cells = heat.dropna(subset=[value])
    if not len(cells) or not (cells[value] > 0).any():
        return f"<p><em>{html_shown(title)}: none</em></p>"
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
             f'<text x="{left}" y="14" font-size="13">{html_shown(title)}</text>']
    for host, i in row.items():
        parts.append(f'<text x="2" y="{24 + i * cell_h + cell_h - 2}" font-size="{min(11, cell_h)}">'
                     f'{html_shown(host[:14])}</text>')
    for cell in cells[cells[value] > 0].itertuples():
        share = min(1.0, float(getattr(cell, value)) / top) if top else 0.0
        shade = int(235 - 200 * share)
        x, y = left + column[cell.time] * cell_w, 22 + row[str(cell.host)] * cell_h
        parts.append(f'<rect x="{x}" y="{y}" width="{cell_w}" height="{cell_h}" fill="rgb(235,{shade},{shade})">'
                     f'<title>{html_shown(str(cell.host))} {pd.Timestamp(cell.time):%H:%M:%S}: '
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


#: Human names of the tables' columns (the others: their name with spaces).
COLUMN_NAMES = {
    "comm": "program", "open_fds": "open FDs", "fd_soft_limit": "soft limit", "fd_hard_limit": "hard limit",
    "headroom": "FDs to spare", "usage": "use of the limit", "time": "at", "first": "first at", "last": "last at",
    "first_pid": "first pid", "followed_by": "then, in the other processes", "count": "failures",
    "duration_s": "seconds", "peak_time": "peak at", "made_by": "made by", "phase_by_rank": "phase by rank",
    "peer_addr": "address", "peer_port": "port", "failed": "failed", "fd_kind": "on descriptors of",
    "oldest_age_s": "oldest (s)", "growth_per_min": "growth / min", "fd_errors": "EMFILE/ENFILE",
    "fd_usage": "fullest FD table", "thread_usage": "nearest thread limit", "threads_started": "threads started",
    "seconds_to_exhaustion": "full in (s)", "rss_mib": "RSS (MiB)", "limit_mib": "cgroup limit (MiB)",
    "peak_mib": "cgroup peak (MiB)", "memcg_oom_kills": "OOM kills in the cgroup", "fit": "memory per connection",
    "need_mib": "its connections need (MiB)", "anon_rss_kb": "anon RSS at the kill (kB)",
    "last_state": "last seen",
}
PERCENT_COLUMNS = frozenset({"usage", "fd_usage", "thread_usage"})
#: Columns left out of the tables: kept in the DataFrames for programs, noise to a reader.
HIDDEN_COLUMNS = frozenset({"start_ns", "ts_ns", "first_overall"})


def _cell(value: Any, column: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NaT or value is pd.NA:
        return ""
    if column in PERCENT_COLUMNS and isinstance(value, int | float):
        return f"{value:.0%}"
    if isinstance(value, pd.Timestamp):
        return time_text(value)
    if isinstance(value, float):
        return f"{int(value):,}" if value.is_integer() else f"{value:,.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} x{v}" for k, v in value.items()) or "nothing"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _shown(frame: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The columns a table shows, and their headers."""
    columns = [str(c) for c in frame.columns if c not in HIDDEN_COLUMNS]
    return columns, [COLUMN_NAMES.get(c, c.replace("_", " ")) for c in columns]


def _frame_html(frame: pd.DataFrame, empty: str) -> str:
    if frame.empty:
        return f"<p>{html_shown(empty)}</p>"
    columns, headers = _shown(frame)
    head = "".join(f"<th>{html_shown(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html_shown(_cell(row[c], c))}</td>" for c in columns) + "</tr>"
                   for _, row in frame.iterrows())
    return f"<table><tr>{head}</tr>{body}</table>"


def _frame_md(frame: pd.DataFrame, empty: str) -> str:
    if frame.empty:
        return empty
    columns, headers = _shown(frame)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(markdown_shown(_cell(row[c], c)) for c in columns) + " |"
              for _, row in frame.iterrows()]
    return "\n".join(lines)


def first_failure(report: Report) -> str:
    """The sentence that names the recording's worst failure (the first of the incidents, ranked by
    harm), and its first when that was another."""
    if not len(report.incidents):
        return NO_INCIDENTS
    row = report.incidents.iloc[0]
    where = f" on {row['host']}" if len(report.heat) else ""
    text = (f"Worst failure: {row['comm']} [{row['first_pid']}]{where}, {row['failure']} ×{row['count']:,}, "
            f"first at {_cell(row['first'])}.")
    first = report.incidents[report.incidents["first_overall"].astype(bool)]
    if len(first) and not bool(row["first_overall"]):
        other = first.iloc[0]
        text += (f" The first to fail: {other['comm']} [{other['first_pid']}], {other['failure']} at "
                 f"{_cell(other['first'])}.")
    return text + " Below, every program's failures, the most harmful first."


SECTIONS = ("Summary", "Timeline", "Spikes in socket, accept and connect calls and failures", "Training phases",
            "FD headroom",
            "Incidents: failures by program, most severe first", "Connect destinations", "Losses during the recording",
            "What to change", "Open descriptors by call site", "What the threads were doing",
            "Memory headroom and OOM kills", "Each rank's descriptors by owner, and the job at scale")
NO_LEDGER = "No distributed job in this recording (record one with fdtrace run --record to have its ranks' ledger)."
MEMORY_COLUMNS = ["comm", "pid", "rss_mib", "limit_mib", "peak_mib", "usage", "memcg_oom_kills", "fit", "need_mib",
                  "time"]
VICTIM_COLUMNS = ["comm", "pid", "time", "anon_rss_kb", "last_state"]
NO_MEMORY = "No memory figures in this recording (recorded before fdtrace sampled memory, or no process sampled)."
NO_SITES = "No call sites in this recording (record with --stacks to have them)."
NO_CENSUS = "No thread census in this recording."
NO_DESTINATIONS = "No connect() with a destination in this recording."
NO_PHASES = "No training phases in this recording (record with fdtrace run --record to have them)."
HEADROOM_COLUMNS = ["comm", "pid", "open_fds", "fd_soft_limit", "fd_hard_limit", "headroom", "usage", "time"]
NO_SPIKES = ("No spike: no bin of socket, accept and connect calls and failed calls rose far above its "
             "baseline.")
NO_INCIDENTS = "No EMFILE, ENFILE, OOM kill or abnormal exit."
NO_LOSSES = "No event was lost."
FLEET_SECTIONS = ("Fleet: hosts by time", "Fleet: the cascade (first failure of each host, in order)",
                  "Fleet: one clock (each host's offset from the reference, from the connections between them)")
NO_CLOCKS = "No connections between the recorded hosts in both directions: each host's own clock is used."


def to_html(report: Report) -> str:
    """The report as one self-contained HTML page."""
    style = ("body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}h2{margin-top:1.5em}")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html_shown(report.title)}</title>",
             f"<style>{style}</style></head><body><h1>{html_shown(report.title)}</h1>",
             f"<p>made {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</p>",
             f"<h2>{SECTIONS[0]}</h2><table>"]
    parts += [f"<tr><th>{html_shown(k)}</th><td>{html_shown(v)}</td></tr>" for k, v in report.summary]
    parts.append("</table>")
    parts += [f"<h2>{SECTIONS[8]}</h2><ul>", *(f"<li>{html_shown(r)}</li>" for r in report.recommendations), "</ul>"]
    parts += _fleet_html(report)
    parts += [f"<h2>{SECTIONS[1]}</h2>", figure_html(report),
              *(f"<p>{html_shown(note)}</p>" for note in report.thread_notes)]
    parts += [f"<h2>{SECTIONS[2]}</h2>", _frame_html(report.spikes, NO_SPIKES),
              f"<h2>{SECTIONS[3]}</h2>", _frame_html(report.phase_stats, NO_PHASES),
              f"<h2>{SECTIONS[4]}</h2>", _frame_html(_headroom_view(report), "No samples."),
              f"<h2>{SECTIONS[11]}</h2>", _frame_html(_memory_view(report), NO_MEMORY),
              *([_frame_html(report.oom_victims[VICTIM_COLUMNS], "")] if len(report.oom_victims) else []),
              f"<h2>{SECTIONS[5]}</h2>", f"<p>{html_shown(first_failure(report))}</p>",
              _frame_html(report.incidents, ""),
              f"<h2>{SECTIONS[6]}</h2>", _frame_html(report.destinations.head(20), NO_DESTINATIONS),
              f"<h2>{SECTIONS[9]}</h2>", _frame_html(report.leaks, NO_SITES),
              f"<h2>{SECTIONS[10]}</h2>", _frame_html(report.threads, NO_CENSUS),
              *([_frame_html(report.thread_sites, "")] if len(report.thread_sites) else []),
              f"<h2>{SECTIONS[12]}</h2>", _frame_html(report.ledger, NO_LEDGER),
              *(f"<p>{html_shown(line)}</p>" for line in report.scale_lines),
              *([_frame_html(report.scale_laws, ""), scale_figure_html(report.scale_curve)]
                if len(report.scale_laws) else []),
              f"<h2>{SECTIONS[7]}</h2>", _frame_html(report.losses, NO_LOSSES), "</body></html>"]
    return "".join(parts)


def to_markdown(report: Report) -> str:
    """The report as Markdown (the timeline as a table of per-second counts)."""
    parts = [f"# {markdown_shown(report.title)}", "", f"## {SECTIONS[0]}", ""]
    parts += [f"- **{markdown_shown(k)}**: {markdown_shown(v)}" for k, v in report.summary]
    parts += ["", f"## {SECTIONS[8]}", "", *(f"- {markdown_shown(r)}" for r in report.recommendations)]
    parts += _fleet_md(report)
    timeline = report.socket_rate.join(report.error_rate.rename(columns={"count": "EMFILE+ENFILE"}), how="outer")
    parts += ["", f"## {SECTIONS[1]}", "", _frame_md(timeline.fillna(0).astype(int).reset_index(), "No events."),
              *(f"\n{markdown_shown(n)}" for n in report.thread_notes),
              "", f"## {SECTIONS[2]}", "", _frame_md(report.spikes, NO_SPIKES),
              "", f"## {SECTIONS[3]}", "", _frame_md(report.phase_stats, NO_PHASES),
              "", f"## {SECTIONS[4]}", "", _frame_md(_headroom_view(report), "No samples."),
              "", f"## {SECTIONS[11]}", "", _frame_md(_memory_view(report), NO_MEMORY),
              *(["", _frame_md(report.oom_victims[VICTIM_COLUMNS], "")] if len(report.oom_victims) else []),
              "", f"## {SECTIONS[5]}", "", markdown_shown(first_failure(report)),
              *(["", _frame_md(report.incidents, "")] if len(report.incidents) else []),
              "", f"## {SECTIONS[6]}", "", _frame_md(report.destinations.head(20), NO_DESTINATIONS),
              "", f"## {SECTIONS[9]}", "", _frame_md(report.leaks, NO_SITES),
              "", f"## {SECTIONS[10]}", "", _frame_md(report.threads, NO_CENSUS),
              *(["", _frame_md(report.thread_sites, "")] if len(report.thread_sites) else []),
              "", f"## {SECTIONS[12]}", "", _frame_md(report.ledger, NO_LEDGER),
              *([""] if report.scale_lines else []), *(f"- {markdown_shown(line)}" for line in report.scale_lines),
              *(["", _frame_md(report.scale_laws, "")] if len(report.scale_laws) else []),
              "", f"## {SECTIONS[7]}", "", _frame_md(report.losses, NO_LOSSES)]
    return "\n".join(parts) + "\n"


def _memory_view(report: Report) -> pd.DataFrame:
    frame = report.memory
    if frame.empty:
        return frame
    def mib(column: str) -> pd.Series:
        value = frame[column].astype("Float64").astype("float64") / (1 << 20)
        return value.round(0).where(value >= 10, value.round(1))

    frame = frame.head(20)
    frame = frame.assign(rss_mib=mib("rss_bytes"), limit_mib=mib("memcg_limit_bytes"),
                         peak_mib=mib("memcg_peak_bytes"), need_mib=mib("need"))
    return frame[MEMORY_COLUMNS]


def _headroom_view(report: Report) -> pd.DataFrame:
    frame = report.headroom
    return frame[HEADROOM_COLUMNS].head(20) if not frame.empty else frame

