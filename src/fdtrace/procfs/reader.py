"""The one reader of /proc, with one error policy (psutil's): a configurable root; reading a
process that exited (or never was) raises :class:`ProcessGoneError`, at whichever step of the read
it went (opening its folder, listing it, reading a file it holds open); one that may not be read
raises :class:`ProcessAccessDeniedError`; any other failure (EMFILE, EIO) stays an ``OSError``
(:func:`skip_reason` names all three for the counters of what was skipped); a system-wide file that
is missing reads as None."""

from __future__ import annotations

import errno
import os
import resource
import stat as stat_mode
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from fdtrace.procfs.containers import Placement, placement

#: The live procfs tree: the default root of every reader (a test passes another).
PROC_ROOT = "/proc"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TICK_NS = 1_000_000_000 // CLOCK_TICKS


class ProcessGoneError(Exception):
    """The process exited (or never existed) while it was being read."""

    def __init__(self, pid: int) -> None:
        super().__init__(f"process {pid} is gone")
        self.pid = pid


class ProcessAccessDeniedError(Exception):
    """The process's files may not be read (another user's, without privileges)."""

    def __init__(self, pid: int) -> None:
        super().__init__(f"process {pid} may not be read")
        self.pid = pid


def _translate(error: OSError, pid: int) -> Exception:
    if isinstance(error, PermissionError) or error.errno in (errno.EACCES, errno.EPERM):
        return ProcessAccessDeniedError(pid)
    if isinstance(error, FileNotFoundError | ProcessLookupError | NotADirectoryError) or error.errno == errno.ESRCH:
        return ProcessGoneError(pid)
    return error


#: What a per-process read may raise: the process went, may not be read, or the read failed.
READ_ERRORS = (ProcessGoneError, ProcessAccessDeniedError, OSError)


def skip_reason(error: BaseException) -> str:
    """The name a skipped read is counted under: "gone", "denied", or the errno's name (EMFILE)."""
    if isinstance(error, ProcessGoneError):
        return "gone"
    if isinstance(error, ProcessAccessDeniedError):
        return "denied"
    if isinstance(error, OSError) and error.errno is not None:
        return errno.errorcode.get(error.errno, str(error.errno))
    return type(error).__name__


