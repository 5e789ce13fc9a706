"""`fdtrace report`: one self-contained HTML file (or Markdown) a postmortem reader can open
without Python: summary, the limits to change, timeline, spikes, headroom, incidents and losses."""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from fdtrace.analysis import call_sites
from fdtrace.analysis import headroom_series as headroom_module
from fdtrace.analysis.binning import binned_counts, coarser, factor_for, pivot_rates, within
from fdtrace.analysis.destinations import destinations_on
from fdtrace.analysis.engines import Engine, quote
from fdtrace.analysis.engines.dataset import engine_for, thread_starts
from fdtrace.analysis.failures import as_time, failures_on, incidents_on, severity_of
from fdtrace.analysis.fleet import cascade_from, fleet_heat_on
from fdtrace.analysis.memory import memory_advice_lines, memory_needs_on, memory_series_on, oom_victims_on
from fdtrace.analysis.needs import fd_needs_on
from fdtrace.analysis.phase_alignment import align_spikes, phase_stats_on
from fdtrace.analysis.report_charts import figure_html
from fdtrace.analysis.span import span_on
from fdtrace.analysis.spike_finder import spikes
from fdtrace.analysis.summary import incident_windows
from fdtrace.display import markdown_shown
from fdtrace.policy import FD_EXHAUSTION_ERRNOS, GO_THREADS_ADVICE, THREADS_COUNTED, USAGE_WARN, with_margin
from fdtrace.schema import NOT_FAILURES, STATS

#: The event columns the report reads (a large recording is loaded with these only).
EVENT_COLUMNS = ("ts_ns", "time", "pid", "start_ns", "comm", "kind", "syscall", "ret", "errno", "signal",
                 "exit_code", "anon_rss_kb", "file_rss_kb", "oom_score_adj", "peer_addr", "peer_port", "tid",
                 "stack_id", "limit_target", "limit_resource", "limit_soft", "limit_hard")
SOCKET_KINDS = ["socket", "accept", "connect", "close"]
#: The calls whose bursts are spikes (with failed calls of any syscall): close() is not one of them.
SPIKE_KINDS = ["socket", "accept", "connect"]
#: Programs the spikes are looked for among (the busiest; the others are summed as one).
SPIKE_COLUMNS = 50


@dataclass
class Report:
    """The report's content, rendered by ``to_html`` or ``to_markdown``."""

    title: str
    summary: list[tuple[str, str]]
    socket_rate: pd.DataFrame  # calls per second by syscall kind (the Markdown timeline)
    fd_series: dict[str, pd.DataFrame]  # process label -> frame of time, open_fds, fd_soft_limit
    error_rate: pd.DataFrame  # EMFILE/ENFILE per second, all processes
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
    # Several hosts: hosts by time (fleet.fleet_heat_on), the order they failed in, their clocks.
    heat: pd.DataFrame = field(default_factory=pd.DataFrame)
    cascade: pd.DataFrame = field(default_factory=pd.DataFrame)
    clocks: pd.DataFrame = field(default_factory=pd.DataFrame)
    # The charts' per-process series: rates with a column per process label, threads against
    # their limit, single failures to mark (time, marker, text) and every rank's phases.
    failure_rate: pd.DataFrame = field(default_factory=pd.DataFrame)
    call_rate: pd.DataFrame = field(default_factory=pd.DataFrame)
    thread_series: dict[str, pd.DataFrame] = field(default_factory=dict)
    thread_notes: list[str] = field(default_factory=list)  # the limits the threads panel says in words
    markers: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["time", "marker", "text"]))
    phase_marks: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Memory: each process's headroom and need (analysis.memory), its OOM kills with the victim's
    # last state, and the memory over time of those nearest their cgroup's limit.
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)
    oom_victims: pd.DataFrame = field(default_factory=pd.DataFrame)
    memory_series: dict[str, pd.DataFrame] = field(default_factory=dict)


def build(recording: Any, top: int = 3) -> Report:
    """Compute every section from a recording: loaded (``load()``) or in an engine
    (``load(..., engine="duckdb")``), whose tables are reduced there."""
    with engine_for(recording) as engine:
        return _build(recording, engine, top)


