"""A plain-text summary of a recording or a fleet (``fdtrace info``), computed in an engine: only
counts and the few rows shown come back from the tables."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pandas as pd

from fdtrace.analysis.destinations import destinations_from, destinations_on
from fdtrace.analysis.engines import Engine
from fdtrace.analysis.engines.dataset import engine_for
from fdtrace.analysis.headroom_series import least_headrooms_on
from fdtrace.analysis.span import span_on
from fdtrace.display import shown
from fdtrace.schema import STATS
from fdtrace.schema.failures import (
    FD_SQL,
    HARM,
    INCIDENT_SQL,
    REQUESTED_SIGNALS,
    REQUESTED_SQL,
    harm_order,
    oom_ends,
)
from fdtrace.units import kib

if TYPE_CHECKING:
    from fdtrace.analysis.engines.dataset import Analyzable, Dataset

#: Processes shown under "least headroom": those at least this close to a limit (or that failed).
SHOWN_USAGE = 0.5
#: Lines of one kind shown before "... and N more".
SHOWN_LINES = 20


def when(value: Any) -> str:
    """A wall time for people: 2026-11-30 05:36:15.698 UTC."""
    stamp = pd.Timestamp(value)
    return "?" if pd.isna(stamp) else stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _ns(value: Any) -> str:
    return when(pd.Timestamp(int(value), unit="ns", tz="UTC")) if pd.notna(value) else "?"


def _capped(lines: list[str], what: str) -> list[str]:
    if len(lines) <= SHOWN_LINES:
        return lines
    return [*lines[:SHOWN_LINES], f"  ... and {len(lines) - SHOWN_LINES} more {what}"]


def _text_order(value: Any) -> tuple[bool, str]:
    """A sort key of a text column's value as pandas sorts it: missing values last."""
    missing = not isinstance(value, str) and bool(pd.isna(value))
    return missing, "" if missing else str(value)


def _failed(engine: Engine) -> pd.DataFrame:
    """In one pass over the events: EMFILE/ENFILE counted per process and syscall (``at`` null),
    and each OOM kill, kill by a signal and end on request (``at`` its time)."""
    return engine.query(
        f"SELECT host, pid, comm, kind, errno, syscall, signal, anon_rss_kb, CASE WHEN {FD_SQL} THEN NULL ELSE "
        f"time_ns END AS at, count(*) AS n, min(time_ns) AS first FROM events WHERE {INCIDENT_SQL} "
        f"OR ({REQUESTED_SQL}) GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9")


