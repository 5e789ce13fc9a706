"""The call-sites sink: what `fdtrace leaks` and `fdtrace threads` report at their end, kept in
memory while they trace (bounded: the latest figures per site, and the rows of one growth window)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import pandas as pd

from fdtrace.analysis.call_sites import leaks
from fdtrace.pipeline.update import SourceInfo, Update
from fdtrace.schema.records import ThreadCensus
from fdtrace.schema.site_names import site_name, thread_reason, to_thread_start


@dataclass
class _ThreadSite:
    comm: str
    threads: int
    first_ns: int
    last_ns: int


class CallSitesSink:
    """Keeps the fd_sites rows of the last ``window_s``, every stack, the latest thread census and
    the thread starts per creating stack.

    Attributes:
        end_ns: CLOCK_MONOTONIC ns of the last round.
        losses: the source's cumulative losses.
        census: the latest thread census per process.
    """

    name = "call sites"
    required = True

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_ns = int(window_s * 1e9)
        self.end_ns: int | None = None
        self.start_ns: int | None = None
        self.losses: dict[str, int] = {}
        self.census: dict[int, ThreadCensus] = {}
        self._sites: dict[tuple[int, str, int | None], deque[dict[str, Any]]] = {}
        self._stacks: dict[int, dict[str, Any]] = {}
        self._thread_sites: dict[tuple[int, int], _ThreadSite] = {}
        #: CLOCK_MONOTONIC ns of the exit of the traced processes that ended, by pid.
        self.exits: dict[int, int] = {}
        #: How they ended, where an event said (an exit code or a signal).
        self.endings: dict[int, str] = {}

    def open(self, info: SourceInfo) -> None:
        """Nothing to prepare."""

    def write(self, update: Update) -> None:
        self.losses = update.losses
        if update.counters is not None:
            for ended in update.counters.newly_exited:
                if ended.exit_ts:
                    self.exits[ended.pid] = ended.exit_ts
        self._endings(update.events)
        for stack in update.stacks:
            self._stacks[stack.stack_id] = {"stack_id": stack.stack_id, "pid": stack.pid, "comm": stack.comm,
                                            "frames": list(stack.frames), "truncated": stack.truncated}
        self._thread_starts(update.events)
        for sample_round in update.rounds:
            now = sample_round.mono_ns
            self.end_ns = now
            if self.start_ns is None:
                self.start_ns = now
            for census in sample_round.threads:
                self.census[census.pid] = census
            for site in sample_round.fd_sites:
                rows = self._sites.setdefault((site.pid, site.origin, site.stack_id), deque())
                rows.append({"ts_ns": now, **vars(site)})
                while len(rows) > 1 and rows[1]["ts_ns"] <= now - self.window_ns:
                    rows.popleft()  # the last row before the window stays: growth is measured from it

    def _endings(self, events: Any) -> None:
        if not events.num_rows:
            return
        import pyarrow.compute as pc

        ended = events.filter(pc.equal(events["kind"].cast("string"), "process_exit"))
        for row in ended.select(["pid", "exit_code", "signal"]).to_pylist():
            self.endings[row["pid"]] = f"killed by {row['signal']}" if row["signal"] else f"exit {row['exit_code']}"

    def _thread_starts(self, events: Any) -> None:
        if not events.num_rows:
            return
        import pyarrow.compute as pc

        starts = events.filter(pc.and_(pc.equal(events["kind"].cast("string"), "thread_start"),
                                       pc.is_valid(events["stack_id"])))
        for row in starts.select(["pid", "comm", "stack_id", "ts_ns"]).to_pylist():
            key = (row["pid"], row["stack_id"])
            site = self._thread_sites.get(key)
            if site is None:
                self._thread_sites[key] = _ThreadSite(row["comm"], 1, row["ts_ns"], row["ts_ns"])
            else:
                site.threads += 1
                site.last_ns = row["ts_ns"]

    def close(self, failed: bool = False) -> None:
        """Nothing to release."""

    @property
    def traced_s(self) -> float:
        """Seconds from the first round to the last."""
        return 0.0 if self.start_ns is None or self.end_ns is None else (self.end_ns - self.start_ns) / 1e9

    def stacks(self) -> pd.DataFrame:
        """The stacks seen, as the ``stacks`` table's columns."""
        return pd.DataFrame(list(self._stacks.values()), columns=["stack_id", "pid", "comm", "frames", "truncated"])

    def leaks(self, pid: int | None = None) -> pd.DataFrame:
        """``fdtrace.analysis.leaks`` over what was traced; of a process that exited meanwhile,
        as its last look before the exit saw them (after it, the exit closed them all)."""
        until = self.exits.get(pid) if pid is not None else None
        rows = [row for site_rows in self._sites.values() for row in site_rows
                if until is None or row["ts_ns"] < until]
        sites = pd.DataFrame(rows)
        if len(sites):
            sites["stack_id"] = pd.array([row["stack_id"] for row in rows], dtype="Int64")  # no float64 on the way
        end = max((row["ts_ns"] for row in rows), default=None) if until is not None else self.end_ns
        return leaks(sites, self.stacks(), end_ns=end, window_s=self.window_ns / 1e9, pid=pid)

    def thread_sites(self, pid: int | None = None) -> pd.DataFrame:
        """Threads started per process and creating stack, most first."""
        rows = []
        for (site_pid, stack_id), site in self._thread_sites.items():
            if pid is not None and site_pid != pid:
                continue
            frames = to_thread_start(self._stacks.get(stack_id, {}).get("frames", []))
            rows.append({"pid": site_pid, "comm": site.comm, "threads": site.threads, "stack_id": stack_id,
                         "site": site_name(frames) if frames else "(stack not kept)", "reason": thread_reason(frames),
                         "frames": frames, "key": (site_pid, tuple(frames))})
        frame = pd.DataFrame(rows, columns=["pid", "comm", "site", "reason", "threads", "stack_id", "frames", "key"])
        # stacks that differ only past the creating thread's start (stale words) are one site
        frame = frame.groupby("key", sort=False).agg(
            pid=("pid", "first"), comm=("comm", "last"), site=("site", "first"), reason=("reason", "first"),
            threads=("threads", "sum"), stack_id=("stack_id", "first"), frames=("frames", "first"),
        ).reset_index(drop=True)
        return frame.sort_values(["threads", "pid"], ascending=[False, True], kind="stable", ignore_index=True)
