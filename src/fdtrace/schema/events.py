"""The event model: kinds, syscalls, counters, loss counters, the BPF record and its
kind-specific slots, and the columns of the ``events`` table.

Everything that names an event kind, a traced syscall, a counter or a slot comes from here:
the BPF programs get the numbering as ``-D`` flags (:func:`bpf_cflags`), the kernel package
decodes raw records with :data:`RAW_EVENT_DTYPE` and :data:`EXTRA_SLOTS`.
"""

from __future__ import annotations

import enum
import time
from typing import Any

import numpy as np

from fdtrace.schema.fields import Field


class Kind(enum.IntEnum):
    """What happened. The value is the number used in the BPF event record."""

    SOCKET = 1
    ACCEPT = 2
    CONNECT = 3
    CLOSE = 4
    FD_ERROR = 5
    THREAD_START = 6
    THREAD_EXIT = 7
    PROCESS_START = 8
    PROCESS_EXEC = 9
    PROCESS_EXIT = 10
    OOM_KILL = 11
    TCP_ESTABLISHED = 12  # a TCP connection of this host became established (clock pairs; own table)
    GO_THREAD_LIMIT = 13  # Go's runtime printed "program exceeds N-thread limit" (N in ret); it exits 2
    LIMIT_CHANGE = 14  # setrlimit/prlimit64 of RLIMIT_NOFILE or RLIMIT_NPROC (ret: 0 or -errno)

    @property
    def label(self) -> str:
        """The name used in output and recordings, e.g. ``fd_error``."""
        return self.name.lower()


KIND_LABELS: dict[int, str] = {k.value: k.label for k in Kind}

#: Syscalls traced on every call (kinds socket/accept/connect/close).
SOCKET_SYSCALLS: tuple[str, ...] = ("socket", "accept", "accept4", "connect", "close")

#: Other syscalls that allocate a file descriptor and so can fail with EMFILE or ENFILE.
#: Each is traced at its exit for those two errors only (kind ``fd_error``); the ones a kernel
#: lacks are skipped at load time.
FD_ALLOC_SYSCALLS: tuple[str, ...] = (
    "open", "openat", "openat2", "creat", "open_by_handle_at", "open_tree",
    "pipe", "pipe2", "dup", "dup2", "dup3", "fcntl",
    "eventfd", "eventfd2", "epoll_create", "epoll_create1", "socketpair",
    "memfd_create", "memfd_secret", "timerfd_create", "signalfd", "signalfd4",
    "inotify_init", "inotify_init1", "fanotify_init", "pidfd_open", "pidfd_getfd",
    "io_uring_setup", "perf_event_open", "userfaultfd", "bpf", "mq_open",
    "fsopen", "fsmount", "fspick", "landlock_create_ruleset", "seccomp",
)

#: Syscalls that change a process's limits, traced for RLIMIT_NOFILE and RLIMIT_NPROC (kind limit_change).
LIMIT_SYSCALLS: tuple[str, ...] = ("setrlimit", "prlimit64")

#: The limits whose changes are traced, by their number (linux/resource.h).
LIMIT_RESOURCES: dict[int, str] = {6: "RLIMIT_NPROC", 7: "RLIMIT_NOFILE"}

#: Syscall names by their number in event records; 0 means "not a syscall".
SYSCALL_NAMES: tuple[str, ...] = ("",) + SOCKET_SYSCALLS + FD_ALLOC_SYSCALLS + LIMIT_SYSCALLS
SYSCALL_IDS: dict[str, int] = {name: i for i, name in enumerate(SYSCALL_NAMES) if name}

#: errno values of a call that did not fail: success, and the normal answers of non-blocking
#: sockets (the BPF programs count failures the same way).
NOT_FAILURES: tuple[str, ...] = ("", "EAGAIN", "EINPROGRESS")

#: Exact in-kernel counters kept per process. ``*_errors`` count failed calls: a negative
#: return other than EAGAIN and EINPROGRESS, the normal answers of non-blocking sockets.
#: ``other_fd_call_errors`` was ``fd_errors`` before schema version 5 (read under either name).
COUNTERS: tuple[str, ...] = (
    "sockets", "socket_errors",
    "accepts", "accept_errors",
    "connects", "connect_errors",
    "closes", "close_errors",
    "other_fd_call_errors",  # failed calls of the other fd-making syscalls (open, pipe, dup, ...)
    "threads_started", "threads_exited",
)

