"""Samples of headroom from /proc: per process (open FDs against RLIMIT_NOFILE, threads against
the limits that bound them, sockets) and system-wide (file-nr against file-max, tasks against
threads-max, and the other limits that apply)."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from fdtrace.procfs.containers import placement
from fdtrace.procfs.elf import BudgetSpentError, ReadBudget
from fdtrace.procfs.go_limits import GoLimitAddress, limit_address, read_limit
from fdtrace.procfs.golang import GO_DEFAULT_MAX_THREADS, is_go_binary
from fdtrace.procfs.memory import RSS_FIELDS, CgroupMemory, cgroup_memory, meminfo_kb, resident_kb
from fdtrace.procfs.reader import READ_ERRORS, ProcessAccessDeniedError, ProcFS, skip_reason
from fdtrace.procfs.thread_limits import cgroup_pids, tasks_total, threads_by_uid
from fdtrace.schema.records import ProcessSample

#: Bytes of Go binaries read in one round to find their thread limit (their DWARF inflated): one
#: binary of the largest DWARF read (go_limits.MAX_DWARF_BYTES), then the rest in later rounds.
GO_ROUND_READ_BYTES = 320 << 20
#: Sockets are counted by reading each fd's link only up to this many open FDs.
MAX_FDS_FOR_SOCKET_COUNT = 10_000


class ProcSampler:
    """Reads per-process and system samples from one procfs tree (``/proc`` by default).

    No read of a process raises out of it: a process that exits (or may not be read, or whose
    read fails) at any step of its sample has none, and is counted in ``skipped``.

    Attributes:
        skipped: processes left out of samples since the sampler was made, by reason: "gone"
            (exited while read, or a zombie), "denied", or the errno of a failed read ("EMFILE").
    """

    def __init__(self, procfs_root: str | Path = "/proc", cmdline: bool = False,
                 cgroupfs: str | Path = "/sys/fs/cgroup") -> None:
        self.procfs = ProcFS(procfs_root)
        self.root = self.procfs.root
        self.cgroupfs = Path(cgroupfs)
        self.cmdline = cmdline
        self.fd_count_by_size = self._size_is_count()
        self._go: dict[tuple[int, int], bool] = {}  # (pid, start_ns) -> is a Go program
        self._go_limits: dict[tuple[int, int], GoLimitAddress | str] = {}  # binary (dev, ino) -> where, or why not
        self._cgroups: dict[Path, tuple[int, int] | None] | None = None  # during a round: folder -> pids
        self._memcgs: dict[Path, CgroupMemory | None] | None = None  # during a round: folder -> memory
        self.skipped: Counter[str] = Counter()
        #: Bytes of Go binaries' tables and DWARF read a round (a crafted one inflates to 256 MiB).
        self._elf_budget = ReadBudget(GO_ROUND_READ_BYTES)
        #: Go programs whose limit was left for a later round for want of that budget.
        self.unread_go_limits = 0
        self.round_s = 0.0  # what the last round took
        self.unsampled = 0  # processes the last round left out for want of time

    def _size_is_count(self) -> bool:
        """Whether st_size of /proc/PID/fd is the number of open FDs (Linux >= 6.2): O(1) instead
        of a readdir. Checked on our own fd folder; older kernels give 0, a fake tree has none."""
        own = self.root / "self" / "fd"
        try:
            listed = len(os.listdir(own))  # the listing's own fd shows in it, then is closed
            size = os.stat(own).st_size
        except OSError:
            return False
        return size > 0 and size in (listed, listed - 1)

    def open_fds(self, pid: int) -> int | None:
        """Number of open FDs of a process, None if it is gone (or cannot be read)."""
        try:
            return self.procfs.open_fds(pid, self.fd_count_by_size)
        except READ_ERRORS:
            return None

    def pids(self) -> list[int]:
        """Every process id in the tree (none, counted in ``skipped``, when /proc cannot be listed)."""
        try:
            return self.procfs.pids()
        except OSError as error:
            self.skip(error)
            return []

    def sample(self, pid: int) -> ProcessSample | None:
        """One process's sample, None (counted in ``skipped``) if it vanished while being read,
        may not be read, or a read failed."""
        try:
            sample = self._sample(pid)
        except READ_ERRORS as error:
            self.skip(error)
            return None
        if sample is None:
            self.skipped["gone"] += 1
        return sample

    def skip(self, error: BaseException) -> None:
        """Count a process left out because of ``error`` (see ``skipped``)."""
        self.skipped[skip_reason(error)] += 1

    def describe_skipped(self) -> str:
        """``skipped`` in words ("3 processes gone when sampled, 1 process not read (EMFILE)"), or ""."""
        parts = []
        for reason, count in sorted(self.skipped.items(), key=lambda item: (-item[1], item[0])):
            what = f"process{'es' if count != 1 else ''}"
            if reason == "gone":
                parts.append(f"{count} {what} gone when sampled")
            elif reason == "denied":
                parts.append(f"{count} {what} not readable")
            elif reason == "late":
                parts.append(f"{count} {what} left for later (the round's time ran out)")
            else:
                parts.append(f"{count} {what} not read ({reason})")
        return ", ".join(parts)

    def _sample(self, pid: int) -> ProcessSample | None:
        procfs = self.procfs
        stat = procfs.stat(pid)
        if stat.exited:  # exited, not yet reaped: nothing of it is left to sample
            return None
        limits = procfs.limits(pid)
        status = procfs.status(pid, ("Threads", "Uid", *(name for name, _ in RSS_FIELDS)))
        open_fds = procfs.open_fds(pid, self.fd_count_by_size)
        soft, hard = limits.get("Max open files", (None, None))
        nproc = limits.get("Max processes", (None, None))[0]
        threads = int(status.get("Threads", "0").split()[0])
        uid = int(status["Uid"].split()[0]) if "Uid" in status else None
        sockets = self._sockets(pid) if open_fds <= MAX_FDS_FOR_SOCKET_COUNT else None
        cmdline = None
        if self.cmdline:
            cmdline = " ".join(procfs.cmdline(pid)) or None
        lines = procfs.cgroups(pid)
        pids = cgroup_pids(procfs, self.cgroupfs, pid, self._cgroups, lines=lines)
        where = placement(lines)
        memory = cgroup_memory(procfs, self.cgroupfs, pid, self._memcgs, lines=lines)
        go_limit, unread = self._go_limit(pid) if self._is_go(pid, stat.start_ns) else (None, None)
        again = procfs.stat(pid)
        if again.start_ns != stat.start_ns:  # its pid was reused while it was read: two processes' values
            return None
        if again.exiting:  # it began to exit while it was read: its memory, files or limit may be half gone
            return None
        return ProcessSample(pid, stat.start_ns, stat.comm, open_fds, soft, hard, threads, sockets, cmdline,
                             uid=uid, nproc_soft_limit=nproc if uid != 0 else None,
                             pids_current=pids[0] if pids else None, pids_max=pids[1] if pids else None,
                             go_max_threads=go_limit, go_limit_unread=unread,
                             cgroup=where.cgroup, unit=where.unit, container_id=where.container_id,
                             container_runtime=where.runtime, pod_uid=where.pod_uid, **resident_kb(status),
                             memcg_limit_bytes=memory.limit if memory else None,
                             memcg_usage_bytes=memory.usage if memory else None,
                             memcg_oom_kills=memory.oom_kills if memory else None)

    def _go_limit(self, pid: int) -> tuple[int, str | None]:
        """A Go process's thread limit now, from its memory (``fdtrace.procfs.go_limits``), and why
        not when it cannot be read (then Go's default)."""
        exe = self.root / str(pid) / "exe"
        try:
            info = os.stat(exe)
        except OSError:
            return GO_DEFAULT_MAX_THREADS, "its binary is gone"
        binary = (info.st_dev, info.st_ino)
        where = self._go_limits.get(binary)
        if where is None:
            if len(self._go_limits) > 4096:
                self._go_limits.clear()
            try:
                where = self._go_limits[binary] = limit_address(str(exe), self._elf_budget)
            except BudgetSpentError:  # a later round reads it
                self.unread_go_limits += 1
                return GO_DEFAULT_MAX_THREADS, "not read yet (the bytes of binaries read a round were spent)"
        if isinstance(where, str):
            return GO_DEFAULT_MAX_THREADS, where
        bias = 0
        if where.position_independent:
            maps = self.procfs.executable_maps(pid)
            mapped = [m for m in maps if (m[3], m[4]) == binary]
            if not mapped:
                return GO_DEFAULT_MAX_THREADS, "its binary's mapping was not found"
            start, _end, offset = mapped[0][:3]
            bias = start - offset - where.text_delta
        found = read_limit(self.procfs, pid, where, bias)
        return (found, None) if found is not None else (GO_DEFAULT_MAX_THREADS, "its memory could not be read")

    def _is_go(self, pid: int, start_ns: int) -> bool:
        key = (pid, start_ns)
        if key not in self._go:
            if len(self._go) > 100_000:
                self._go.clear()
            self._go[key] = is_go_binary(self.procfs.exe(pid))
        return self._go[key]

    def _sockets(self, pid: int) -> int | None:
        """Sockets among the process's FDs, None where its fd folder may not be listed (another
        user's, without privileges: the rest of its sample stands). A process that went while
        listed raises ProcessGoneError, as every other read of it does."""
        try:
            return sum(1 for target in self.procfs.fd_targets(pid) if target.startswith("socket:"))
        except ProcessAccessDeniedError:
            return None

    def top_by_open_fds(self, n: int) -> list[int]:
        """The n processes with the most open FDs (kernel threads, with none, left out).

        Where counting needs a readdir (Linux < 6.2), every process is ranked by the FDSize of
        its status (the size of its fd table, O(1) to read) and only the first n are counted."""
        if self.fd_count_by_size:
            ranked = [(c, pid) for pid in self.pids() if (c := self.open_fds(pid))]
        else:
            ranked = [(size, pid) for pid in self.pids() if (size := self._fd_table_size(pid))]
        ranked.sort(reverse=True)
        return [pid for _, pid in ranked[:n]]

    def _fd_table_size(self, pid: int) -> int:
        try:
            return int(self.procfs.status(pid, ("FDSize",)).get("FDSize", "0"))
        except (*READ_ERRORS, ValueError):
            return 0

    def round(self, with_events: Iterable[int], top: int, exclude: int | None = None,
              first: Iterable[int] = (), budget_s: float | None = None) -> list[ProcessSample]:
        """One sampling round: the processes that had events plus the ``top`` by open FDs. With a
        ``budget_s``, the processes that matter come first (``first``: those failing, those the
        user named; then the ``top`` by open FDs, nearest a limit; then the others with events)
        and the rest are sampled as time allows (see ``processes``)."""
        first = list(dict.fromkeys(first))
        ranked = self.top_by_open_fds(top)
        order = [*first, *ranked, *sorted(set(with_events) - set(first) - set(ranked))]
        if exclude is not None:
            order = [pid for pid in order if pid != exclude]
        return self.processes(order, budget_s=budget_s)

    def processes(self, pids: Iterable[int], budget_s: float | None = None) -> list[ProcessSample]:
        """Samples of these processes, skipping the ones that are gone. Where RLIMIT_NPROC
        applies, the threads of the process's user are counted over every process.

        With a ``budget_s``, ``pids`` are sampled in their order until the round has taken that
        long; the others are left out, counted in ``unsampled`` (and in ``skipped`` as "late").
        ``round_s`` is what the round took, measured."""
        started = time.monotonic()
        order = list(dict.fromkeys(pids)) if budget_s is not None else sorted(set(pids))
        self._cgroups, self._memcgs = {}, {}
        self._elf_budget.renew()
        samples = []
        self.unsampled = 0
        try:
            for at, pid in enumerate(order):
                if budget_s is not None and at and time.monotonic() - started > budget_s:  # the first always
                    self.unsampled = len(order) - at
                    self.skipped["late"] += self.unsampled
                    break
                if (sample := self.sample(pid)) is not None:
                    samples.append(sample)
        finally:
            self._cgroups = self._memcgs = None
            self.round_s = time.monotonic() - started
        limited = {s.uid for s in samples if s.nproc_soft_limit is not None and s.uid is not None}
        if not limited:
            return samples
        per_user = threads_by_uid(self.procfs, self.pids(), limited)
        return [replace(s, user_threads=per_user[s.uid]) if s.uid in limited and s.nproc_soft_limit is not None
                else s for s in samples]

    def system(self) -> dict[str, Any]:
        """System-wide FD, thread, listen-queue and memory figures."""
        number = self.procfs.system_number
        file_nr = (self.procfs.system_text("sys/fs/file-nr") or "0 0 0").split()
        netstat = self._netstat()
        return {
            "file_nr": int(file_nr[0]),
            "file_max": int(file_nr[2]),
            "nr_open": number("sys/fs/nr_open"),
            "threads_max": number("sys/kernel/threads-max"),
            "threads_total": tasks_total(self.procfs),
            "pid_max": number("sys/kernel/pid_max"),
            "somaxconn": number("sys/net/core/somaxconn"),
            "listen_overflows": netstat.get("ListenOverflows"),
            "listen_drops": netstat.get("ListenDrops"),
            **meminfo_kb(self.procfs.system_text("meminfo")),
        }

    def _netstat(self) -> dict[str, int]:
        text = self.procfs.system_text("net/netstat") or ""
        lines = text.splitlines()
        for header, values in zip(lines[::2], lines[1::2], strict=False):
            if header.startswith("TcpExt:"):
                return dict(zip(header.split()[1:], map(int, values.split()[1:]), strict=False))
        return {}
