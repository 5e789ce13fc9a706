"""The report's sections, computed from a recording (loaded, or behind an engine) into one
typed ``Report``: nothing here renders; ``render`` turns it into HTML or Markdown."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from fdtrace.analysis import call_sites
from fdtrace.analysis import headroom_series as headroom_module
from fdtrace.analysis.binning import binned_counts, coarser, factor_for, pivot_rates, within
from fdtrace.analysis.destinations import destinations_on
from fdtrace.analysis.engines import Engine
from fdtrace.analysis.engines.dataset import engine_for, thread_starts
from fdtrace.analysis.failures import as_time, failures_on, incidents_on, severity_of
from fdtrace.analysis.fleet import cascade_from, fleet_heat_on
from fdtrace.analysis.memory import memory_needs_on, memory_series_on, oom_victims_on
from fdtrace.analysis.needs import fd_needs_on
from fdtrace.analysis.phase_alignment import align_spikes, phase_stats_on
from fdtrace.analysis.report.advice import recommendations
from fdtrace.analysis.span import span_on
from fdtrace.analysis.spike_finder import spikes
from fdtrace.analysis.summary import incident_windows
from fdtrace.policy import FD_EXHAUSTION_ERRNOS, THREADS_COUNTED
from fdtrace.schema import NOT_FAILURES, STATS

if TYPE_CHECKING:
    from fdtrace.analysis.engines.dataset import Analyzable, Dataset

#: The event columns the report reads (a large recording is loaded with these only).
EVENT_COLUMNS = ("ts_ns", "time", "pid", "start_ns", "comm", "kind", "syscall", "ret", "errno", "signal",
                 "exit_code", "anon_rss_kb", "file_rss_kb", "oom_score_adj", "peer_addr", "peer_port", "tid",
                 "stack_id", "limit_target", "limit_resource", "limit_soft", "limit_hard", "fd", "family")
SOCKET_KINDS = ["socket", "accept", "connect", "close"]
#: The calls whose bursts are spikes (with failed calls of any syscall): close() is not one of them.
SPIKE_KINDS = ["socket", "accept", "connect"]
#: Programs the spikes are looked for among (the busiest; the others are summed as one).
SPIKE_COLUMNS = 50
#: The columns of the open descriptors by call site.
SITE_COLUMNS = ["pid", "comm", "site", "open", "opened", "closed", "oldest_age_s", "growth_per_min"]


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
    # A distributed job (fdtrace run --record): each rank's descriptors by owner, how each owner
    # grows with the world size, the job at larger world sizes in words, and each owner's curve.
    ledger: pd.DataFrame = field(default_factory=pd.DataFrame)
    scale_laws: pd.DataFrame = field(default_factory=pd.DataFrame)
    scale_lines: list[str] = field(default_factory=list)
    scale_curve: pd.DataFrame = field(default_factory=pd.DataFrame)


#: The world sizes the report projects a distributed job to (and draws each owner at).
REPORT_WORLDS = (64, 512, 4096)
CURVE_WORLDS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def scale_section(recording: Dataset) -> tuple[pd.DataFrame, pd.DataFrame, list[str], pd.DataFrame]:
    """The ledger of the recording's distributed jobs (ranks by owner) and the largest job's
    projection: its laws, lines at REPORT_WORLDS and where its first limit breaks, each owner's
    curve. Empty when the recording holds no job (no ranks in its phases)."""
    from fdtrace.analysis.rank_ledger import job_ledgers
    from fdtrace.analysis.scale import project
    from fdtrace.errors import FdtraceError
    from fdtrace.schema.owners import OWNERS

    empty = pd.DataFrame()
    try:
        jobs = job_ledgers(recording)
    except FdtraceError:
        return empty, empty, [], empty
    if not jobs:
        return empty, empty, [], empty
    tables = []
    for job in jobs:
        wide = job.ranks[["job", "rank", "fds", "sockets", "threads", "fd_limit"]].set_index("rank")
        tables.append(wide.join(job.by_owner().rename(columns=OWNERS)).reset_index())
    ledger = pd.concat(tables, ignore_index=True)
    try:
        chosen = project(jobs, REPORT_WORLDS[0])
    except FdtraceError:  # jobs of different shapes: the largest alone
        chosen = project([max(jobs, key=lambda j: j.world_size)], REPORT_WORLDS[0])
        jobs = [max(jobs, key=lambda j: j.world_size)]
    lines = []
    for world in REPORT_WORLDS:
        at = project(jobs, world)
        for role, figures in at.roles.items():
            who = f"rank {at.store_rank}" if at.store_rank is not None and role == "store host" else (
                "each other rank" if "store host" in at.roles else "each rank")
            limit = figures["limit"]
            words = f"at {world:,} ranks {who} needs {figures['fds']:,} descriptors"
            if limit is not None:
                words += f"; its limit is {limit:,}"
                if figures["fds"] > limit:
                    fix = next((a for a in at.advice if a.startswith(f"at {world:,} ranks {who} ")), "")
                    words += ": " + fix.split(": ", 1)[1] if ": " in fix else ""
            lines.append(words)
    if chosen.first_limit is not None and chosen.max_world is not None:
        lines.append(f"the first limit to break is {chosen.first_limit.name}, at {chosen.first_limit.at_world:,} "
                     f"ranks: the job fits up to {chosen.max_world:,}")
    return ledger, chosen.laws_frame(), lines, chosen.curve(list(CURVE_WORLDS))


def build(recording: Analyzable, top: int = 3) -> Report:
    """Compute every section from a recording: loaded (``load()``) or in an engine
    (``load(..., engine="duckdb")``), whose tables are reduced there."""
    with engine_for(recording) as engine:
        engine.keep_derived()  # the rare kinds' rows and the EMFILE/ENFILE counts: read once for every section
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


def _fd_failures(engine: Engine) -> pd.DataFrame:
    """Each process's EMFILE/ENFILE: host, pid, start_ns, count ``n`` and its ``first`` (ns)."""
    return engine.query(f"SELECT host, pid, start_ns, CAST(sum(n) AS BIGINT) AS n, min(first_ns) AS first "
                        f"FROM {engine.derived('fd_failures')} GROUP BY 1, 2, 3")