#: Loss and overflow counters kept in BPF; every one is reported, none is silent.
STATS: tuple[str, ...] = (
    "ringbuf_full",     # events dropped because the ring buffer was full
    "counters_full",    # calls not counted because the per-process counter table was full
    "exited_full",      # exited processes whose final counters could not be kept
    "errors_full",      # errors not counted because the error table was full
    "peers_full",       # connect() calls whose destination could not be kept (table of calls in flight full)
    "followed_full",    # processes started by traced ones (--follow) not traced: the pid table was full
    "stacks_full",      # --stacks: user stacks not kept (the stack table was full, or the stack unreadable)
    "fds_full",         # --stacks: descriptors made but not remembered (the descriptor table was full)
)

#: Signals whose default action does not end the process (ignored or stop signals).
NONFATAL_SIGNALS: tuple[int, ...] = (17, 18, 19, 20, 21, 22, 23, 28)  # CHLD CONT STOP TSTP TTIN TTOU URG WINCH

#: The raw record of bpf/fdtrace.h ``struct fdt_event``.
RAW_EVENT_DTYPE = np.dtype(
    [
        ("ts_ns", "<u8"),
        ("pid", "<u4"),
        ("tid", "<u4"),
        ("ret", "<i8"),
        ("fd", "<i4"),
        ("kind", "u1"),
        ("syscall", "u1"),
        ("errno", "<u2"),
        ("comm", "S16"),
        ("extra", "<u8", (4,)),
    ]
)

#: What each kind keeps in the record's four ``extra`` slots, by slot. The BPF programs write
#: them through ``FDT_X_<KIND>_<NAME>`` flags, the decoder reads them through :func:`slot`.
#: A connect's destination and an accept's client are the first 24 bytes of a sockaddr.
EXTRA_SLOTS: dict[Kind, tuple[str, ...]] = {
    Kind.ACCEPT: ("sockaddr0", "sockaddr1", "sockaddr2"),
    Kind.CONNECT: ("sockaddr0", "sockaddr1", "sockaddr2"),
    Kind.THREAD_START: ("creator_tid",),
    Kind.PROCESS_START: ("ppid",),
    Kind.PROCESS_EXEC: ("old_tid",),
    Kind.PROCESS_EXIT: ("exit_known", "exit_code", "signal"),
    Kind.OOM_KILL: ("total_vm_kb", "anon_rss_kb", "file_rss_kb", "shmem_rss_kb"),
    # The local and remote address, 16 bytes each (IPv4 in the first 4); ports, family and role in ret.
    Kind.TCP_ESTABLISHED: ("local0", "local1", "remote0", "remote1"),
    Kind.LIMIT_CHANGE: ("target", "resource", "soft", "hard"),
}


#: With --stacks, the last ``extra`` slot of these kinds holds the id of the user stack that made
#: the call (0: none): of failures (socket, accept, connect, fd_error) and of thread creation.
STACK_KINDS: tuple[Kind, ...] = (Kind.SOCKET, Kind.ACCEPT, Kind.CONNECT, Kind.FD_ERROR, Kind.THREAD_START)
STACK_SLOT = 3

#: Frames kept per user stack (``bpf_get_stack``); a deeper stack is cut there and says so.
STACK_DEPTH = 48


def slot(kind: Kind, name: str) -> int:
    """The index in ``extra`` of one kind's named slot."""
    return EXTRA_SLOTS[kind].index(name)