def _label(host: Any, comm: Any, pid: Any, several: bool) -> str:
    return f"{host}: {comm} [{pid}]" if several else f"{comm} [{pid}]"


def _series_of(engine: Engine, chosen: pd.DataFrame, columns: list[str], several: bool) -> dict[str, pd.DataFrame]:
    """The headroom series of the chosen processes, by process label."""
    if not len(chosen):
        return {}
    series = headroom_module.headroom_on(engine, where=headroom_module.processes_where(chosen))
    found = {}
    for row in chosen.itertuples():
        mine = series[(series["host"] == row.host) & (series["pid"] == row.pid)
                      & (series["start_ns"].fillna(-1) == (-1 if pd.isna(row.start_ns) else row.start_ns))]
        found[_label(row.host, row.comm, row.pid, several)] = mine[["time", *columns]].reset_index(drop=True)
    return found


def _per_process(counted: pd.DataFrame, top: int, several: bool, **chosen: Any) -> pd.DataFrame:
    """Per-second counts of the ``top`` busiest processes, a column per process label."""
    rows = counted
    for column, values in chosen.items():
        rows = rows[rows[column].isin(values)]
    if not len(rows):
        return pd.DataFrame()
    rows = rows.assign(process=[_label(h, c, p, several) for h, c, p in
                                zip(rows["host"], rows["comm"], rows["pid"], strict=True)])
    busiest = rows.groupby("process")["n"].sum().sort_values(ascending=False, kind="stable").head(top).index
    return pivot_rates(rows[rows["process"].isin(busiest)], by="process")


def _markers(found: pd.DataFrame, incidents: pd.DataFrame, several: bool) -> pd.DataFrame:
    """OOM kills and kills by a signal (each one), and the first failure of each incident."""
    single = found[(found["failure"] == "OOM kill") | found["failure"].str.startswith(("killed by ", "Go thread "))]
    rows = [{"time": r.time, "marker": severity_of(r.failure)[1],
             "text": f"{_label(r.host, r.comm, r.pid, several)}: {r.failure}"} for r in single.head(500).itertuples()]
    rows += [{"time": r.first, "marker": "first failure",
              "text": f"{_label(r.host, r.comm, r.first_pid, several)}: first {r.failure} of {r.count:,}"}
             for r in incidents.itertuples() if r.severity == "EMFILE/ENFILE"]
    return pd.DataFrame(rows, columns=["time", "marker", "text"])


def _span(first: pd.Timestamp, last: pd.Timestamp) -> str:
    return f"{_cell(first)} to {_cell(last)} ({(last - first).total_seconds():,.1f} s)"


