"""What a process's threads are doing: a census by the syscall each is blocked in and, for a
syscall on a descriptor, what kind of file that descriptor is."""

from __future__ import annotations

import stat
from collections import Counter
from collections.abc import Callable

from fdtrace.procfs.reader import MAX_NET_TABLE_BYTES, READ_ERRORS, ProcFS
from fdtrace.schema.records import ThreadState

#: Syscalls whose first argument is the descriptor they wait on.
FD_SYSCALLS: frozenset[str] = frozenset({
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2",
    "recvfrom", "recvmsg", "recvmmsg", "sendto", "sendmsg", "sendmmsg", "accept", "accept4", "connect",
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "ioctl", "fsync", "fdatasync", "flock", "fcntl",
    "sendfile", "splice", "tee", "getdents64", "ftruncate", "fallocate", "sync_file_range", "io_uring_enter",
})


def fd_kind(procfs: ProcFS, pid: int, fd: int) -> str:
    """What an open descriptor is, from its /proc link (and the file's type for paths)."""
    target = procfs.fd_target(pid, fd)
    if target is None:
        return "unknown"
    if target.startswith("socket:"):
        return "socket"
    if target.startswith("pipe:"):
        return "pipe"
    if target.startswith("anon_inode:"):
        return "anon:" + target[len("anon_inode:"):].strip("[]")
    mode = procfs.fd_mode(pid, fd)
    if mode is None:
        return "unknown"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "pipe"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "unknown"


#: Threads of one census whose code is looked for (each reads a few KiB of its stack).
MAX_SITE_THREADS = 2048


def thread_census(procfs: ProcFS, pid: int, syscall_name: Callable[[int], str],
                  site_of: Callable[[int, int, int, int], str | None] | None = None) -> list[ThreadState]:
    """The process's threads grouped by what they are in, largest group first.

    ``syscall_name`` names a syscall number of this machine's architecture. ``site_of(pid, tid,
    pc, sp)``, when given, names the code a thread blocked in a syscall waits in, from the program
    counter and stack pointer its syscall file gives (for the first MAX_SITE_THREADS threads).
    Raises ProcessGoneError or ProcessAccessDeniedError for the process; threads that end while
    they are read are left out."""
    groups: Counter[tuple[str, str | None, str | None]] = Counter()
    kinds: dict[int, str] = {}
    dns: set[int] | None = None  # inodes of its UDP sockets to port 53, read at its first socket
    looked = 0
    for tid in procfs.thread_ids(pid):
        text = procfs.thread_syscall(pid, tid)
        if not text:
            continue
        if text == "running":
            groups["running", None, None] += 1
            continue
        fields = text.split()
        try:
            number = int(fields[0])
        except ValueError:
            continue
        if number < 0:
            groups["user", None, None] += 1
            continue
        name = syscall_name(number)
        kind = None
        if name in FD_SYSCALLS and len(fields) > 1:
            try:
                fd = int(fields[1], 16)
            except ValueError:
                fd = -1
            if 0 <= fd < 1 << 31 and fd not in kinds:
                kinds[fd] = fd_kind(procfs, pid, fd)
                if kinds[fd] == "socket":
                    dns = dns_socket_inodes(procfs, pid) if dns is None else dns
                    if _inode(procfs.fd_target(pid, fd)) in dns:
                        kinds[fd] = "dns"
            kind = kinds.get(fd)
        site = None
        if site_of is not None and len(fields) >= 9 and looked < MAX_SITE_THREADS:
            looked += 1
            try:
                site = site_of(pid, tid, int(fields[-1], 16), int(fields[-2], 16))
            except ValueError:
                site = None
        groups[name, kind, site] += 1
    return [ThreadState(name, kind, n, site) for (name, kind, site), n in
            sorted(groups.items(), key=lambda item: (-item[1], item[0][0], item[0][1] or "", item[0][2] or ""))]


#: A network namespace's UDP socket table is read up to this size (the reader's bound for any
#: network table); a namespace with more is read that far, its DNS sockets past it not seen.
MAX_UDP_TABLE_BYTES = MAX_NET_TABLE_BYTES


def dns_socket_inodes(procfs: ProcFS, pid: int) -> set[int]:
    """The inodes of the UDP sockets connected to port 53 (a name server) in ``pid``'s network
    namespace (its /proc/PID/net/udp and udp6, each read up to MAX_UDP_TABLE_BYTES); empty where
    unreadable."""
    found = set()
    for table in ("net/udp", "net/udp6"):
        try:
            data = procfs.read_bytes(pid, table, limit=MAX_UDP_TABLE_BYTES)
        except READ_ERRORS:  # gone, denied, no IPv6: no DNS sockets seen there
            continue
        if len(data) >= MAX_UDP_TABLE_BYTES:
            data = data[:data.rfind(b"\n") + 1]  # the last line may be cut
        for line in data.decode(errors="replace").splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[2].endswith(":0035") and fields[9].isdigit():
                found.add(int(fields[9]))
    return found


def _inode(target: str | None) -> int | None:
    if target is None or not target.startswith("socket:[") or not target[8:-1].isdigit():
        return None
    return int(target[8:-1])


def dns_waiters(census: list[ThreadState]) -> int:
    """How many threads of a census wait on DNS: in the C library's resolver, or on a UDP socket to
    a name server."""
    from fdtrace.schema.site_names import DNS_LOOKUP_SITE

    return sum(s.threads for s in census if s.site == DNS_LOOKUP_SITE or s.fd_kind == "dns")


def describe_state(state: ThreadState) -> str:
    """A group in words: "412 threads blocked in read() on pipes at fetch.dialSingle"."""
    threads = f"{state.threads} thread{'s' if state.threads != 1 else ''}"
    if state.syscall == "running":
        return f"{threads} running"
    if state.syscall == "user":
        return f"{threads} blocked outside a syscall"
    on = f" on {_plural(state.fd_kind)}" if state.fd_kind else ""
    at = f" at {state.site}" if state.site else ""
    return f"{threads} blocked in {state.syscall}(){on}{at}"


def _plural(kind: str) -> str:
    if kind.startswith("anon:"):
        return kind[len("anon:"):] + " descriptors"
    return {"file": "regular files", "directory": "directories", "device": "devices",
            "unknown": "descriptors of unknown kind",
            "dns": "UDP sockets to name servers (port 53)"}.get(kind, kind + "s")