def headline(engine: Engine, least: pd.DataFrame, several_hosts: bool = False,
             failed: pd.DataFrame | None = None) -> list[str]:
    """What went wrong, most harmful first (``schema.failures.harm_order``): EMFILE/ENFILE per
    process and syscall and OOM kills, then Go thread limits, then crashes, then the processes
    that reached a limit; each rank capped on its own. Ends on request (SIGHUP, SIGINT, SIGTERM,
    SIGPIPE) are one line apart, never a failure."""
    def who(host: Any, comm: Any, pid: Any) -> str:
        return f"{comm} [{pid}]" + (f" on {host}" if several_hosts else "")

    failed = _failed(engine) if failed is None else failed
    ends = failed["at"].notna()
    if ends.any():  # an OOM kill's victim's SIGKILL exit is that kill's end: one harm, said once
        at = failed["at"].fillna(-1)  # the calls' rows (no time) never match
        failed = failed[~oom_ends(failed["pid"], at, failed["kind"].astype(str), failed["signal"], failed["host"])]
    requested = failed["at"].notna() & (failed["kind"] == "process_exit") & failed["signal"].isin(REQUESTED_SIGNALS)
    asked, failed = failed[requested], failed[~requested]
    calls = failed[failed["at"].isna()]
    # Every failing process, ranked by harm (schema.failures.harm_order): each rank capped on its
    # own, so a host full of failing calls still shows its deaths.
    ranked: dict[int, list[tuple[tuple[int, int, int], str]]] = {}
    ends = failed[failed["at"].notna()]
    for row in ends.itertuples():
        kind = str(row.kind)
        what = {"oom_kill": "OOM-killed", "go_thread_limit": "exceeded its Go thread limit (the runtime said so, and "
                "exits 2)"}.get(kind, f"killed by {row.signal}")
        cls = {"oom_kill": "OOM kill", "go_thread_limit": "Go thread limit"}.get(kind, "killed by a signal")
        key = harm_order(cls, 1, int(row.at))
        ranked.setdefault(key[0], []).append((key, f"  {who(row.host, row.comm, row.pid)}: {what} at {_ns(row.at)}"))
    # One walk over the calls' rows, not a filter of all of them per process: a fleet has
    # hundreds of failing processes.
    per_process: dict[tuple[Any, Any, Any], list[tuple[Any, Any, int, int]]] = {}
    for host, pid, comm, errno, syscall, n, first in zip(calls["host"], calls["pid"], calls["comm"], calls["errno"],
                                                          calls["syscall"], calls["n"], calls["first"], strict=True):
        per_process.setdefault((host, pid, comm), []).append((errno, syscall, int(n), int(first)))
    for (host, pid, comm), mine in per_process.items():
        mine.sort(key=lambda call: (-call[2], _text_order(call[0]), _text_order(call[1])))
        total, first = sum(call[2] for call in mine), min(call[3] for call in mine)
        detail = ", ".join(f"{errno} {syscall} {n}" for errno, syscall, n, _ in mine)
        key = harm_order("EMFILE/ENFILE", total, first)
        ranked.setdefault(key[0], []).append((key, f"  {who(host, comm, pid)}: {total} calls failed "
                                                   f"({detail}), first at {_ns(first)}"))
    lines: list[str] = []
    for rank in sorted(ranked):
        lines += _capped([text for _, text in sorted(ranked[rank], key=lambda found: found[0])],
                         "failing processes" if rank == HARM["EMFILE/ENFILE"] else "processes ended")
    apart = []
    if len(asked):
        signals = asked.groupby("signal")["n"].sum().sort_index()
        apart = ["ended on request, not failures: " + ", ".join(f"{name} {int(n)}" for name, n in signals.items())
                 + " (e.g. " + ", ".join(f"{r.comm} [{r.pid}]" for r in asked.sort_values("at").head(3).itertuples())
                 + ")"]
    reached: list[str] = []
    if len(least):
        for row in least[least["usage"] >= 1.0].itertuples():
            reached.append(f"  {who(row.host, row.comm, row.pid)}: reached its FD limit, {row.open_fds} of "
                           f"{row.fd_soft_limit:.0f} at {when(row.time)}")
    if not lines and not reached:
        return ["what went wrong: nothing (no EMFILE/ENFILE, OOM kill, Go thread limit, crash or full FD table)",
                *apart]
    return ["what went wrong:", *lines, *_capped(reached, "processes at their limit"), *apart]


