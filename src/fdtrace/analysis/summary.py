"""A plain-text summary of a loaded recording (``fdtrace info``)."""

from __future__ import annotations

from fdtrace.analysis.destinations import destinations
from fdtrace.analysis.headroom_series import least_headroom
from fdtrace.recording import Recording
from fdtrace.schema import STATS


def summary(recording: Recording) -> str:
    """Lines for a terminal: what the recording holds and what went wrong in it."""
    events = recording.events
    lines = []
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
        lines.append(f"span: {events['time'].min()} .. {events['time'].max()}")
    lines.append(f"events: {len(events)}")
    if len(events):
        for kind, count in events["kind"].value_counts().items():
            if count:
                lines.append(f"  {kind}: {count}")
    losses = recording.losses
    lost = {name: int(losses[name].sum()) for name in STATS if name in losses.columns}
    lines.append(f"losses: {sum(lost.values())}" + "".join(f", {k} {v}" for k, v in lost.items() if v))
    least = least_headroom(recording)
    if len(least):
        lines.append("least FD headroom:")
        for row in least.head(10).itertuples():
            lines.append(f"  pid {row.pid} {row.comm}: {row.open_fds} open of {row.fd_soft_limit:.0f} "
                         f"({row.usage:.0%}, headroom {row.headroom:.0f}) at {row.time}")
        threads = least_headroom(recording, resource="threads").dropna(subset=["thread_usage"])
        if len(threads):
            lines.append("least thread headroom:")
            for row in threads.head(5).itertuples():
                lines.append(f"  pid {row.pid} {row.comm}: {row.thread_count:.0f} of {row.thread_limit:.0f} "
                             f"({row.thread_limit_kind}, {row.thread_usage:.0%}) at {row.time}")
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
            lines.append(f"OOM kill: pid {row.pid} {row.comm} anon-rss {row.anon_rss_kb} kB at {row.time}")
    if recording.skipped:
        lines.append("skipped unreadable files:")
        lines += [f"  {s}" for s in recording.skipped]
    return "\n".join(lines)
