"""The descriptors the BPF programs remember (--stacks), kept true and summed per call site.

The kernel side forgets a descriptor at close() (and when dup2 replaces it). Bulk changes are
only stamped there: an exec (close-on-exec descriptors), close_range() and the process's exit.
Each sweep drops what those stamps say is gone: every entry made before an exit, and entries made
before an exec or close_range whose descriptor is no longer open. What is left is summed per
(process, call site) into rows of the ``fd_sites`` table.

Stacks are named by the kernel with a hash of their addresses; a walk that goes astray in code
without frame pointers gives a new hash per call for one call site. ``resolve`` (the session's
symbolizer) maps each hash to the id of its symbolized stack, so such calls add up to one site.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import Any

from fdtrace.procfs import ProcFS
from fdtrace.procfs.reader import READ_ERRORS
from fdtrace.schema.records import SiteRow

#: (kernel stack id -> (pid, CLOCK_MONOTONIC ns of its oldest live descriptor)) -> (kernel stack id
#: -> the site's stack id, None when the stack was not kept)
Resolver = Callable[[dict[int, tuple[int, int]]], dict[int, "int | None"]]

#: Kernel stack ids remembered (their site, or their counts until they have one).
MAX_REMEMBERED = 200_000

_Key = tuple[int, str, "int | None"]  # (pid, origin, site stack id)


class DescriptorTracker:
    """Sweeps the kernel's table of remembered descriptors and sums it per call site.

    Args:
        tracer: the loaded programs (``BpfTracer``).
        resolve: names the sites of kernel stack ids (see ``Resolver``).
        before_tracing_pids: processes whose descriptors older than the tracing are counted too
            (a listing of /proc/PID/fd each sweep).
    """

    def __init__(self, tracer: Any, resolve: Resolver, procfs: ProcFS | None = None,
                 before_tracing_pids: tuple[int, ...] = ()) -> None:
        self._tracer = tracer
        self._resolve = resolve
        self._procfs = procfs or ProcFS()
        self._before_pids = before_tracing_pids
        self._handled: dict[int, int] = {}  # pid -> the exec/close_range stamp already reconciled
        self._last: dict[_Key, tuple[int, int | None, int | None]] = {}
        self._comms: dict[int, str] = {}
        self._sites: OrderedDict[int, int | None] = OrderedDict()  # kernel stack id -> site
        self._unsited: OrderedDict[int, list[int]] = OrderedDict()  # counts of kernel ids without a site yet
        self._totals: defaultdict[int, list[int]] = defaultdict(lambda: [0, 0])  # site -> [opened, closed]
        self.exec_ts: dict[int, int] = {}  # pid -> CLOCK_MONOTONIC ns of its last exec seen

    def sweep(self, comms: dict[int, str]) -> list[SiteRow]:
        """Drop what is gone and return the sites whose figures changed since the last sweep
        (a site that closed its last descriptor comes once more, with 0 open)."""
        tracer = self._tracer
        changes = tracer.take_fd_changes()
        counts = {i: list(c) for i, c in tracer.take_fd_site_counts().items()}
        entries = tracer.live_fds()
        for pid, (_changed, _gone, exec_ts) in changes.items():
            if exec_ts:
                self.exec_ts[pid] = exec_ts
        by_pid: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
        for pid, fd, stack_id, ts in entries:
            by_pid[pid].append((fd, stack_id, ts))
        gone = self._reconcile(by_pid, changes)
        if gone:
            tracer.forget_fds([(pid, fd) for pid, fd, _stack in gone])
            for _pid, _fd, stack_id in gone:
                if stack_id:
                    counts.setdefault(stack_id, [0, 0])[1] += 1
        for pid, (_changed, gone_ts, _exec) in changes.items():
            if gone_ts:
                self._handled.pop(pid, None)
                self.exec_ts.pop(pid, None)

        live: dict[int, tuple[int, int]] = {}
        for pid, fds in by_pid.items():
            for _fd, stack_id, ts in fds:
                if stack_id and (stack_id not in live or ts < live[stack_id][1]):
                    live[stack_id] = (pid, ts)
        unknown = {i: v for i, v in live.items() if i not in self._sites}
        if unknown:
            for stack_id, site in self._resolve(unknown).items():
                self._remember(stack_id, site)
        # Stacks of descriptors all closed since the last sweep were never needed: free their slots,
        # unless a call site known by its innermost frames names them (those of gone processes go).
        prefixes = tracer.prefix_sites()
        named = {stack_id for _key, stack_id, _pid in prefixes}
        tracer.forget_prefixes([key for key, _stack_id, pid in prefixes if not self._procfs.exists(pid)])
        tracer.forget_stacks([i for i in counts if i not in live and i not in self._sites and i not in named])
        self._fold(counts)

        current: dict[_Key, tuple[int, int | None, int | None]] = {}
        oldest: dict[_Key, int | None] = {}
        for pid, fds in by_pid.items():
            for _fd, stack_id, ts in fds:
                key = (pid, "traced", self._sites.get(stack_id) if stack_id else None)
                n = current.get(key, (0, None, None))[0]
                current[key] = (n + 1, None, None)
                first = oldest.get(key)
                oldest[key] = ts if first is None else min(first, ts)
        for key, (n, _o, _c) in current.items():
            opened, closed = self._totals[key[2]] if key[2] is not None and key[2] in self._totals else (None, None)
            current[key] = (n, opened, closed)
        for pid in self._before_pids:
            listed = self._fd_numbers(pid)
            if listed is None:
                continue
            tracked = {fd for fd, _s, _t in by_pid.get(pid, [])}
            current[(pid, "before_tracing", None)] = (len(listed - tracked), None, None)
            oldest[(pid, "before_tracing", None)] = None
        return self._changed_rows(current, oldest, comms)

    def _reconcile(self, by_pid: dict[int, list[tuple[int, int, int]]],
                   changes: dict[int, tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """Remove from ``by_pid`` the entries that bulk changes closed; returns them (pid, fd, stack)."""
        gone: list[tuple[int, int, int]] = []
        for pid in list(by_pid):
            changed_ts, gone_ts, _exec = changes.get(pid, (0, 0, 0))
            entries = by_pid[pid]
            if gone_ts:  # made before the exit: gone; after it: a new process with that pid
                gone += [(pid, fd, s) for fd, s, ts in entries if ts < gone_ts]
                entries = [e for e in entries if e[2] >= gone_ts]
            if not self._procfs.exists(pid):  # gone, its exit unstamped: all of it
                gone += [(pid, fd, s) for fd, s, _ts in entries]
                entries = []
            elif changed_ts > self._handled.get(pid, 0):
                open_now = self._fd_numbers(pid)
                if open_now is not None:  # else not listed this time (it went, or the read failed): next sweep
                    self._handled[pid] = changed_ts
                    gone += [(pid, fd, s) for fd, s, ts in entries if ts < changed_ts and fd not in open_now]
                    entries = [e for e in entries if e[2] >= changed_ts or e[0] in open_now]
            if entries:
                by_pid[pid] = entries
            else:
                del by_pid[pid]
        return gone

    def _remember(self, stack_id: int, site: int | None) -> None:
        self._sites[stack_id] = site
        waiting = self._unsited.pop(stack_id, None)
        if waiting is not None and site is not None:
            totals = self._totals[site]
            totals[0] += waiting[0]
            totals[1] += waiting[1]
        while len(self._sites) > MAX_REMEMBERED:
            self._sites.popitem(last=False)

    def _fold(self, counts: dict[int, list[int]]) -> None:
        """Add the counts taken from the kernel to their sites' totals (or keep them until the
        stack id has a site)."""
        for stack_id, (opened, closed) in counts.items():
            if stack_id in self._sites:
                site = self._sites[stack_id]
                if site is not None:
                    totals = self._totals[site]
                    totals[0] += opened
                    totals[1] += closed
                continue
            waiting = self._unsited.setdefault(stack_id, [0, 0])
            waiting[0] += opened
            waiting[1] += closed
            self._unsited.move_to_end(stack_id)
        while len(self._unsited) > MAX_REMEMBERED:  # calls whose descriptors were all closed long ago
            self._unsited.popitem(last=False)

    def _changed_rows(self, current: dict[_Key, tuple[int, int | None, int | None]], oldest: dict[_Key, int | None],
                      comms: dict[int, str]) -> list[SiteRow]:
        comms = dict(comms)
        for pid in {key[0] for key in current} - comms.keys():
            try:
                comms[pid] = self._procfs.stat(pid).comm
            except READ_ERRORS:  # gone, denied, or a read that failed
                comms[pid] = self._comms.get(pid, "")
        rows = []
        for key, figures in current.items():
            if self._last.get(key) != figures:
                rows.append(SiteRow(key[0], comms.get(key[0], ""), key[1], key[2], *figures, oldest[key]))
        for key, figures in self._last.items():
            if key not in current and figures[0]:
                opened, closed = self._totals[key[2]] if key[2] is not None and key[2] in self._totals \
                    else (figures[1], figures[2])
                comm = comms.get(key[0]) or self._comms.get(key[0], "")
                rows.append(SiteRow(key[0], comm, key[1], key[2], 0, opened, closed, None))
        self._last = current
        self._comms = {key[0]: comms[key[0]] for key in current if comms.get(key[0])}
        return rows

    def _fd_numbers(self, pid: int) -> set[int] | None:
        try:
            return self._procfs.fd_numbers(pid)
        except READ_ERRORS:  # gone, denied, or a read that failed
            return None