def _hosts(recording: Dataset, engine: Engine, kinds: pd.DataFrame) -> list[str]:
    spans = kinds.groupby("host").agg(n=("n", "sum"), first=("first", "min"), last=("last", "max"))
    lost_columns = [name for name in STATS if name in engine.columns("losses")]
    lost = engine.query(f"SELECT host, {', '.join(f'sum({c}) AS {c}' for c in lost_columns)} FROM losses "
                        "GROUP BY 1").set_index("host") if lost_columns else pd.DataFrame()
    offsets = recording.clock_offsets
    offsets = offsets.set_index("host") if offsets is not None and len(offsets) else pd.DataFrame()
    lines = []
    clocks = _own_clocks(engine)
    for host, meta in sorted(recording.meta.items()):
        state = "complete" if meta.get("complete") else "incomplete (recorder did not stop cleanly)"
        lines.append(f"host {host}: kernel {meta.get('kernel')}, fdtrace {meta.get('fdtrace_version')}, {state}")
        if len(recording.meta) > 1:
            events = int(spans.loc[host, "n"]) if host in spans.index else 0
            span = f"{_ns(spans.loc[host, 'first'])} .. {_ns(spans.loc[host, 'last'])}, " if events else ""
            losses = lost.loc[host].fillna(0).astype("int64") if host in lost.index else pd.Series(dtype="int64")
            detail = "".join(f", {k} {v}" for k, v in losses.items() if v)
            lines.append(f"  {span}{events} events, {int(losses.sum())} lost{detail}")
            if host in offsets.index:
                row = offsets.loc[host]
                corrected = ", corrected" if recording.clock_corrected else ", not corrected"
                lines.append("  clock: the reference of the fleet's timeline" if row["reference"] else
                             f"  clock: {clock_text(row)}{corrected}")
            elif len(offsets):
                lines.append("  clock: no connection pairs with the other hosts in both directions: not corrected")
        if host in clocks:
            lines.append(f"  {clocks[host]}")
        rotated = meta.get("rotated_out") or {}
        if rotated.get("files"):
            rows = ", ".join(f"{t} {n}" for t, n in rotated["rows"].items() if n)
            lines.append(f"  rotated out (--max-size): {rotated['files']} oldest files, {rows} rows")
        lines += incident_window_lines(meta)
        if meta.get("probes_skipped"):
            lines.append(f"  probes skipped: {', '.join(meta['probes_skipped'])}")
        lines += [f"  left unread while recording: {shown(text)}" for text in (meta.get("unread") or [])[:10]]
    return lines