def _build(recording: Any, engine: Engine, top: int) -> Report:
    several = len(recording.meta) > 1
    # One pass over the events for every rate the report draws, over the recording's span only
    # (events far outside it are named, not drawn), in at most MAX_BINS bins.
    every = binned_counts(engine, "1s", ("kind", "comm", "errno", "host", "pid"))
    span = span_on(engine, counted=every)
    factor = factor_for(span, int(every.attrs["width_ns"]))
    counted = coarser(within(every, span), factor)
    socket_rate = pivot_rates(counted, kind=SOCKET_KINDS, by="kind")
    error_rate = pivot_rates(counted, errno=sorted(FD_EXHAUSTION_ERRNOS), by=None)
    least = headroom_module.least_headroom_on(engine)
    fd_series = _series_of(engine, least.head(top), ["open_fds", "fd_soft_limit"], several)
    # The processes nearest a thread limit, then (where no limit is known) those with most threads.
    by_threads = headroom_module.least_headroom_on(engine, resource="threads")
    limited = by_threads["thread_limit"].notna()
    chosen = pd.concat([by_threads[limited], by_threads[~limited].sort_values("threads", ascending=False)]).head(top)
    thread_series, thread_notes = thread_panel(_series_of(
        engine, chosen, ["threads", "thread_count", "thread_limit", "thread_limit_kind"], several))
    kinds = every.groupby("kind").agg(n=("n", "sum"), first=("first", "min"), last=("last", "max")).reset_index()
    kinds = kinds.sort_values(["n", "kind"], ascending=[False, True])
    total = int(kinds["n"].sum()) if len(kinds) else 0
    drawn = counted[["first", "last"]]
    spans = [(m.get("host"), m.get("kernel"), m.get("complete")) for m in recording.meta.values()]
    summary = [
        ("hosts", ", ".join(f"{h} (kernel {k}{'' if c else ', recorder did not stop cleanly'})" for h, k, c in spans)),
        ("span", _span(as_time(drawn["first"]).min(), as_time(drawn["last"]).max()) if len(drawn) else "no events"),
        ("events", f"{total:,}"),
    ]
    if total:
        summary.append(("by kind", ", ".join(f"{r.kind} {r.n:,}" for r in kinds.itertuples())))
    if span.outside:
        summary.append(("outside the span", span.describe()))
    if factor > 1:
        length = pd.Timedelta((span.last_ns or 0) - (span.first_ns or 0), unit="ns").round("s")
        summary.append(("timeline", f"one bin per {factor:,} s (rates are counts per bin) over a span of {length}"))
    losses = recording.losses
    lost = {name: int(losses[name].sum()) for name in STATS if name in losses.columns}
    summary.append(("events lost", f"{sum(lost.values()):,}" + "".join(f", {k} {v:,}" for k, v in lost.items() if v)))
    for host, meta in recording.meta.items():
        summary += [(f"{what} on {host}" if several else what, text) for what, text in incident_windows(meta)]
    if recording.skipped:
        summary.append(("unreadable files skipped", str(len(recording.skipped))))
    notes = getattr(recording, "notes", [])
    if notes:
        summary.append(("files read in part", f"{len(notes)} (values cut, rows left out or copies read once: "
                                              "fdtrace report names them on stderr)"))
    spike_table = spikes(pivot_rates(spike_calls(counted), by="comm", top=SPIKE_COLUMNS))
    phases = getattr(recording, "phases", pd.DataFrame())
    stats = pd.DataFrame()
    if len(phases):
        stats = phase_stats_on(engine, phases)
        spike_table = align_spikes(spike_table, phases)
    loss_rows = losses[losses[list(lost)].sum(axis=1) > 0] if lost and len(losses) else pd.DataFrame()
    found = failures_on(engine)
    incidents = incidents_on(engine, found=found)
    clocks = getattr(recording, "clock_offsets", None)
    needs = fd_needs_on(engine)
    memory, victims = memory_needs_on(engine, needs), oom_victims_on(engine)
    marks = phases[phases["end_wall_ns"].notna() & phases["rank"].notna()] if len(phases) else pd.DataFrame()
    return Report(
        title=f"fdtrace report: {', '.join(recording.meta)}",
        summary=summary, socket_rate=socket_rate, fd_series=fd_series, error_rate=error_rate,
        spikes=spike_table, headroom=least, incidents=incidents, losses=loss_rows,
        failure_rate=_per_process(counted, 5, several, errno=sorted(FD_EXHAUSTION_ERRNOS)),
        call_rate=_per_process(counted, 5, several, kind=SOCKET_KINDS), thread_series=thread_series,
        thread_notes=thread_notes,
        markers=_markers(found, incidents, several),
        phase_marks=marks[["rank", "phase", "start_wall_ns", "end_wall_ns"]] if len(marks) else pd.DataFrame(),
        recommendations=recommendations(recording, least, engine, memory, victims, needs), phase_stats=stats,
        memory=memory, oom_victims=victims, memory_series=_memory_series(engine, memory.head(top), several),
        destinations=destinations_on(engine), leaks=_leaks(recording), threads=_census_at_peak(recording),
        thread_sites=_thread_sites(engine, recording),
        heat=fleet_heat_on(engine, span=span) if several else pd.DataFrame(),
        cascade=cascade_from(found) if several else pd.DataFrame(),
        clocks=clocks if several and clocks is not None else pd.DataFrame(),
    )


#: Thread limits that count a program's own threads (the others count its user's, its cgroup's or
#: the system's tasks: not what the threads panel draws).
OWN_THREAD_LIMITS = ("Go default", "Go SetMaxThreads")
#: A limit is drawn when it is at most this many times the program's peak of threads.
DRAWN_LIMIT_FACTOR = 4


