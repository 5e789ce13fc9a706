"""A plain-text summary of a loaded recording (``fdtrace info``)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fdtrace.analysis.destinations import destinations
from fdtrace.analysis.headroom_series import least_headroom
from fdtrace.policy import FD_EXHAUSTION_ERRNOS
from fdtrace.recording import Recording
from fdtrace.schema import STATS

#: Processes shown under "least headroom": those at least this close to a limit (or that failed).
SHOWN_USAGE = 0.5


def when(value: Any) -> str:
    """A wall time for people: 2026-11-30 05:36:15.698 UTC."""
    stamp = pd.Timestamp(value)
    return "?" if pd.isna(stamp) else stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def headline(recording: Recording, least: pd.DataFrame) -> list[str]:
    """What went wrong, worst first: EMFILE/ENFILE per process and syscall, OOM kills, kills by a
    signal, and the processes that reached a limit."""
    events = recording.events
    lines: list[str] = []
    if len(events):
        failed = events[events["errno"].astype(str).isin(FD_EXHAUSTION_ERRNOS)]
        for (pid, comm), rows in failed.groupby(["pid", failed["comm"].astype(str)], observed=True, sort=False):
            calls = rows.groupby([rows["errno"].astype(str), rows["syscall"].astype(str)], observed=True).size()
            detail = ", ".join(f"{errno} {syscall} {count}" for (errno, syscall), count in
                               calls.sort_values(ascending=False).items())
            lines.append(f"  {comm} [{pid}]: {len(rows)} calls failed ({detail}), first at {when(rows['time'].min())}")
        for row in events[events["kind"] == "oom_kill"].itertuples():
            lines.append(f"  {row.comm} [{row.pid}]: OOM-killed at {when(row.time)}")
        killed = events[(events["kind"] == "process_exit") & events["signal"].notna()]
        for row in killed.itertuples():
            lines.append(f"  {row.comm} [{row.pid}]: killed by {row.signal} at {when(row.time)}")
    if len(least):
        for row in least[least["usage"] >= 1.0].itertuples():
            lines.append(f"  {row.comm} [{row.pid}]: reached its FD limit, {row.open_fds} of {row.fd_soft_limit:.0f} "
                         f"at {when(row.time)}")
    return ["what went wrong:", *lines] if lines else ["what went wrong: nothing (no EMFILE/ENFILE, OOM kill, "
                                                        "kill by a signal or full FD table)"]


def summary(recording: Recording) -> str:
    """Lines for a terminal: what went wrong first, then what the recording holds."""
    events = recording.events
    least = least_headroom(recording)
    lines = headline(recording, least)
    for host, meta in sorted(recording.meta.items()):
        state = "complete" if meta.get("complete") else "incomplete (recorder did not stop cleanly)"
        lines.append(f"host {host}: kernel {meta.get('kernel')}, fdtrace {meta.get('fdtrace_version')}, {state}")
        rotated = meta.get("rotated_out") or {}
        if rotated.get("files"):
            rows = ", ".join(f"{t} {n}" for t, n in rotated["rows"].items() if n)
            lines.append(f"  rotated out (--max-size): {rotated['files']} oldest files, {rows} rows")
        if meta.get("probes_skipped"):
            lines.append(f"  probes skipped: {', '.join(meta['probes_skipped'])}")
    if len(events):
        lines.append(f"span: {when(events['time'].min())} .. {when(events['time'].max())}")
    lines.append(f"events: {len(events)}")
    if len(events):
        for kind, count in events["kind"].value_counts().items():
            if count:
                lines.append(f"  {kind}: {count}")
    losses = recording.losses
    lost = {name: int(losses[name].sum()) for name in STATS if name in losses.columns}
    lines.append(f"losses: {sum(lost.values())}" + "".join(f", {k} {v}" for k, v in lost.items() if v))
    if len(least):
        close = least[least["usage"] >= SHOWN_USAGE]
        lines.append(f"least FD headroom (processes at {SHOWN_USAGE:.0%} or more of their limit):"
                     + ("" if len(close) else " none"))
        for row in close.head(10).itertuples():
            lines.append(f"  pid {row.pid} {row.comm}: {row.open_fds} open of {row.fd_soft_limit:.0f} "
                         f"({row.usage:.0%}, headroom {row.headroom:.0f}) at {when(row.time)}")
        threads = least_headroom(recording, resource="threads").dropna(subset=["thread_usage"])
        threads = threads[threads["thread_usage"] >= SHOWN_USAGE]
        if len(threads):
            lines.append("least thread headroom:")
            for row in threads.head(5).itertuples():
                lines.append(f"  pid {row.pid} {row.comm}: {row.thread_count:.0f} of {row.thread_limit:.0f} "
                             f"({row.thread_limit_kind}, {row.thread_usage:.0%}) at {when(row.time)}")
    failing = destinations(recording)
    failing = failing[failing["failed"] > 0]
    if len(failing):
        lines.append("failed connect() destinations:")
        for row in failing.head(5).itertuples():
            errors = ", ".join(f"{errno} {count}" for errno, count in row.errors.items())
            lines.append(f"  pid {row.pid} {row.comm} -> {row.peer_addr}:{row.peer_port}: "
                         f"{row.failed} of {row.calls} failed ({errors})")
    if len(events):
        ooms = events[events["kind"] == "oom_kill"]
        for row in ooms.itertuples():
            lines.append(f"OOM kill: pid {row.pid} {row.comm} anon-rss {row.anon_rss_kb} kB at {when(row.time)}")
    if recording.skipped:
        lines.append("skipped unreadable files:")
        lines += [f"  {s}" for s in recording.skipped]
    return "\n".join(lines)