#: The flag of a task in do_exit() (PF_EXITING of include/linux/sched.h), in /proc/PID/stat's ninth field.
PF_EXITING = 0x4


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat fdtrace uses."""

    comm: str
    state: str
    ppid: int
    #: Process start in CLOCK_BOOTTIME ns (field 22, at tick resolution).
    start_ns: int
    #: The task's flags (field 9).
    flags: int = 0

    @property
    def exited(self) -> bool:
        """A zombie or dead task: nothing of it is left to sample."""
        return self.state in ("Z", "X")

    @property
    def exiting(self) -> bool:
        """In do_exit() (PF_EXITING): its memory and files are being let go, so what is read of
        it now may be half gone."""
        return bool(self.flags & PF_EXITING)


@dataclass(frozen=True)
class Credentials:
    """Whom a process's file accesses are checked as: its real user id and its groups (the real
    group id and the supplementary ones); and whether its ids differ from one another (real,
    effective, saved, filesystem), as a setuid or setgid program's do.

    Attributes:
        uid: the real user id.
        gids: the real group id and the supplementary groups.
        changed: its effective, saved or filesystem user or group id is not its real one.
    """

    uid: int
    gids: frozenset[int]
    changed: bool = False


#: /proc/PID/limits is in fixed-width columns: name, soft, hard (then units).
_LIMIT_COLUMNS = (slice(0, 26), slice(26, 47), slice(47, 68))


def _limit(text: str) -> int | None:
    return None if text == "unlimited" else int(text)


def _unlimited(value: int) -> int | None:
    return None if value == resource.RLIM_INFINITY else value


def _rlimits(pid: int) -> dict[str, tuple[int | None, int | None]]:
    nofile = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    nproc = resource.prlimit(pid, resource.RLIMIT_NPROC)
    return {"Max open files": (_unlimited(nofile[0]), _unlimited(nofile[1])),
            "Max processes": (_unlimited(nproc[0]), _unlimited(nproc[1]))}


#: The most bytes one read of a process's memory returns, whatever the caller asks (a blocked
#: thread's stack is 4 KiB, a Python frame or string a few hundred bytes).
MAX_MEMORY_READ = 1 << 20
#: Bytes read at most of one file of a process (stat, status, limits, cgroup: a few KiB; cgroup
#: paths are the longest, 4 KiB each) or of a system-wide file (file-nr, meminfo, netstat: a few
#: KiB), whatever the file says: a read never takes more memory than this.
PROCESS_FILE_BYTES = 1 << 20
SYSTEM_FILE_BYTES = 1 << 20
#: A process's maps are read up to this size: 65,530 mappings (vm.max_map_count's default) of 256
#: bytes a line; past it, mappings are not seen.
MAX_MAPS_BYTES = 16 << 20
#: A network namespace's table (net/tcp, net/fib_trie) is read up to this size: about 60,000
#: sockets at 150 bytes a line; past it, what it holds is not seen.
MAX_NET_TABLE_BYTES = 8 << 20
#: Bytes of /proc/PID/status read at most for a process's real uid (its Uid line is in the first 1 KiB).
MAX_STATUS_BYTES = 4096
#: Bytes of fdtrace's own status read at most for its capabilities (CapEff is in the first 2 KiB).
MAX_OWN_STATUS_BYTES = 16384


def _read_at_most(file: BinaryIO, limit: int) -> bytes:
    """Up to ``limit`` bytes of an open file, read in chunks until its end (a /proc file may
    answer a read with less than it holds). The first read asks 8 KiB, as a whole read does
    (most /proc files are smaller: a larger buffer costs its allocation every read), and each next
    one twice its last, up to 1 MiB."""
    chunks: list[bytes] = []
    left, size = limit, 8192
    while left > 0 and (chunk := file.read(min(left, size))):
        chunks.append(chunk)
        left -= len(chunk)
        size = min(size * 2, 1 << 20)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class ProcessMemory:
    """A process's memory (/proc/PID/mem) opened once for many reads; each read is bounded by
    MAX_MEMORY_READ and gives fewer bytes (or none) where the memory is unmapped, the process
    gone or the address out of range. Close it (or use it as a context manager)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read(self, address: int, size: int) -> bytes:
        """At most ``size`` bytes at ``address``."""
        if address < 0 or size <= 0 or address + size > 1 << 64:
            return b""
        try:
            return os.pread(self._fd, min(size, MAX_MEMORY_READ), address)
        except (OSError, OverflowError):
            return b""

    def close(self) -> None:
        """Close the memory file."""
        os.close(self._fd)

    def __enter__(self) -> ProcessMemory:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class ProcFS:
    """One procfs tree (``/proc`` unless a test passes another root)."""

    def __init__(self, root: str | Path = PROC_ROOT) -> None:
        self.root = Path(root)
        self.live = self.root == Path(PROC_ROOT)
        self._prefix = f"{self.root}/"

    # Per process: raise ProcessGoneError or ProcessAccessDeniedError.

    def read(self, pid: int, name: str, limit: int = PROCESS_FILE_BYTES) -> str:
        """The text of /proc/PID/NAME, of its first ``limit`` bytes."""
        return self.read_bytes(pid, name, limit).decode(errors="replace")

    def stat(self, pid: int) -> ProcStat:
        """/proc/PID/stat, parsed (comm may hold spaces and parentheses)."""
        text = self.read(pid, "stat")
        fields = text[text.rfind(")") + 2 :].split()
        try:
            return ProcStat(text[text.find("(") + 1 : text.rfind(")")], fields[0], int(fields[1]),
                            int(fields[19]) * TICK_NS, int(fields[6]))
        except (IndexError, ValueError):
            raise ProcessGoneError(pid) from None  # a torn or foreign file: nothing usable

    def read_bytes(self, pid: int, name: str, limit: int = PROCESS_FILE_BYTES) -> bytes:
        """The bytes of /proc/PID/NAME (one open and read, no Path objects: this runs for every
        sampled process every round), at most ``limit`` of them (PROCESS_FILE_BYTES; more for
        files whose size others decide, such as a network namespace's socket tables)."""
        try:
            with open(f"{self._prefix}{pid}/{name}", "rb", buffering=0) as file:
                return _read_at_most(file, limit)
        except OSError as exc:
            raise _translate(exc, pid) from None

    def status(self, pid: int, names: tuple[str, ...] | None = None) -> dict[str, str]:
        """/proc/PID/status as {field: value} (values as written, tabs included); ``names``:
        only these fields (those the file has), found without splitting the whole file."""
        data = b"\n" + self.read_bytes(pid, "status")
        if names is None:
            return {name: value for name, sep, value in
                    (line.partition(":") for line in data.decode(errors="replace").splitlines()) if sep}
        fields = {}
        for name in names:
            start = data.find(b"\n" + name.encode() + b":")
            if start >= 0:
                start += len(name) + 2
                end = data.find(b"\n", start)
                fields[name] = data[start:end if end >= 0 else None].decode(errors="replace")
        return fields

    def limits(self, pid: int) -> dict[str, tuple[int | None, int | None]]:
        """RLIMIT_NOFILE and RLIMIT_NPROC as {"Max open files": (soft, hard), "Max processes":
        (soft, hard)}, None for unlimited. On the live /proc they come from prlimit(2), as psutil
        reads them (ten times faster than parsing the file, see docs/benchmarks.md); elsewhere
        (a tree a test made, or prlimit refused) from /proc/PID/limits."""
        if self.live:
            try:
                return _rlimits(pid)
            except ProcessLookupError:
                raise ProcessGoneError(pid) from None
            except PermissionError:
                pass  # another user's process without CAP_SYS_RESOURCE: its file is readable
        return self.limits_file(pid)

    def limits_file(self, pid: int) -> dict[str, tuple[int | None, int | None]]:
        """/proc/PID/limits as {name: (soft, hard)}, None for unlimited."""
        limits = {}
        for line in self.read(pid, "limits").splitlines()[1:]:
            name, soft, hard = (line[column].strip() for column in _LIMIT_COLUMNS)
            try:
                limits[name] = (_limit(soft), _limit(hard))
            except ValueError:
                continue
        return limits

    def credentials(self, pid: int) -> Credentials:
        """The ids of /proc/PID/status: the real user and group (Uid's and Gid's first field) and
        Groups, and whether any of the other three (effective, saved, filesystem) differs from the
        real one. A status without them reads as ProcessGoneError."""
        status = self.status(pid, ("Uid", "Gid", "Groups"))
        try:
            uids = [int(word) for word in status["Uid"].split()[:4]]
            gid_list = [int(word) for word in status.get("Gid", "").split()[:4]]
            if len(uids) != 4 or len(gid_list) not in (0, 4):
                raise ValueError("not four ids")
            gids = set(gid_list[:1])
            gids.update(int(gid) for gid in status.get("Groups", "").split())
        except (KeyError, IndexError, ValueError):
            raise ProcessGoneError(pid) from None  # a torn or foreign file: nothing usable
        changed = len(set(uids)) > 1 or len(set(gid_list)) > 1
        return Credentials(uids[0], frozenset(gids), changed)

    def cmdline(self, pid: int, limit: int = 256 << 10) -> list[str]:
        """The arguments of the process, of its first ``limit`` bytes (its owner decides how long
        it is: megabytes, with a large stack limit; the last argument may be cut)."""
        return [part for part in self.read_bytes(pid, "cmdline", limit).decode(errors="replace").split("\0") if part]

    def cgroups(self, pid: int) -> list[tuple[str, str, str]]:
        """/proc/PID/cgroup as (hierarchy, controllers, path) lines."""
        lines = []
        for line in self.read(pid, "cgroup").splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3:
                lines.append((parts[0], parts[1], parts[2]))
        return lines

    def exe(self, pid: int) -> Path:
        """The path through which the executable is opened (/proc/PID/exe)."""
        return self.root / str(pid) / "exe"

    def open_fds(self, pid: int, by_size: bool) -> int:
        """Open FDs: the size of /proc/PID/fd (Linux >= 6.2, O(1)) or a listing of it."""
        fd_dir = self.root / str(pid) / "fd"
        try:
            return os.stat(fd_dir).st_size if by_size else len(os.listdir(fd_dir))
        except OSError as exc:
            raise _translate(exc, pid) from None

    def fd_targets(self, pid: int) -> list[str]:
        """Where each open FD points (``socket:[123]``, a path, ``pipe:[45]``); FDs closed while
        listed are left out. The whole listing is read here (not lazily), so a process that exits
        after its folder is opened is a ProcessGoneError of this call, like any other read."""
        try:
            fd_dir = os.open(f"{self._prefix}{pid}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise _translate(exc, pid) from None
        try:
            names = os.listdir(fd_dir)  # ENOENT once the process has exited
            targets = []
            for name in names:
                try:
                    targets.append(os.readlink(name, dir_fd=fd_dir))
                except OSError:  # closed while we looked (or the process went: then all are)
                    continue
            return targets
        except OSError as exc:
            raise _translate(exc, pid) from None
        finally:
            os.close(fd_dir)

    def fd_numbers(self, pid: int) -> set[int]:
        """The numbers of the process's open FDs."""
        try:
            return {int(name) for name in os.listdir(self.root / str(pid) / "fd") if name.isdigit()}
        except OSError as exc:
            raise _translate(exc, pid) from None

    def fd_target(self, pid: int, fd: int) -> str | None:
        """Where one FD points (``socket:[123]``, ``pipe:[45]``, a path); None once it is closed."""
        try:
            return os.readlink(f"{self._prefix}{pid}/fd/{fd}")
        except OSError:
            return None

    def fd_mode(self, pid: int, fd: int) -> int | None:
        """The ``st_mode`` of the file an FD has open (the magic link is followed without a path
        lookup, so a planted FIFO is neither opened nor waited on); None once it is closed."""
        try:
            return os.stat(f"{self._prefix}{pid}/fd/{fd}").st_mode
        except OSError:
            return None

    def thread_ids(self, pid: int) -> list[int]:
        """The process's thread ids."""
        try:
            return [int(name) for name in os.listdir(self.root / str(pid) / "task") if name.isdigit()]
        except OSError as exc:
            raise _translate(exc, pid) from None

    def thread_syscall(self, pid: int, tid: int) -> str | None:
        """/proc/PID/task/TID/syscall: "NR ARG1 ... SP PC" while blocked in a syscall, "-1 SP PC"
        when blocked elsewhere, "running"; None when the thread is gone or unreadable."""
        try:
            with open(f"{self._prefix}{pid}/task/{tid}/syscall", "rb", buffering=0) as file:
                return file.read(512).decode(errors="replace").strip()
        except OSError:
            return None

    def executable_maps(self, pid: int) -> list[tuple[int, int, int, int, int, str]]:
        """The process's executable mappings: (start, end, file offset, device, inode, path),
        sorted by start; anonymous ones have inode 0."""
        maps = []
        for line in self.read_bytes(pid, "maps", MAX_MAPS_BYTES).decode(errors="replace").splitlines():
            parts = line.split(None, 5)
            if len(parts) < 5 or "x" not in parts[1]:
                continue
            try:
                start, end = (int(x, 16) for x in parts[0].split("-"))
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                maps.append((start, end, int(parts[2], 16), os.makedev(major, minor), int(parts[4]),
                             parts[5].strip() if len(parts) > 5 else ""))
            except ValueError:
                continue
        maps.sort()
        return maps

    def exists(self, pid: int) -> bool:
        """Whether the process's folder is in the tree (it lives, or is a zombie not yet reaped)."""
        return os.path.exists(f"{self._prefix}{pid}")

    def real_uid(self, pid: int) -> int | None:
        """The real uid of a process (who ran it, not a setuid binary's owner), from the first
        MAX_STATUS_BYTES of its status; None once it is gone or where the file says none."""
        try:
            data = self.read_bytes(pid, "status", MAX_STATUS_BYTES)
        except READ_ERRORS:
            return None
        for line in data.splitlines():
            if line.startswith(b"Uid:"):
                try:
                    return int(line.split()[1])
                except (IndexError, ValueError):
                    return None
        return None

    def memory(self, pid: int) -> ProcessMemory:
        """The process's memory opened for reads (``ProcessMemory``); OSError where it cannot be
        opened (gone, or not ours to read)."""
        return ProcessMemory(os.open(f"{self._prefix}{pid}/mem", os.O_RDONLY | os.O_CLOEXEC))

    def read_memory(self, pid: int, address: int, size: int) -> bytes:
        """At most ``size`` bytes of the process's memory at ``address`` (one open, one read);
        fewer or none where unmapped, gone or denied."""
        try:
            memory = self.memory(pid)
        except OSError:
            return b""
        with memory:
            return memory.read(address, size)

    def mapped_files(self, pid: int, start: int, end: int, device: int, inode: int, path: str) -> Iterator[str]:
        """Paths through which the file of one mapping (``executable_maps``'s start, end, device,
        inode and path) can be opened as the very file the process maps: its map_files entry,
        then its path under the process's root; a candidate that is not a regular file, or is on
        the mapping's device with another inode, is passed over (an overlay shows other numbers:
        then the path is trusted). The caller opens each in turn until one reads."""
        for candidate in (f"{self._prefix}{pid}/map_files/{start:x}-{end:x}", f"{self._prefix}{pid}/root{path}"):
            try:
                info = os.stat(candidate)
            except OSError:
                continue
            if not stat_mode.S_ISREG(info.st_mode) or (info.st_dev == device and info.st_ino != inode):
                continue
            yield candidate

    def start_ns(self, pid: int) -> int | None:
        """Process start in CLOCK_BOOTTIME ns, None if it is gone or unreadable."""
        try:
            return self.stat(pid).start_ns
        except READ_ERRORS:
            return None

    # fdtrace's own process (/proc/self, whatever pid namespace it is seen from).

    def own_open_fds(self) -> int:
        """fdtrace's own open descriptors (its fd folder listed, less the listing's own)."""
        return len(os.listdir(f"{self._prefix}self/fd")) - 1

    def own_capabilities(self) -> int:
        """The CapEff bit mask of fdtrace's own process, from the first MAX_OWN_STATUS_BYTES of its
        status (0 where it says none); OSError where the file cannot be read."""
        with open(f"{self._prefix}self/status", "rb", buffering=0) as status:
            data = status.read(MAX_OWN_STATUS_BYTES)
        for line in data.splitlines():
            if line.startswith(b"CapEff:"):
                return int(line.split()[1], 16)
        return 0

    # The whole system: None where a file is missing.

    def pids(self) -> list[int]:
        """Every process id in the tree."""
        return [int(name) for name in os.listdir(self.root) if name.isdigit()]

    def system_text(self, relative: str, limit: int = SYSTEM_FILE_BYTES) -> str | None:
        """A system-wide file (``sys/fs/file-nr``, ``loadavg``, ...), of its first ``limit``
        bytes; None when it cannot be read."""
        try:
            with open(f"{self._prefix}{relative}", "rb", buffering=0) as file:
                return _read_at_most(file, limit).decode(errors="replace")
        except OSError:
            return None

    def system_number(self, relative: str) -> int | None:
        """The first number of a system-wide file, None when it cannot be read."""
        text = self.system_text(relative)
        try:
            return int(text.split()[0]) if text else None
        except ValueError:
            return None


class StartTimeResolver:
    """Gives each event's process its start time, so that (pid, start_ns) survives PID reuse,
    and its placement (cgroup, unit, container, pod).

    Processes seen starting get the start computed from the event's own stamp (the kernel takes
    its start time moments before the tracepoint fires); others are read from /proc once and
    cached until their exit event. A placement is read from /proc/PID/cgroup the first time the
    process is seen, again after an exec (container runtimes move a process into its cgroup
    before they exec the container's program) and again once it is ``placement_max_age_ns`` old
    (a process moved by a write to cgroup.procs, which no event shows), at most
    ``max_rereads_per_s`` of those a second (about 26 µs each: a host with more active processes
    than that has some of theirs a little older); one that is gone by then keeps what was read, or
    has its parent's when its start was seen (a child starts in its parent's cgroup).
    """

    def __init__(self, procfs: ProcFS | None = None, max_cached: int = 65536,
                 placement_max_age_ns: int = 1_000_000_000, max_rereads_per_s: int = 1000,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.procfs = procfs or ProcFS()
        self.max_cached = max_cached
        self.placement_max_age_ns = placement_max_age_ns
        self.max_rereads_per_s = max_rereads_per_s
        self.clock = clock
        self._reread_second = -1
        self._rereads = 0
        self._cache: dict[int, int | None] = {}
        self._placements: dict[int, tuple[Placement | None, int]] = {}

    def started(self, pid: int, ts_ns: int, boottime_offset_ns: int) -> int:
        """Note a process_start seen at ``ts_ns`` (monotonic) and return its start time."""
        start = (ts_ns + boottime_offset_ns) // TICK_NS * TICK_NS
        self._remember(pid, start)
        return start

    def lookup(self, pid: int) -> int | None:
        """The start time of a live (or recently seen) process."""
        if pid in self._cache:
            return self._cache[pid]
        start = self.procfs.start_ns(pid)
        self._remember(pid, start)  # None too: a gone process is not looked for again
        return start

    def placement_of(self, pid: int, parent: int | None = None, reread: bool = False,
                     now_ns: int | None = None, gone: bool = False) -> Placement | None:
        """Where a live (or recently seen) process runs; None when it cannot be read. ``parent``:
        the process it was seen starting from, whose placement a gone child takes; ``reread``:
        read it again (after an exec); ``now_ns``: the resolver's clock, read once by a caller
        that asks for many processes; ``gone``: it has exited (its exit was seen), so /proc is
        not read (a reused pid would be another process): its known placement, else its parent's."""
        now = self.clock() if now_ns is None else now_ns
        known = self._placements.get(pid)
        if gone:
            if known is not None:
                return known[0]
            inherited = self._placements.get(parent) if parent is not None else None
            return inherited[0] if inherited is not None else None
        if known is not None and not reread:
            if now - known[1] < self.placement_max_age_ns:
                return known[0]
            if now // 1_000_000_000 != self._reread_second:
                self._reread_second, self._rereads = now // 1_000_000_000, 0
            if self._rereads >= self.max_rereads_per_s:
                return known[0]  # this second's re-reads are spent: read it again in a later batch
            self._rereads += 1
        try:
            where: Placement | None = placement(self.procfs.cgroups(pid))
        except READ_ERRORS:
            if known is not None:
                where = known[0]
            else:
                inherited = self._placements.get(parent) if parent is not None else None
                where = inherited[0] if inherited is not None else None
        if len(self._placements) >= self.max_cached and known is None:
            self._placements.pop(next(iter(self._placements)))
        self._placements[pid] = (where, now)
        return where

    def exited(self, pid: int) -> None:
        """Forget a process after its exit: the pid may be reused."""
        self._cache.pop(pid, None)
        self._placements.pop(pid, None)

    def _remember(self, pid: int, start: int | None) -> None:
        if len(self._cache) >= self.max_cached:
            self._cache.pop(next(iter(self._cache)))
        self._cache[pid] = start
