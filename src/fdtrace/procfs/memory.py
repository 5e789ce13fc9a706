"""Memory headroom from procfs and the cgroup tree: a process's resident memory (split as the
OOM killer splits it: anon, file, shmem) and the memory cgroup that limits it most tightly (its
own or an ancestor's, cgroup v2 or the v1 memory controller), with that cgroup's OOM kills."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fdtrace.procfs.reader import ProcFS
from fdtrace.procfs.thread_limits import cgroup_ancestry

#: A v1 limit at or above this is "no limit" (the kernel writes PAGE_COUNTER_MAX pages in bytes).
UNLIMITED_FROM = 1 << 62
#: The status fields of resident memory, in kB, and the sample fields they fill.
RSS_FIELDS = (("RssAnon", "rss_anon_kb"), ("RssFile", "rss_file_kb"), ("RssShmem", "rss_shmem_kb"))


@dataclass(frozen=True)
class CgroupMemory:
    """One memory cgroup's figures: its limit and usage in bytes, the OOM kills in it."""

    limit: int
    usage: int
    oom_kills: int | None
    folder: Path


def resident_kb(status: dict[str, str]) -> dict[str, int | None]:
    """RssAnon, RssFile and RssShmem of a process's status (kB), None where absent (a kernel
    before 4.5, or a zombie)."""
    found: dict[str, int | None] = {}
    for name, column in RSS_FIELDS:
        words = status.get(name, "").split()
        found[column] = int(words[0]) if words and words[0].isdigit() else None
    return found


def _read(path: Path) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read(4096)
    except OSError:
        return None


def _number(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def _oom_kills(text: str | None) -> int | None:
    """The ``oom_kill N`` line of memory.events (v2) or memory.oom_control (v1)."""
    for line in (text or "").splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "oom_kill" and words[1].isdigit():
            return int(words[1])
    return None


def _folder_memory(folder: Path, v2: bool) -> CgroupMemory | None:
    """A cgroup folder's limit, usage and OOM kills; None where it sets no limit."""
    if v2:
        limit, usage = _number(_read(folder / "memory.max")), _number(_read(folder / "memory.current"))
        events = _read(folder / "memory.events")
    else:
        limit = _number(_read(folder / "memory.limit_in_bytes"))
        usage = _number(_read(folder / "memory.usage_in_bytes"))
        events = _read(folder / "memory.oom_control")
    if limit is None or usage is None or limit >= UNLIMITED_FROM:
        return None
    return CgroupMemory(limit, usage, _oom_kills(events), folder)


def cgroup_memory(procfs: ProcFS, cgroupfs: Path, pid: int,
                  cache: dict[Path, CgroupMemory | None] | None = None,
                  lines: list[tuple[str, str, str]] | None = None) -> CgroupMemory | None:
    """The memory cgroup that leaves the process the least memory to spare: its own or an
    ancestor's, on cgroup v2 (memory.max) or the v1 memory controller (memory.limit_in_bytes).
    None when no cgroup limits its memory (or it is gone). ``cache`` keeps each folder's figures
    for the processes of one round; ``lines``: its /proc/PID/cgroup when already read."""
    tightest: CgroupMemory | None = None
    for folder, v2 in cgroup_ancestry(procfs, cgroupfs, pid, "memory", lines):
        if cache is not None and folder in cache:
            found = cache[folder]
        else:
            found = _folder_memory(folder, v2)
            if cache is not None:
                cache[folder] = found
        if found is not None and (tightest is None or found.limit - found.usage < tightest.limit - tightest.usage):
            tightest = found
    return tightest


def meminfo_kb(text: str | None) -> dict[str, int | None]:
    """MemTotal and MemAvailable of /proc/meminfo (kB)."""
    found: dict[str, int | None] = {"mem_total_kb": None, "mem_available_kb": None}
    for line in (text or "").splitlines():
        name, _, rest = line.partition(":")
        column = {"MemTotal": "mem_total_kb", "MemAvailable": "mem_available_kb"}.get(name)
        words = rest.split()
        if column and words and words[0].isdigit():
            found[column] = int(words[0])
    return found


def memory_allowed(procfs: ProcFS | None = None, cgroupfs: Path = Path("/sys/fs/cgroup"),
                   pid: int | None = None) -> int | None:
    """The memory a process may use, in bytes: the lowest memory cgroup limit over it (its own or
    an ancestor's, v2 memory.max or v1 memory.limit_in_bytes) and this host's MemAvailable,
    whichever is lower; None when neither can be read. A process in a cgroup of 512 MiB on a host
    of 64 GiB may use 512 MiB, not what /proc/meminfo says."""
    import os

    procfs = procfs or ProcFS()
    pid = os.getpid() if pid is None else pid
    found: list[int] = []
    for folder, v2 in cgroup_ancestry(procfs, cgroupfs, pid, "memory"):
        limit = _number(_read(folder / ("memory.max" if v2 else "memory.limit_in_bytes")))
        if limit is not None and limit < UNLIMITED_FROM:
            found.append(limit)
    available = meminfo_kb(_read(procfs.root / "meminfo"))["mem_available_kb"]
    if available is not None:
        found.append(available * 1024)
    return min(found) if found else None


def resident_bytes() -> int | None:
    """This process's resident memory now (/proc/self/statm), in bytes."""
    import os

    text = _read(Path("/proc/self/statm"))
    words = (text or "").split()
    return int(words[1]) * os.sysconf("SC_PAGE_SIZE") if len(words) > 1 and words[1].isdigit() else None
