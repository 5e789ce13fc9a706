"""Events as aligned lines for a terminal (bcc's opensnoop style), and a per-process summary of
the exact counters at the end (`fdtrace trace -s`)."""

from __future__ import annotations

import time
from typing import IO, Any

from fdtrace.display import shown
from fdtrace.pipeline.update import SourceInfo, Update
from fdtrace.sinks.jsonl import JsonLinesSink

HEADER = f"{'TIME':<12} {'PID':>7} {'TID':>7} {'COMM':<16} {'KIND':<13} {'SYSCALL':<13} {'RET':>6} {'ERRNO':<12} DETAIL"


def _detail(row: dict[str, Any]) -> str:
    kind = row["kind"]
    if kind in ("connect", "accept") and row.get("peer_addr") is not None:
        address = row["peer_addr"]
        return f"{'to' if kind == 'connect' else 'from'} " + (f"[{address}]" if ":" in address else address) \
            + f":{row['peer_port']}"
    if kind in ("connect", "accept") and row.get("family") is not None:
        return str(row["family"])
    if kind == "process_start":
        return f"parent {row['ppid']}"
    if kind == "thread_start":
        return f"created by {row['creator_tid']}"
    if kind == "process_exec":
        return f"exec (was tid {row['old_tid']})"
    if kind == "process_exit":
        return f"killed by {row['signal']}" if row.get("signal") else f"exit {row['exit_code']}"
    if kind == "oom_kill":
        return (f"anon-rss {row['anon_rss_kb']} kB, file-rss {row['file_rss_kb']} kB, "
                f"oom_score_adj {row['oom_score_adj']}")
    return ""


def event_line(row: dict[str, Any]) -> str:
    """One event as one aligned line (names shown as data: see ``fdtrace.display``)."""
    stamp = row["time"]  # UTC ns (or a datetime)
    ns = stamp if isinstance(stamp, int) else int(stamp.timestamp()) * 1_000_000_000 + stamp.microsecond * 1000
    clock = time.strftime("%H:%M:%S", time.gmtime(ns // 1_000_000_000)) + f".{ns // 1_000_000 % 1000:03d}"
    ret = "" if row["ret"] is None else str(row["ret"])
    return (f"{clock:<12} {row['pid']:>7} {row['tid']:>7} {shown(row['comm'])[:16]:<16} {row['kind']:<13} "
            f"{row['syscall'] or '':<13} {ret:>6} {row['errno'] or '':<12} {shown(_detail(row))}").rstrip()


class TextLinesSink(JsonLinesSink):
    """Writes a header, then one aligned line per event, and counts them by kind."""

    name = "text lines"

    def open(self, info: SourceInfo) -> None:
        self.stream.write(HEADER + "\n")
        self.stream.flush()

    def format(self, row: dict[str, Any]) -> str:
        """The event's line, then its stack's frames (--stacks), one per line."""
        return "\n".join([event_line(row), *(f"{'':>12} at {shown(frame)}" for frame in row.get("stack", ()))])


class ProcessSummarySink:
    """At the end, one line per process from the exact counters of the final update: calls by
    kind and failures by syscall and errno, the busiest first.

    Args:
        stream: where the table goes.
        comms: only processes with these names (all when empty).
        limit: processes shown at most.
    """

    name = "summary"
    required = True

    def __init__(self, stream: IO[str], comms: tuple[str, ...] = (), limit: int = 40) -> None:
        self.stream = stream
        self.comms = comms
        self.limit = limit
        self._lines: list[str] | None = None

    def open(self, info: SourceInfo) -> None:
        """Nothing to prepare."""

    def write(self, update: Update) -> None:
        if not update.final or update.counters is None:
            return
        totals = [t for t in update.counters.all() if not self.comms or t.comm in self.comms]
        totals.sort(key=lambda t: (-sum(t.errors.values()), -sum(t.counts.values()), t.pid))
        lines = [f"{'PID':>7} {'COMM':<16} {'SOCKET':>8} {'ACCEPT':>8} {'CONNECT':>8} {'CLOSE':>8} {'THREADS':>8} "
                 "FAILED"]
        for t in totals[: self.limit]:
            failed = ", ".join(f"{syscall} {errno} {count}" for (syscall, errno), count in
                               sorted(t.errors.items(), key=lambda item: -item[1]))
            lines.append(f"{t.pid:>7} {shown(t.comm)[:16]:<16} {t.counts['sockets']:>8} {t.counts['accepts']:>8} "
                         f"{t.counts['connects']:>8} {t.counts['closes']:>8} {t.counts['threads_started']:>8} "
                         f"{failed or '-'}")
        if len(totals) > self.limit:
            lines.append(f"... and {len(totals) - self.limit} more processes")
        self._lines = lines

    def close(self, failed: bool = False) -> None:
        if self._lines is not None:
            self.stream.write("\n".join(self._lines) + "\n")
            self.stream.flush()
            self._lines = None