def by_harm(least: pd.DataFrame, failing: pd.DataFrame) -> pd.DataFrame:
    """Processes (``least_headroom``'s rows) in the order the FD panel draws them: those that
    failed with EMFILE/ENFILE first (the most failures, then the first to fail), then the fullest
    by headroom in descriptors (soft limit minus open FDs: 1 left of 256 before 2 left of 32),
    then by usage."""
    if not len(least):
        return least
    counts = {(str(r.host), int(r.pid)): (int(r.n), int(r.first)) for r in failing.itertuples()}
    found = [counts.get((str(h), int(p)), (0, 0)) for h, p in zip(least["host"], least["pid"], strict=True)]
    left = (pd.to_numeric(least["fd_soft_limit"], errors="coerce") - pd.to_numeric(least["open_fds"], errors="coerce"))
    keyed = least.assign(_failed=[-n for n, _ in found], _first=[f for _, f in found],
                         _left=left.fillna(float("inf")).to_numpy(dtype="float64"),
                         _usage=-pd.to_numeric(least["usage"], errors="coerce").fillna(0).to_numpy(dtype="float64"))
    ordered = keyed.sort_values(["_failed", "_first", "_left", "_usage"], kind="stable")
    return ordered.drop(columns=["_failed", "_first", "_left", "_usage"])


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


