"""The limits on a process's threads, read from procfs and the cgroup tree: RLIMIT_NPROC (all
threads of the real user count against it), the cgroup's pids.max (all tasks of the cgroup and
its descendants), and Go's own limit for Go programs. The system-wide threads-max is in the
sampler's system figures."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fdtrace.procfs.golang import GO_DEFAULT_MAX_THREADS
from fdtrace.procfs.reader import READ_ERRORS, ProcFS

#: The limits on a process's threads: (name, the sample's limit field, the count that limit is
#: compared with). The last is system-wide, from the system figures.
THREAD_LIMITS = (
    ("Go default", "go_max_threads", "threads"),
    ("RLIMIT_NPROC", "nproc_soft_limit", "user_threads"),
    ("cgroup pids.max", "pids_max", "pids_current"),
    ("threads-max", "threads_max", "threads_total"),
)


#: Go's limit when a program set its own (debug.SetMaxThreads), read from its memory.
GO_SET_LIMIT = "Go SetMaxThreads"


def limit_name(name: str, limit: int) -> str:
    """A limit's name as shown: Go's is "Go default" at its default of 10000, else the limit the
    program set itself."""
    return GO_SET_LIMIT if name == "Go default" and limit != GO_DEFAULT_MAX_THREADS else name


def binding_limit(sample: Any) -> tuple[str, int, int] | None:
    """(name, count, limit) of the limit that leaves a sample the fewest threads to spare, over
    the fields the sample has (a ProcessSample has no system figures); None when none applies."""
    found = None
    for name, limit_field, count_field in THREAD_LIMITS:
        limit, count = getattr(sample, limit_field, None), getattr(sample, count_field, None)
        if limit is not None and count is not None and (found is None or limit - count < found[2] - found[1]):
            found = (limit_name(name, limit), count, limit)
    return found


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _folder_pids(folder: Path, cache: dict[Path, tuple[int, int] | None] | None) -> tuple[int, int] | None:
    """(pids.current, pids.max) of one cgroup folder, None where it sets no limit."""
    if cache is not None and folder in cache:
        return cache[folder]
    limit_text = (_read(folder / "pids.max") or "").strip()
    current_text = (_read(folder / "pids.current") or "").strip()
    found = (int(current_text), int(limit_text)) if limit_text.isdigit() and current_text.isdigit() else None
    if cache is not None:
        cache[folder] = found
    return found


def cgroup_ancestry(procfs: ProcFS, cgroupfs: Path, pid: int, controller: str,
                    lines: list[tuple[str, str, str]] | None = None) -> Iterator[tuple[Path, bool]]:
    """Every cgroup folder over the process where ``controller`` applies, its own first, then each
    ancestor up to its hierarchy's root: (folder, whether it is cgroup v2), for v2 and for the v1
    hierarchy of that controller. Nothing when the process is gone. ``lines``: its
    /proc/PID/cgroup when already read."""
    if lines is None:
        try:
            lines = procfs.cgroups(pid)
        except READ_ERRORS:
            return
    for hierarchy, controllers, path in lines:
        v2 = hierarchy == "0" and controllers == ""
        if v2:
            base = cgroupfs / "unified" if (cgroupfs / "unified").is_dir() else cgroupfs
        elif controller in controllers.split(","):
            base = cgroupfs / controller
        else:
            continue
        folder = base / path.strip("/")
        while True:
            yield folder, v2
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent


def cgroup_pids(procfs: ProcFS, cgroupfs: Path, pid: int,
                cache: dict[Path, tuple[int, int] | None] | None = None,
                lines: list[tuple[str, str, str]] | None = None) -> tuple[int, int] | None:
    """(pids.current, pids.max) of the tightest pids limit on the process: its own cgroup's or an
    ancestor's, whichever leaves the fewest tasks to spare. None when no cgroup limits its tasks
    (or the process is gone). Works on cgroup v2 and on the v1 pids controller. ``cache`` keeps
    each folder's figures for processes sampled at the same moment (most share their cgroups);
    ``lines``: its /proc/PID/cgroup when already read."""
    tightest: tuple[int, int] | None = None
    for folder, _v2 in cgroup_ancestry(procfs, cgroupfs, pid, "pids", lines):
        candidate = _folder_pids(folder, cache)
        if candidate is not None and (tightest is None or candidate[1] - candidate[0] < tightest[1] - tightest[0]):
            tightest = candidate
    return tightest


def threads_by_uid(procfs: ProcFS, pids: Iterable[int], uids: set[int]) -> dict[int, int]:
    """Threads of each of ``uids`` (real user id) over ``pids``: what RLIMIT_NPROC counts."""
    totals = dict.fromkeys(uids, 0)
    for pid in pids:
        try:
            status = procfs.status(pid, ("Uid", "Threads"))
        except READ_ERRORS:
            continue
        try:
            uid, threads = int(status["Uid"].split()[0]), int(status["Threads"])
        except (KeyError, IndexError, ValueError):
            continue
        if uid in totals:
            totals[uid] += threads
    return totals


def tasks_total(procfs: ProcFS) -> int | None:
    """Threads on the system (the total of /proc/loadavg's 4th field): what threads-max bounds."""
    fields = (procfs.system_text("loadavg") or "").split()
    if len(fields) < 4 or "/" not in fields[3]:
        return None
    return int(fields[3].split("/")[1])

