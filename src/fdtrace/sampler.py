"""Samples of headroom from /proc: per process (open FDs against RLIMIT_NOFILE, threads against
the limits that bound them, sockets) and system-wide (file-nr against file-max, tasks against
threads-max, and the other limits that apply)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fdtrace.golang import GO_DEFAULT_MAX_THREADS, is_go_binary
from fdtrace.procfs import TICK_NS
from fdtrace.thread_limits import cgroup_pids, tasks_total, threads_by_uid

#: Sockets are counted by reading each fd's link only up to this many open FDs.
MAX_FDS_FOR_SOCKET_COUNT = 10_000


@dataclass(frozen=True)
class ProcessSample:
    """One process at one moment."""

    pid: int
    start_ns: int
    comm: str
    open_fds: int
    fd_soft_limit: int | None
    fd_hard_limit: int | None
    threads: int
    sockets: int | None
    cmdline: str | None = None
    #: Real user id; RLIMIT_NPROC counts all threads of this user.
    uid: int | None = None
    #: RLIMIT_NPROC soft limit; None when unlimited or not enforced (root is not held to it).
    nproc_soft_limit: int | None = None
    #: Threads of all processes of ``uid``, counted only when ``nproc_soft_limit`` applies.
    user_threads: int | None = None
    #: Tasks and limit of the tightest cgroup pids.max over the process; None when none applies.
    pids_current: int | None = None
    pids_max: int | None = None
    #: Go's default thread limit when the executable is a Go program (SetMaxThreads can change it).
    go_max_threads: int | None = None


#: The sample fields written to a recording's samples table (cmdline only when asked).
SAMPLE_COLUMNS = ("pid", "start_ns", "comm", "open_fds", "fd_soft_limit", "fd_hard_limit", "threads", "sockets",
                  "uid", "nproc_soft_limit", "user_threads", "pids_current", "pids_max", "go_max_threads")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None


def _limit(value: str) -> int | None:
    return None if value == "unlimited" else int(value)


class ProcSampler:
    """Reads per-process and system samples from one procfs tree (``/proc`` by default)."""

    def __init__(self, procfs_root: str | Path = "/proc", cmdline: bool = False,
                 cgroupfs: str | Path = "/sys/fs/cgroup") -> None:
        self.root = Path(procfs_root)
        self.cgroupfs = Path(cgroupfs)
        self.cmdline = cmdline
        self.fd_count_by_size = self._size_is_count()
        self._go: dict[tuple[int, int], bool] = {}  # (pid, start_ns) -> is a Go program
        self._cgroups: dict[Path, tuple[int, int] | None] | None = None  # during a round: folder -> pids

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
        """Number of open FDs of a process, None if it is gone."""
        fd_dir = self.root / str(pid) / "fd"
        try:
            if self.fd_count_by_size:
                return os.stat(fd_dir).st_size
            return len(os.listdir(fd_dir))
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            return None

    def pids(self) -> list[int]:
        """Every process id in the tree."""
        return [int(name) for name in os.listdir(self.root) if name.isdigit()]

    def sample(self, pid: int) -> ProcessSample | None:
        """One process's sample, None if it vanished while being read."""
        base = self.root / str(pid)
        stat = _read(base / "stat")
        limits = _read(base / "limits")
        status = _read(base / "status")
        open_fds = self.open_fds(pid)
        if stat is None or limits is None or status is None or open_fds is None:
            return None
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] in ("Z", "X"):  # exited, not yet reaped: nothing of it is left to sample
            return None
        start_ns = int(fields[19]) * TICK_NS
        soft = hard = nproc = None
        for line in limits.splitlines():
            if line.startswith("Max open files"):
                parts = line.split()
                soft, hard = _limit(parts[3]), _limit(parts[4])
            elif line.startswith("Max processes"):
                nproc = _limit(line.split()[2])
        fields_of_status = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        threads = int(fields_of_status.get("Threads", "0").split()[0])
        uid = int(fields_of_status["Uid"].split()[0]) if "Uid" in fields_of_status else None
        sockets = self._sockets(base) if open_fds <= MAX_FDS_FOR_SOCKET_COUNT else None
        cmdline = None
        if self.cmdline:
            raw = _read(base / "cmdline")
            cmdline = raw.replace("\0", " ").strip() if raw else None
        pids = cgroup_pids(self.root, self.cgroupfs, pid, self._cgroups)
        return ProcessSample(pid, start_ns, comm, open_fds, soft, hard, threads, sockets, cmdline,
                             uid=uid, nproc_soft_limit=nproc if uid != 0 else None,
                             pids_current=pids[0] if pids else None, pids_max=pids[1] if pids else None,
                             go_max_threads=GO_DEFAULT_MAX_THREADS if self._is_go(pid, start_ns) else None)

    def _is_go(self, pid: int, start_ns: int) -> bool:
        key = (pid, start_ns)
        if key not in self._go:
            if len(self._go) > 100_000:
                self._go.clear()
            self._go[key] = is_go_binary(self.root / str(pid) / "exe")
        return self._go[key]

    def _sockets(self, base: Path) -> int | None:
        try:
            fd_dir = os.open(base / "fd", os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # gone
            return None
        count = 0
        try:
            for name in os.listdir(fd_dir):
                try:
                    if os.readlink(name, dir_fd=fd_dir).startswith("socket:"):
                        count += 1
                except OSError:  # closed while we looked
                    continue
        finally:
            os.close(fd_dir)
        return count

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
        status = _read(self.root / str(pid) / "status") or ""
        return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("FDSize:")), 0)

    def round(self, with_events: Iterable[int], top: int, exclude: int | None = None) -> list[ProcessSample]:
        """One sampling round: the processes that had events plus the ``top`` by open FDs."""
        pids = set(with_events) | set(self.top_by_open_fds(top))
        pids.discard(exclude if exclude is not None else -1)
        return self.processes(pids)

    def processes(self, pids: Iterable[int]) -> list[ProcessSample]:
        """Samples of these processes, skipping the ones that are gone. Where RLIMIT_NPROC
        applies, the threads of the process's user are counted over every process."""
        self._cgroups = {}
        try:
            samples = [s for pid in sorted(set(pids)) if (s := self.sample(pid)) is not None]
        finally:
            self._cgroups = None
        limited = {s.uid for s in samples if s.nproc_soft_limit is not None and s.uid is not None}
        if not limited:
            return samples
        per_user = threads_by_uid(self.root, self.pids(), limited)
        return [replace(s, user_threads=per_user[s.uid]) if s.uid in limited and s.nproc_soft_limit is not None
                else s for s in samples]

    def system(self) -> dict[str, Any]:
        """System-wide FD, thread and listen-queue figures."""
        def number(path: str) -> int | None:
            text = _read(self.root / path)
            return int(text.split()[0]) if text else None

        file_nr = (_read(self.root / "sys/fs/file-nr") or "0 0 0").split()
        netstat = self._netstat()
        return {
            "file_nr": int(file_nr[0]),
            "file_max": int(file_nr[2]),
            "nr_open": number("sys/fs/nr_open"),
            "threads_max": number("sys/kernel/threads-max"),
            "threads_total": tasks_total(self.root),
            "pid_max": number("sys/kernel/pid_max"),
            "somaxconn": number("sys/net/core/somaxconn"),
            "listen_overflows": netstat.get("ListenOverflows"),
            "listen_drops": netstat.get("ListenDrops"),
        }

    def _netstat(self) -> dict[str, int]:
        text = _read(self.root / "net/netstat") or ""
        lines = text.splitlines()
        for header, values in zip(lines[::2], lines[1::2], strict=False):
            if header.startswith("TcpExt:"):
                return dict(zip(header.split()[1:], map(int, values.split()[1:]), strict=False))
        return {}