def time_text(value: Any) -> str:
    """A time as the report writes it: UTC to the millisecond; "" for a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NaT or value is pd.NA:
        return ""
    if isinstance(value, pd.Timestamp):
        return f"{value.tz_convert('UTC') if value.tz else value:%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC"
    return str(value)


def _span(first: pd.Timestamp, last: pd.Timestamp) -> str:
    return f"{time_text(first)} to {time_text(last)} ({(last - first).total_seconds():,.1f} s)"


def _build(recording: Dataset, engine: Engine, top: int) -> Report:
    several = len(recording.meta) > 1
    # One pass over the events for every rate the report draws, over the recording's span only
    # (events far outside it are named, not drawn), in at most MAX_BINS bins.
    every = binned_counts(engine, "1s", ("kind", "comm", "errno", "host", "pid"))
    span = span_on(engine, counted=every)
    factor = factor_for(span, int(every.attrs["width_ns"]))
    counted = coarser(within(every, span), factor)
    socket_rate = pivot_rates(counted, kind=SOCKET_KINDS, by="kind")
    error_rate = pivot_rates(counted, errno=sorted(FD_EXHAUSTION_ERRNOS), by=None)
    fullest = headroom_module.least_headrooms_on(engine)
    least, by_threads = fullest["fds"], fullest["threads"]
    fd_series = _series_of(engine, by_harm(least, _fd_failures(engine)).head(top), ["open_fds", "fd_soft_limit"],
                           several)
    # The processes nearest a thread limit, then (where no limit is known) those with most threads.
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
    notes = recording.notes
    if notes:
        summary.append(("files read in part", f"{len(notes)} (values cut, rows left out or copies read once: "
                                              "fdtrace report names them on stderr)"))
    spike_table = spikes(pivot_rates(spike_calls(counted), by="comm", top=SPIKE_COLUMNS))
    phases = recording.table("phases")
    phases = pd.DataFrame() if phases is None else phases
    stats = pd.DataFrame()
    if len(phases):
        stats = phase_stats_on(engine, phases)
        spike_table = align_spikes(spike_table, phases)
    loss_rows = losses[losses[list(lost)].sum(axis=1) > 0] if lost and len(losses) else pd.DataFrame()
    found = failures_on(engine)
    incidents = incidents_on(engine, found=found)
    clocks = recording.clock_offsets
    needs = fd_needs_on(engine)
    memory, victims = memory_needs_on(engine, needs), oom_victims_on(engine)
    marks = phases[phases["end_wall_ns"].notna() & phases["rank"].notna()] if len(phases) else pd.DataFrame()
    ledger, laws, scale_lines, curve = scale_section(recording) if len(phases) else (
        pd.DataFrame(), pd.DataFrame(), [], pd.DataFrame())
    return Report(
        title=f"fdtrace report: {', '.join(recording.meta)}",
        summary=summary, socket_rate=socket_rate, fd_series=fd_series, error_rate=error_rate,
        spikes=spike_table, headroom=least, incidents=incidents, losses=loss_rows,
        failure_rate=_per_process(counted, 5, several, errno=sorted(FD_EXHAUSTION_ERRNOS)),
        call_rate=_per_process(counted, 5, several, kind=SOCKET_KINDS), thread_series=thread_series,
        thread_notes=thread_notes,
        markers=_markers(found, incidents, several),
        phase_marks=marks[["rank", "phase", "start_wall_ns", "end_wall_ns"]] if len(marks) else pd.DataFrame(),
        recommendations=recommendations(recording, least, engine, memory, victims, needs, by_threads),
        phase_stats=stats,
        memory=memory, oom_victims=victims, memory_series=_memory_series(engine, memory.head(top), several),
        destinations=destinations_on(engine), leaks=_leaks(recording), threads=_census_at_peak(recording),
        thread_sites=_thread_sites(engine, recording),
        heat=fleet_heat_on(engine, span=span) if several else pd.DataFrame(),
        cascade=cascade_from(found) if several else pd.DataFrame(),
        clocks=clocks if several and clocks is not None else pd.DataFrame(),
        ledger=ledger, scale_laws=laws, scale_lines=scale_lines, scale_curve=curve,
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
    """The memory over time of the chosen processes' memory cgroups, each as a percentage of its
    own limit (one line per cgroup: its usage is all its processes'; an uncapped process has no
    headroom to draw and would flatten the others), by a label naming the cgroup's process."""
    series = memory_series_on(engine, chosen)
    found: dict[str, pd.DataFrame] = {}
    seen: set[tuple[Any, ...]] = set()
    for row in chosen.itertuples():
        mine = series[(series["host"] == row.host) & (series["pid"] == row.pid)]
        limit = mine["memcg_limit_bytes"].astype("Float64")
        if not len(mine) or not limit.notna().any():
            continue
        usage = mine["memcg_usage_bytes"].astype("Float64")
        cgroups = mine["cgroup"].dropna()
        key = (row.host, str(cgroups.iloc[-1]) if len(cgroups) else f"pid {row.pid}")
        if key in seen:  # a process of a cgroup already drawn: its usage is the cgroup's
            continue
        seen.add(key)
        found[_label(row.host, row.comm, row.pid, several)] = pd.DataFrame({
            "time": mine["time"].to_numpy(),
            "memory_pct": (usage / limit * 100).to_numpy(dtype="float64", na_value=float("nan")),
            "limit_pct": (limit / limit * 100).to_numpy(dtype="float64", na_value=float("nan")),
            "memory_mib": (usage / (1 << 20)).to_numpy(dtype="float64", na_value=float("nan")),
            "limit_mib": (limit / (1 << 20)).to_numpy(dtype="float64", na_value=float("nan"))})
    return found


def _leaks(recording: Dataset) -> pd.DataFrame:
    sites = recording.table("fd_sites")
    if sites is None or not len(sites):
        return pd.DataFrame(columns=SITE_COLUMNS)
    end = int(recording.losses["ts_ns"].max()) if len(recording.losses) else None
    found = call_sites.leaks(sites, recording.stacks, end_ns=end)
    return found[SITE_COLUMNS].head(30)


def _census_at_peak(recording: Dataset) -> pd.DataFrame:
    """Each process's thread census at the round where it had the most threads."""
    census = call_sites.thread_census(recording.table("thread_census"))
    if not len(census):
        return census
    totals = census.groupby(["host", "pid", "time"], observed=True)["threads"].sum().reset_index()
    peaks = totals.loc[totals.groupby(["host", "pid"], observed=True)["threads"].idxmax()]
    at_peak = census.merge(peaks[["host", "pid", "time"]], on=["host", "pid", "time"])
    return at_peak[["time", "pid", "comm", "syscall", "fd_kind", "site", "threads"]].head(40)


def _thread_sites(engine: Engine, recording: Dataset) -> pd.DataFrame:
    started = thread_starts(engine)
    if not len(started):
        return pd.DataFrame()
    return call_sites.thread_sites(started, recording.table("stacks"))[
        ["pid", "comm", "site", "threads", "first", "last"]].head(20)