#: The columns of the ``events`` table, in order. docs/format.md describes the same fields.
EVENT_FIELDS: tuple[Field, ...] = (
    Field("ts_ns", "int64", False, "CLOCK_MONOTONIC nanoseconds, from bpf_ktime_get_ns()"),
    Field("time", "timestamp_utc", False,
          "UTC wall time: ts_ns plus the CLOCK_REALTIME - CLOCK_MONOTONIC offset sampled when the event was read"),
    Field("host", "dict_string", False, "host name of the traced machine"),
    Field("pid", "int32", False, "process id (tgid); for oom_kill the victim"),
    Field("tid", "int32", False, "thread id; for thread_start the new thread"),
    Field("start_ns", "int64", True,
          "process start, CLOCK_BOOTTIME ns at /proc's tick resolution; (pid, start_ns) identifies a process"),
    Field("comm", "dict_string", False, "task name (16 bytes at most)"),
    Field("kind", "dict_string", False, "what happened: one of Kind's labels, e.g. socket, fd_error, oom_kill"),
    Field("syscall", "dict_string", False, "the syscall for socket/accept/connect/close/fd_error, else empty"),
    Field("ret", "int64", True,
          "the syscall's return value: fd or -errno; go_thread_limit: the N of the runtime's 'program exceeds "
          "N-thread limit'"),
    Field("errno", "dict_string", False, "error name such as EMFILE; empty when the call succeeded"),
    Field("fd", "int32", True, "file descriptor made (socket, accept) or used (connect, close)"),
    Field("family", "dict_string", True,
          "connect: the destination's address family (AF_INET, AF_INET6, AF_UNIX, ...); accept: the client's"),
    Field("peer_addr", "dict_string", True, "connect: the destination IPv4 or IPv6 address; accept: the client's"),
    Field("peer_port", "int32", True, "connect: the destination port (AF_INET, AF_INET6); accept: the client's"),
    Field("ppid", "int32", True, "process_start: the parent process"),
    Field("creator_tid", "int32", True, "thread_start: the thread that created it"),
    Field("old_tid", "int32", True, "process_exec: the thread that called execve before it became the leader"),
    Field("exit_code", "int32", True, "process_exit: the exit status when the process exited by itself"),
    Field("signal", "dict_string", True, "process_exit: the signal that killed the process, e.g. SIGKILL"),
    Field("total_vm_kb", "int64", True, "oom_kill: the victim's virtual memory"),
    Field("anon_rss_kb", "int64", True, "oom_kill: the victim's anonymous resident memory"),
    Field("file_rss_kb", "int64", True, "oom_kill: the victim's file-backed resident memory"),
    Field("shmem_rss_kb", "int64", True, "oom_kill: the victim's shared-memory resident memory"),
    Field("oom_score_adj", "int16", True, "oom_kill: the victim's oom_score_adj"),
    Field("stack_id", "int64", True,
          "--stacks: the user stack of a failed call or of a thread's creation (the stacks table)"),
    Field("limit_target", "int32", True, "limit_change: the process whose limit the call changes (pid is the caller)"),
    Field("limit_resource", "dict_string", True, "limit_change: RLIMIT_NOFILE or RLIMIT_NPROC"),
    Field("limit_soft", "int64", True, "limit_change: the soft limit asked for (null: unlimited)"),
    Field("limit_hard", "int64", True, "limit_change: the hard limit asked for (null: unlimited)"),
    Field("cgroup", "dict_string", True, "the process's cgroup (as in samples), read when it is first seen"),
    Field("unit", "dict_string", True, "the process's systemd unit"),
    Field("container_id", "dict_string", True, "the process's container's id"),
    Field("container_runtime", "dict_string", True, "docker, containerd, cri-o or podman"),
    Field("pod_uid", "dict_string", True, "the process's Kubernetes pod's UID"),
)

EVENT_COLUMNS: tuple[str, ...] = tuple(f.name for f in EVENT_FIELDS)


def bpf_cflags() -> list[str]:
    """The ``-D`` flags that give the BPF programs this module's numbering."""
    flags = [f"-DFDT_KIND_{k.name}={k.value}" for k in Kind]
    flags += [f"-DFDT_SC_{name}={i}" for name, i in SYSCALL_IDS.items()]
    flags += [f"-DFDT_C_{name.upper()}={i}" for i, name in enumerate(COUNTERS)]
    flags.append(f"-DFDT_N_COUNTERS={len(COUNTERS)}")
    flags += [f"-DFDT_STAT_{name.upper()}={i}" for i, name in enumerate(STATS)]
    flags.append(f"-DFDT_N_STATS={len(STATS)}")
    for kind, names in EXTRA_SLOTS.items():
        flags += [f"-DFDT_X_{kind.name}_{name.upper()}={i}" for i, name in enumerate(names)]
    flags.append(f"-DFDT_X_STACK={STACK_SLOT}")
    flags.append(f"-DFDT_STACK_DEPTH={STACK_DEPTH}")
    mask = sum(1 << s for s in NONFATAL_SIGNALS)
    flags.append(f"-DFDT_NONFATAL_SIGNAL_MASK={mask}U")
    return flags


def plain_rows(table: Any) -> list[dict[str, Any]]:
    """A table's rows as Python values, its timestamps as int ns since the epoch (UTC): pyarrow
    turns nanosecond timestamps into Python objects only with pandas, which the live commands do
    not import (``cli.common.live_without_pandas``)."""
    import pyarrow as pa

    for index, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            table = table.set_column(index, field.name, table.column(index).cast(pa.int64()))
    return list(table.to_pylist())


def iso_utc(ns: int) -> str:
    """A UTC time in ns as ISO 8601, as pandas writes one: 9 decimals when the nanoseconds are not
    zero, 6 when only microseconds are, none for a whole second; "Z" for UTC."""
    seconds, fraction = divmod(int(ns), 1_000_000_000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    if fraction % 1000:
        text += f".{fraction:09d}"
    elif fraction:
        text += f".{fraction // 1000:06d}"
    return text + "Z"