def thread_panel(series: dict[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The threads panel scaled to the programs' own figures: each process's own ``threads``, and
    its binding ``thread_limit`` as a line only where that limit counts its own threads (Go's) and
    lies within DRAWN_LIMIT_FACTOR times their peak. Any other limit (threads-max, RLIMIT_NPROC, a
    pids.max, or one so far above that it would flatten the chart) is said in words."""
    drawn, notes = {}, []
    for label, frame in series.items():
        peak = int(frame["threads"].max()) if frame["threads"].notna().any() else 0
        limit = frame["thread_limit"].astype("Float64")
        own = frame["thread_limit_kind"].isin(OWN_THREAD_LIMITS)
        kept = (own & (limit <= DRAWN_LIMIT_FACTOR * max(peak, 1))).fillna(False).astype(bool)
        drawn[label] = frame.assign(thread_limit=limit.where(kept).astype("float64"))
        hidden = frame[limit.notna().to_numpy() & ~kept.to_numpy()]
        if len(hidden):
            last = hidden.iloc[-1]
            counted = THREADS_COUNTED.get(str(last["thread_limit_kind"]), "threads")
            notes.append(f"{label}: its binding thread limit is {last['thread_limit_kind']} "
                         f"{int(last['thread_limit']):,} ({int(hidden['thread_count'].max()):,} {counted} at most), "
                         f"not drawn: its own threads peaked at {peak:,}.")
    return drawn, notes


def spike_calls(counted: pd.DataFrame) -> pd.DataFrame:
    """The binned counts spikes are looked for in: socket, accept and connect calls and failed
    calls of any syscall. close() is left out: every program closes files all day (a shell
    loop's grep closes a dozen), and a burst of it is no sign of descriptors running out."""
    failed = ~counted["errno"].astype("string").fillna("").isin(NOT_FAILURES)
    return counted[counted["kind"].isin(SPIKE_KINDS) | failed]


def _memory_series(engine: Engine, chosen: pd.DataFrame, several: bool) -> dict[str, pd.DataFrame]:
    """The memory over time of the chosen processes, by process label: what is drawn (its cgroup's
    usage, else its RSS) and the cgroup's limit, in MiB."""
    series = memory_series_on(engine, chosen)
    found = {}
    for row in chosen.itertuples():
        mine = series[(series["host"] == row.host) & (series["pid"] == row.pid)]
        if not len(mine):
            continue
        drawn = mine["memcg_usage_bytes"].astype("Float64").fillna(mine["rss_bytes"].astype("Float64"))
        limit = mine["memcg_limit_bytes"].astype("Float64")
        found[_label(row.host, row.comm, row.pid, several)] = pd.DataFrame({
            "time": mine["time"].to_numpy(),
            "memory_mib": (drawn / (1 << 20)).to_numpy(dtype="float64", na_value=float("nan")),
            "limit_mib": (limit / (1 << 20)).to_numpy(dtype="float64", na_value=float("nan"))})
    return found


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
    return at_peak[["time", "pid", "comm", "syscall", "fd_kind", "site", "threads"]].head(40)


def _thread_sites(engine: Engine, recording: Any) -> pd.DataFrame:
    started = thread_starts(engine)
    if not len(started):
        return pd.DataFrame()
    return call_sites.thread_sites(started, getattr(recording, "stacks", None))[
        ["pid", "comm", "site", "threads", "first", "last"]].head(20)


def recommendations(recording: Any, least: pd.DataFrame, engine: Engine | None = None,
                    memory: pd.DataFrame | None = None, victims: pd.DataFrame | None = None,
                    needs: pd.DataFrame | None = None) -> list[str]:
    """The configuration values to change, with the numbers the recording justifies (``memory``,
    ``victims`` and ``needs``: computed by the caller already, else here)."""
    if engine is None:
        with engine_for(recording) as own:
            return recommendations(recording, least, own, memory, victims, needs)
    several = least["host"].nunique() > 1 if len(least) else False
    needs = fd_needs_on(engine) if needs is None else needs
    advice = fd_advice(needs, several=several)
    advice += memory_advice_lines(memory_needs_on(engine, needs) if memory is None else memory,
                                  oom_victims_on(engine) if victims is None else victims, several=several)
    system = recording.system
    if len(system) and "file_nr" in system.columns:
        peak, file_max = int(system["file_nr"].max()), int(system["file_max"].min())
        if peak * 2 > file_max:
            advice.append(f"fs.file-max: file-nr peaked at {peak:,} of {file_max:,}; set fs.file-max to at least "
                          f"{peak * 3:,} (sysctl -w fs.file-max=...).")
    listen = listen_advice(system, engine)
    if listen:
        advice.append(listen)
    advice += _thread_advice(engine)
    advice += go_limit_advice(engine)
    if not advice:
        advice.append("No limit was approached in this recording: nothing to change.")
    return advice


def fd_advice(needs: pd.DataFrame, several: bool = False) -> list[str]:
    """One line per process that failed with EMFILE or came near its FD limit: the soft limit to
    set, from what it needed (``fd_needs()``), never from a peak its limit capped."""
    advice = []
    for row in needs.itertuples():
        soft = None if pd.isna(row.fd_soft_limit) else int(row.fd_soft_limit)
        near = soft is not None and row.need >= soft * USAGE_WARN
        if not row.emfile and not near:
            continue
        where = f" on {row.host}" if several else ""
        failed = f", failed {row.emfile:,} times with EMFILE" if row.emfile else ""
        limit = soft if soft is not None else "unlimited"
        text = (f"RLIMIT_NOFILE of {row.comm} [{row.pid}]{where}: soft limit {limit}{failed}; it needed at least "
                f"{row.need} ({row.basis}); set it to {row.recommended} (LimitNOFILE= in its systemd unit, or "
                "ulimit -n).")
        if not pd.isna(row.maxsock) and soft is not None and row.maxsock > soft:
            text += (f" HAProxy sized itself for {int(row.maxsock)} descriptors (Maxsock) but was given {soft}: "
                     "raise the limit, or lower maxconn until Maxsock fits.")
        advice.append(text)
    return advice


def listen_advice(system: pd.DataFrame, engine: Engine) -> str | None:
    """One line when a listen queue overflowed during the recording; when a listener was failing
    accept() with EMFILE then, the overflow was its symptom and the FD limit is the fix."""
    grew = {name: int(system[column].max() - system[column].min())
            for column, name in (("listen_overflows", "ListenOverflows"), ("listen_drops", "ListenDrops"))
            if column in system.columns and len(system) and system[column].max() > system[column].min()}
    if not grew:
        return None
    moved = " and ".join(f"TcpExt {name} grew by {count:,}" for name, count in grew.items())
    refused = engine.query(f"SELECT comm, pid, count(*) AS n FROM events WHERE kind = 'accept' AND errno IN "
                           f"({', '.join(quote(e) for e in sorted(FD_EXHAUSTION_ERRNOS))}) GROUP BY comm, pid "
                           "ORDER BY n DESC, pid LIMIT 3")
    if len(refused):
        who = ", ".join(f"{r.comm} [{r.pid}] ({r.n:,} times)" for r in refused.itertuples())
        return (f"Listen queues: {moved} during the recording, while accept() failed with EMFILE in {who}: the "
                "queue filled because the listener could not take connections. Raise its FD limit (above); "
                "somaxconn is not the cause.")
    return (f"net.core.somaxconn: {moved} during the recording (a listen queue overflowed); raise somaxconn "
            "(65535) and the listeners' backlog, or accept faster.")


def go_limit_advice(engine: Engine) -> list[str]:
    """A line per Go program that said it exceeded its thread limit (the runtime's own message:
    the only place a limit set by debug.SetMaxThreads shows)."""
    said = engine.query("SELECT host, pid, min(comm) AS comm, max(ret) AS thread_limit FROM events "
                        "WHERE kind = 'go_thread_limit' GROUP BY host, pid ORDER BY host, pid")
    return [f"Go thread limit of {r.comm} [{r.pid}]: the runtime said {_go_said(r.thread_limit)} and the program "
            f"exited 2 (its limit, from debug.SetMaxThreads or Go's default 10000, is read from that message only); "
            f"{GO_THREADS_ADVICE}." for r in said.itertuples()]


def _go_said(limit: Any) -> str:
    """The runtime's message with the N its event holds, as an integer; in words when none is held."""
    if limit is None or pd.isna(limit):
        return "it exceeded its thread limit (the number was not recorded)"
    return f"'program exceeds {int(limit)}-thread limit'"


#: How to raise each kind of thread limit (see ``headroom()``), given the number to set.
THREAD_FIXES = {
    "Go default": lambda need: f"{GO_THREADS_ADVICE}({need})",
    "Go SetMaxThreads": lambda need: f"{GO_THREADS_ADVICE}({need})",
    "RLIMIT_NPROC": lambda need: f"set LimitNPROC={need} in its systemd unit (or ulimit -u {need}) for the user",
    "cgroup pids.max": lambda need: f"set TasksMax={need} in its unit (or pids.max of its cgroup)",
    "threads-max": lambda need: f"sysctl -w kernel.threads-max={need}",
}


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
        return f"{value.tz_convert('UTC') if value.tz else value:%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC"
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
        return f"<p>{html.escape(empty)}</p>"
    columns, headers = _shown(frame)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(row[c], c))}</td>" for c in columns) + "</tr>"
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
    """The sentence that names the recording's first failure (of the incidents)."""
    first = report.incidents[report.incidents["first_overall"].astype(bool)] if len(report.incidents) else None
    if first is None or not len(first):
        return NO_INCIDENTS
    row = first.iloc[0]
    where = f" on {row['host']}" if len(report.heat) else ""
    return (f"First failure: {row['comm']} [{row['first_pid']}]{where}, {row['failure']} at {_cell(row['first'])} "
            f"({row['count']:,} in all). Below, every program's failures, the most severe first.")


SECTIONS = ("Summary", "Timeline", "Spikes in socket, accept and connect calls and failures", "Training phases",
            "FD headroom",
            "Incidents: failures by program, most severe first", "Connect destinations", "Losses during the recording",
            "What to change", "Open descriptors by call site", "What the threads were doing",
            "Memory headroom and OOM kills")
MEMORY_COLUMNS = ["comm", "pid", "rss_mib", "limit_mib", "peak_mib", "usage", "memcg_oom_kills", "fit", "need_mib",
                  "time"]
VICTIM_COLUMNS = ["comm", "pid", "time", "anon_rss_kb", "last_state"]
NO_MEMORY = "No memory figures in this recording (recorded before fdtrace sampled memory, or no process sampled)."
NO_SITES = "No call sites in this recording (record with --stacks to have them)."
NO_CENSUS = "No thread census in this recording."
SITE_COLUMNS = ["pid", "comm", "site", "open", "opened", "closed", "oldest_age_s", "growth_per_min"]
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
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(report.title)}</title>",
             f"<style>{style}</style></head><body><h1>{html.escape(report.title)}</h1>",
             f"<p>made {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</p>",
             f"<h2>{SECTIONS[0]}</h2><table>"]
    parts += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in report.summary]
    parts.append("</table>")
    parts += [f"<h2>{SECTIONS[8]}</h2><ul>", *(f"<li>{html.escape(r)}</li>" for r in report.recommendations), "</ul>"]
    parts += _fleet_html(report)
    parts += [f"<h2>{SECTIONS[1]}</h2>", figure_html(report),
              *(f"<p>{html.escape(note)}</p>" for note in report.thread_notes)]
    parts += [f"<h2>{SECTIONS[2]}</h2>", _frame_html(report.spikes, NO_SPIKES),
              f"<h2>{SECTIONS[3]}</h2>", _frame_html(report.phase_stats, NO_PHASES),
              f"<h2>{SECTIONS[4]}</h2>", _frame_html(_headroom_view(report), "No samples."),
              f"<h2>{SECTIONS[11]}</h2>", _frame_html(_memory_view(report), NO_MEMORY),
              *([_frame_html(report.oom_victims[VICTIM_COLUMNS], "")] if len(report.oom_victims) else []),
              f"<h2>{SECTIONS[5]}</h2>", f"<p>{html.escape(first_failure(report))}</p>",
              _frame_html(report.incidents, ""),
              f"<h2>{SECTIONS[6]}</h2>", _frame_html(report.destinations.head(20), NO_DESTINATIONS),
              f"<h2>{SECTIONS[9]}</h2>", _frame_html(report.leaks, NO_SITES),
              f"<h2>{SECTIONS[10]}</h2>", _frame_html(report.threads, NO_CENSUS),
              *([_frame_html(report.thread_sites, "")] if len(report.thread_sites) else []),
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