def incident_windows(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """The incident windows a ring kept (``record --max-size``), and those it had to drop, as
    (what, text) pairs: ``info`` and the report say the same."""
    found = []
    windows = meta.get("incident_windows")
    for window in windows if isinstance(windows, list) else []:
        try:
            kinds = ", ".join(f"{shown(str(kind))} {int(n)}" for kind, n in dict(window["incidents"]).items())
            program = window.get("program")
            uid = window.get("uid")
            who = (shown(program) + (f" (uid {uid})" if isinstance(uid, int) and not isinstance(uid, bool) else "")
                   + ": ") if isinstance(program, str) and program else ""
            trimmed = " (trimmed to fit --keep-incidents)" if window.get("trimmed") is True else ""
            found.append(("incident window kept (--keep-incidents)",
                          f"{_ns(int(window['start']))} .. {_ns(int(window['end']))}: {who}{kinds}{trimmed}"))
        except (KeyError, TypeError, ValueError):
            continue
    dropped = meta.get("incidents_dropped")
    if isinstance(dropped, dict) and _count(dropped.get("windows")) > 0:
        found.append(("incident windows given up (more than --keep-incidents holds)",
                      f"{dropped['windows']} windows, {_count(dropped.get('incidents'))} incidents"))
    return found


def incident_window_lines(meta: dict[str, Any]) -> list[str]:
    """``info``'s lines of :func:`incident_windows`."""
    return [f"  {what}: {text}" for what, text in incident_windows(meta)]


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def clock_text(row: Any) -> str:
    """A host's offset for people: "+3.000012 s (± 0.041 ms, 40 connection pairs), corrected"."""
    return (f"{row['offset_ns'] / 1e9:+.6f} s from the reference (± {row['uncertainty_ns'] / 1e6:.3f} ms, "
            f"{row['pairs']} connection pairs{', via ' + row['via'] if row['via'] else ''})")


def _own_clocks(engine: Engine) -> dict[str, str]:
    """Each host's own last word on its clock (adjtimex), where it was not synchronized: the
    engine picks each host's last row that says, so a fleet's clock rows do not come back."""
    last = engine.query(
        "SELECT host, synchronized, max_error_us FROM (SELECT host, synchronized, max_error_us, row_number() OVER "
        "(PARTITION BY host ORDER BY ts_ns DESC) AS newest FROM clock WHERE synchronized IS NOT NULL) AS said "
        "WHERE newest = 1")
    return {str(row.host): ("own clock: not synchronized (adjtimex), maximum error "
                            + (f"{int(row.max_error_us) / 1e6:.3f} s" if pd.notna(row.max_error_us) else "unknown")
                            + ": its wall times are only as good as that")
            for row in last.itertuples() if not bool(row.synchronized)}


def summary_on(recording: Dataset, engine: Engine) -> str:
    """``summary()`` of a recording whose tables ``engine`` holds."""
    engine.keep_derived()  # the rare kinds' rows and the EMFILE/ENFILE counts: read once, for every query below
    fullest = least_headrooms_on(engine)
    least, fullest_threads = fullest["fds"], fullest["threads"]
    several = len(recording.meta) > 1
    # A fleet's part files carry summaries of their events: then no event is read.
    parts = recording.part_summaries() if hasattr(recording, "part_summaries") else None
    failed = parts["failed"] if parts is not None else _failed(engine)
    lines = headline(engine, least, several_hosts=several, failed=failed)
    from fdtrace.analysis.memory import memory_advice_lines, memory_needs_on, oom_victims_on
    from fdtrace.analysis.needs import fd_needs_on
    from fdtrace.analysis.report.advice import fd_advice, system_advice, thread_advice

    needs = fd_needs_on(engine)
    advice = fd_advice(needs, several=several)  # the numbers doctor and the report give
    victims = oom_victims_on(engine)
    memory = memory_needs_on(engine, needs)
    advice += memory_advice_lines(memory, victims, several=several)
    # the report's lines, as it says them
    advice += system_advice(engine) + thread_advice(engine, fullest_threads)
    if advice:
        lines += ["what to change:", *_capped([f"  {line}" for line in advice], "processes")]
    by_host = parts["kinds"] if parts is not None else engine.query(
        "SELECT host, kind, count(*) AS n, min(time_ns) AS first, max(time_ns) AS last FROM events GROUP BY 1, 2")
    lines += _hosts(recording, engine, by_host)
    kinds = by_host.groupby("kind").agg(n=("n", "sum"), first=("first", "min"), last=("last", "max")).reset_index()
    kinds = kinds.sort_values(["n", "kind"], ascending=[False, True])
    total = int(kinds["n"].sum()) if len(kinds) else 0
    if total:
        span = span_on(engine, kinds=by_host)
        first, last = kinds["first"].min(), kinds["last"].max()
        if span.outside:  # the span of the events inside the recorded span
            inside = engine.query(f"SELECT min(time_ns) AS first, max(time_ns) AS last FROM events "
                                  f"WHERE {span.condition()}")
            first, last = inside["first"].iloc[0], inside["last"].iloc[0]
        lines.append(f"span: {_ns(first)} .. {_ns(last)}")
        if span.outside:
            lines.append(f"  {span.describe()}")
    lines.append(f"events: {total}")
    lines += [f"  {row.kind}: {row.n}" for row in kinds.itertuples() if row.n]
    lost_columns = [name for name in STATS if name in engine.columns("losses")]
    lost: dict[str, int] = {}
    if lost_columns:
        sums = engine.query(f"SELECT {', '.join(f'sum({c}) AS {c}' for c in lost_columns)} FROM losses")
        lost = {c: int(v) if pd.notna(v) else 0 for c, v in sums.iloc[0].items()}
    lines.append(f"losses: {sum(lost.values())}" + "".join(f", {k} {v}" for k, v in lost.items() if v))
    if len(least):
        close = least[least["usage"] >= SHOWN_USAGE]
        lines.append(f"least FD headroom (processes at {SHOWN_USAGE:.0%} or more of their limit):"
                     + ("" if len(close) else " none"))
        for row in close.head(10).itertuples():
            lines.append(f"  pid {row.pid} {row.comm}{f' on {row.host}' if several else ''}: {row.open_fds} open of "
                         f"{row.fd_soft_limit:.0f} "
                         f"({row.usage:.0%}, headroom {row.headroom:.0f}) at {when(row.time)}")
        threads = fullest_threads.dropna(subset=["thread_usage"])
        threads = threads[threads["thread_usage"] >= SHOWN_USAGE]
        if len(threads):
            lines.append("least thread headroom:")
            for row in threads.head(5).itertuples():
                lines.append(f"  pid {row.pid} {row.comm}{f' on {row.host}' if several else ''}: "
                             f"{row.thread_count:.0f} of {row.thread_limit:.0f} "
                             f"({row.thread_limit_kind}, {row.thread_usage:.0%}) at {when(row.time)}")
    close_memory = memory[memory["usage"].astype("float64") >= SHOWN_USAGE] if len(memory) else memory
    if len(close_memory):
        lines.append("least memory headroom (memory cgroups at 50% or more of their limit, at their peak):")
        for row in close_memory.head(5).itertuples():
            lines.append(f"  pid {row.pid} {row.comm}{f' on {row.host}' if several else ''}: "
                         f"{kib(float(row.memcg_peak_bytes))} of {kib(float(row.memcg_limit_bytes))} ({row.usage:.0%})"
                         + (f", {row.fit}" if row.fit else ""))
    failing = destinations_from(parts["connects"]) if parts is not None else destinations_on(engine)
    failing = failing[failing["failed"] > 0]
    if len(failing):
        lines.append("failed connect() destinations:")
        for row in failing.head(5).itertuples():
            errors = ", ".join(f"{errno} {count}" for errno, count in row.errors.items())
            lines.append(f"  pid {row.pid} {row.comm} -> {row.peer_addr}:{row.peer_port}: "
                         f"{row.failed} of {row.calls} failed ({errors})")
    ooms = failed[failed["kind"] == "oom_kill"].sort_values(["at", "host", "pid"])
    last_seen = {(str(v.host), int(v.pid)): v.last_state for v in victims.itertuples()}
    oom_lines = [f"OOM kill: pid {row.pid} {row.comm}{f' on {row.host}' if several else ''} anon-rss "
                 f"{'?' if pd.isna(row.anon_rss_kb) else int(row.anon_rss_kb)} kB at {_ns(row.at)}"
                 + (f"; last seen {last_seen[(str(row.host), int(row.pid))]}"
                    if (str(row.host), int(row.pid)) in last_seen else "")
                 for row in ooms.itertuples()]
    lines += _capped(oom_lines, "OOM kills")
    if recording.skipped:
        lines.append("skipped unreadable files:")
        lines += [f"  {s}" for s in alike_grouped(list(recording.skipped))]
    notes = alike_grouped(recording.notes)
    if notes:
        lines.append("read in part or once:")
        lines += [f"  {n}" for n in notes]
    return "\n".join(shown(line) for line in lines)  # a name holding a newline cannot split a line


#: Findings of one kind shown file by file at most; the rest are one line with their count.
ALIKE_SHOWN = 3
_NUMBER = re.compile(r"\b\d[\d,]*\b")  # a number on its own, not the 1 of PAR1


def alike_grouped(notes: list[str], shown_each: int = ALIKE_SHOWN) -> list[str]:
    """The readers' notes ("FILE: what"), at most ``shown_each`` of each kind (the same words,
    whatever the file and the numbers), then one line with how many more files had it: a
    recording of a thousand mutated parts is a few lines, each with its count."""
    kinds: dict[str, list[str]] = {}
    for note in notes:
        what = note.split(": ", 1)[1] if ": " in note else note
        kinds.setdefault(_NUMBER.sub("N", what), []).append(note)
    said = []
    for alike in kinds.values():
        said += alike[:shown_each]
        if len(alike) > shown_each:
            first = alike[0].split(": ", 1)[1] if ": " in alike[0] else alike[0]
            if _NUMBER.search(first):
                kind = re.sub(r"^[\d,]+ (of [\d,]+ )?", "", first.split(" (", 1)[0])
                first = f"{kind} (each with its own numbers)"
            said.append(f"and {len(alike) - shown_each:,} more files alike: {first}")
    return said


def named_problems(recording: Dataset) -> list[str]:
    """What the readers left out or changed, one line each, for a command to say on stderr:
    ``skipped FILE: why`` for what was not read, ``FILE: what`` for files read in part (at most
    ALIKE_SHOWN of a kind, then their count)."""
    return ([f"skipped {text}" for text in alike_grouped(list(recording.skipped))]
            + alike_grouped(list(recording.notes)))


def summary(recording: Analyzable) -> str:
    """Lines for a terminal: what went wrong first, then what the recording holds."""
    with engine_for(recording) as engine:
        return summary_on(recording, engine)
