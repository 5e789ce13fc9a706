"""Choosing what to check, and printing the checks as a table or JSON."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from fdtrace.advice.change import Change
from fdtrace.display import shown
from fdtrace.doctor.checks import Check, Doctor, RecordedProcess, Status

DEFAULT_TOP = 5


def _go_limit(failure: str) -> int | None:
    """The N of a "Go thread limit N exceeded" failure; None when its event held no number."""
    words = failure.split()
    return int(words[3]) if len(words) > 4 and words[3].isdigit() else None


def select_pids(doctor: Doctor, pids: tuple[int, ...], comms: tuple[str, ...]) -> list[int]:
    """The processes to check: those named (running or not: a recording may know them) and the
    running ones of the names given, else the top ones by open FDs and every haproxy."""
    if pids or comms:
        chosen = set(pids)
        for pid in doctor.sampler.pids():
            sample = doctor.sampler.sample(pid) if comms else None
            if sample is not None and sample.comm in comms:
                chosen.add(pid)
        return sorted(chosen)
    chosen = set(doctor.sampler.top_by_open_fds(DEFAULT_TOP))
    for pid in doctor.sampler.pids():
        sample = doctor.sampler.sample(pid)
        if sample is not None and sample.comm.startswith("haproxy"):
            chosen.add(pid)
    return sorted(chosen)


@dataclass
class FromRecording:
    """What ``apply_recording`` found: how far the listen-queue counters moved during the
    recording, and the processes that are gone that the recording let the doctor check."""

    listen_moved: dict[str, int] = field(default_factory=dict)
    gone: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what the reader left out or changed, one line each


def _recorded(row: Any, threads: pd.DataFrame, ends: dict[tuple[int, int], str],
              gone: bool = False, go_limits: dict[tuple[int, int], int | None] | None = None) -> RecordedProcess:
    def number(value: Any) -> int | None:
        return None if pd.isna(value) else int(value)
    mine = threads[(threads["pid"] == row.pid) & (threads["start_ns"] == row.start_ns)] if len(threads) else threads
    found = RecordedProcess(comm=str(row.comm), start_ns=number(row.start_ns), fd_soft_limit=number(row.fd_soft_limit),
                            fd_hard_limit=number(row.fd_hard_limit), peak_fds=number(row.peak_fds),
                            emfile=int(row.emfile), emfile_worst_second=int(row.emfile_worst_second),
                            maxsock=number(row.maxsock), exit=ends.get((int(row.pid), number(row.start_ns) or -1)),
                            gone=gone, go_thread_limit=(go_limits or {}).get(
                                (int(row.pid), -1 if pd.isna(row.start_ns) else int(row.start_ns))),
                            limit_source=getattr(row, "limit_source", None) or None)
    if len(mine):
        top = mine.iloc[0]
        kind = top["thread_limit_kind"]
        found.thread_limit_kind = kind if isinstance(kind, str) else None
        found.threads, found.thread_limit = number(top["threads"]), number(top["thread_limit"])
        found.thread_count = number(top["thread_count"])
    return found


def apply_recording(directory: Path, doctor: Doctor, pids: list[int], engine: str = "auto",
                    comms: tuple[str, ...] = ()) -> FromRecording:
    """Give the doctor what a recording knows (what its reader left out or changed is in the
    result's ``problems``): for each running process, its peak open FDs,
    EMFILE failures and thread growth (its rows with the same pid and start, else with the same
    name); for each process in ``pids`` that is gone, or of a name in ``comms`` with no running
    process of that name (or, when neither is given, that failed with EMFILE or exceeded Go's
    thread limit), all the recording holds of it (``Doctor.recorded``). ``engine``: as
    ``fdtrace.analysis.load``'s."""
    from fdtrace.analysis import load
    from fdtrace.analysis.engines import quote
    from fdtrace.analysis.engines.dataset import engine_for
    from fdtrace.analysis.failures import failures_on
    from fdtrace.analysis.headroom_series import least_headroom_on
    from fdtrace.analysis.memory import memory_needs_on, oom_victims_on
    from fdtrace.analysis.needs import fd_needs_on
    from fdtrace.analysis.summary import named_problems

    recording = load(directory, engine=engine)
    live = {pid: doctor.sampler.sample(pid) for pid in pids}
    running_pids = sorted(pid for pid, s in live.items() if s is not None)
    names = sorted({s.comm for s in live.values() if s is not None})
    # Only the running processes' samples (for their thread growth): a fleet's are not all read.
    wanted_rows = " OR ".join([f"pid IN ({', '.join(map(str, running_pids))})"] * bool(running_pids)
                              + [f"comm IN ({', '.join(quote(n) for n in names)})"] * bool(names)) or "false"
    with engine_for(recording) as runner:
        needs = fd_needs_on(runner)
        threads = least_headroom_on(runner, resource="threads")
        ended = failures_on(runner)
        samples = runner.query(f"SELECT pid, start_ns, comm, ts_ns, threads FROM samples WHERE {wanted_rows}")
        memory = memory_needs_on(runner, needs)
        victims = oom_victims_on(runner)
    system = recording.system
    recording.close()
    found = FromRecording(problems=named_problems(recording))
    refused = ended[(ended["kind"].astype(str) == "accept") & ended["failure"].str.endswith("EMFILE")]
    doctor.accept_failures = [f"{comm} [{pid}]" for (comm, pid), _ in
                              refused.groupby([refused["comm"].astype(str), "pid"]).size().sort_values(
                                  ascending=False).head(3).items()]
    ends = {(int(r.pid), -1 if pd.isna(r.start_ns) else int(r.start_ns)): str(r.failure)
            for r in ended.itertuples() if r.kind in ("process_exit", "oom_kill")}
    go_limits = {(int(r.pid), -1 if pd.isna(r.start_ns) else int(r.start_ns)): _go_limit(str(r.failure))
                 for r in ended.itertuples() if r.kind == "go_thread_limit"}
    running = {(s.pid, s.start_ns) for s in live.values() if s is not None}
    not_running = needs[pd.Series([(p, s) not in running for p, s in zip(needs["pid"], needs["start_ns"], strict=True)],
                                  index=needs.index, dtype=bool)]
    for pid, sample in live.items():
        if sample is None:  # gone: its last process of that pid in the recording
            rows = not_running[not_running["pid"] == pid].sort_values("start_ns")
            if len(rows):
                doctor.recorded[pid] = _recorded(rows.iloc[-1], threads, ends, gone=True, go_limits=go_limits)
                found.gone.append(pid)
            continue
        rows = needs[(needs["pid"] == pid) & (needs["start_ns"] == sample.start_ns)]
        if rows.empty:
            rows = needs[needs["comm"].astype(str) == sample.comm]
        if rows.empty:
            continue
        best = rows.sort_values(["emfile", "need"], ascending=False).iloc[0]
        doctor.recorded[pid] = _recorded(best, threads, ends, go_limits=go_limits)
        doctor.peaks[pid] = int(rows["peak_fds"].max()) if rows["peak_fds"].notna().any() else 0
        mine = samples[(samples["pid"] == pid) & (samples["start_ns"] == sample.start_ns)]
        if mine.empty:
            mine = samples[samples["comm"].astype(str) == sample.comm]
        span = (mine["ts_ns"].max() - mine["ts_ns"].min()) / 1e9 if len(mine) else 0
        if span > 0:
            first, last = mine.sort_values("ts_ns")["threads"].iloc[[0, -1]]
            doctor.thread_growth[pid] = max(0.0, (last - first) / span)
    live_names = {s.comm for s in live.values() if s is not None}
    wanted = [c for c in comms if c not in live_names]
    failed = (not_running["emfile"] > 0) | pd.Series(
        [(p, -1 if pd.isna(s) else s) in go_limits for p, s in zip(not_running["pid"], not_running["start_ns"],
                                                                    strict=True)], index=not_running.index, dtype=bool)
    extra = not_running[not_running["comm"].astype(str).isin(wanted)] if wanted else (
        not_running[failed] if not pids and not comms else not_running.iloc[0:0])
    for _, rows in extra.groupby(extra["comm"].astype(str), sort=True):
        for row in rows.head(DEFAULT_TOP).itertuples():  # needs come with the most failed first
            if int(row.pid) not in doctor.recorded and int(row.pid) not in live:
                doctor.recorded[int(row.pid)] = _recorded(row, threads, ends, gone=True, go_limits=go_limits)
                found.gone.append(int(row.pid))
    _add_memory(doctor.recorded, memory, victims)
    for column, name in (("listen_overflows", "ListenOverflows"), ("listen_drops", "ListenDrops")):
        if column in system.columns and len(system):
            found.listen_moved[name] = int(system[column].max() - system[column].min())
    return found


def _add_memory(recorded: dict[int, RecordedProcess], memory: pd.DataFrame, victims: pd.DataFrame) -> None:
    """What the recording's memory figures say of each recorded process (``analysis.memory``)."""
    for pid, found in recorded.items():
        def mine(table: pd.DataFrame, pid: int = pid, found: RecordedProcess = found) -> pd.DataFrame:
            rows = table[table["pid"] == pid]
            if found.start_ns is not None:
                rows = rows[rows["start_ns"] == found.start_ns]
            return rows
        found.oom_killed = bool(len(mine(victims)))
        rows = mine(memory)
        if rows.empty:
            continue
        row = rows.iloc[-1]
        found.memcg_limit = None if pd.isna(row["memcg_limit_bytes"]) else int(row["memcg_limit_bytes"])
        found.memcg_peak = None if pd.isna(row["memcg_peak_bytes"]) else int(row["memcg_peak_bytes"])
        found.memory_need = None if pd.isna(row["need"]) else int(row["need"])
        found.memory_basis = str(row["basis"] or row["fit"] or "")
        found.memory_change = row["advice"] if isinstance(row["advice"], Change) else None


def run_checks(doctor: Doctor, pids: list[int], listen_moved: dict[str, int] | None) -> list[Check]:
    """System checks, then each process's."""
    checks = doctor.system_checks(listen_moved, consumers=doctor.sampler.top_by_open_fds(10))
    for pid in pids:
        checks += doctor.process_checks(pid)
    return checks


def worst(checks: list[Check]) -> Status:
    """The worst status (the exit code)."""
    return max((c.status for c in checks), default=Status.OK)


def as_json(checks: list[Check]) -> str:
    """The checks and the overall status as JSON."""
    return json.dumps({"status": worst(checks).name, "checks": [c.as_dict() for c in checks]}, indent=1)


#: Widest a column of the table gets before its text wraps onto more lines.
COLUMN_WIDTHS = (6, 34, 34, 56, 34)


def as_table(checks: list[Check], overall: bool = True) -> str:
    """A table for a terminal (long cells wrap at word boundaries, never cut), then the changes
    to make, numbered, then the overall status (``overall``: rehearse says its own verdict)."""
    header = ("STATUS", "SCOPE", "CHECK", "CURRENT", "RECOMMENDED")
    rows = [(c.status.name, *(shown(text) for text in (c.scope, c.name, c.current, c.recommended))) for c in checks]
    widths = [min(max(len(r[i]) for r in [header, *rows]), COLUMN_WIDTHS[i]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [textwrap.wrap(cell, width, break_long_words=True, break_on_hyphens=False) or [""]
                 for cell, width in zip(row, widths, strict=True)]
        for depth in range(max(len(c) for c in cells)):
            lines.append("  ".join((c[depth] if depth < len(c) else "").ljust(w)
                                   for c, w in zip(cells, widths, strict=True)).rstrip())
    changes = [c for c in checks if c.change]
    if changes:
        lines += ["", "Changes:"]
        for i, c in enumerate(changes, 1):
            lines += textwrap.wrap(shown(f"{i}. [{c.status.name}] {c.scope}, {c.name}: {c.change}"), 110,
                                   subsequent_indent="   ", break_on_hyphens=False)
    if overall:
        lines += ["", f"overall: {worst(checks).name}"]
    return "\n".join(lines)
