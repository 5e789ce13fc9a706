"""Every table of a recording (and of the live stream), declared once: its columns, types and
meaning. The recording writer casts to these schemas, the reader upgrades older recordings to
them, and docs/recording.md is checked against them (tests/unit/test_schema_docs.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fdtrace.schema.events import COUNTERS, EVENT_FIELDS, STATS
from fdtrace.schema.fields import Field, arrow_type

#: Version of the tables' layout. Bump it whenever a column is added, removed or changes type,
#: and say in :data:`VERSIONS` what changed; the reader upgrades any older version it knows.
SCHEMA_VERSION = 8

#: What each version changed, for the reader's upgrade step and for people.
VERSIONS: dict[int, str] = {
    1: "fdtrace 0.1.0: events, samples, system, losses, counters, clock, haproxy and phases; columns were "
       "added over its life (peers of connect/accept, thread limits, threads_total, phase source, "
       "peers_full and followed_full), so a version 1 recording may lack any nullable column",
    2: "every table declared in fdtrace.schema.tables; writers cast to it",
    3: "--stacks: the events' stack_id column and the stacks, fd_sites and thread_census tables",
    4: "the connections table (TCP connections becoming established: clock offsets between hosts) and the "
       "clock table's adjtimex figures",
    5: "the counters table's fd_errors is other_fd_call_errors (it counts the failed calls of the fd-making "
       "syscalls other than socket and accept, not EMFILE/ENFILE); the go_thread_limit event kind; the samples' "
       "cgroup, unit, container_id, container_runtime and pod_uid",
    6: "the events' cgroup, unit, container_id, container_runtime and pod_uid (each process's, as in samples)",
    7: "the limit_change event kind (setrlimit/prlimit64 of RLIMIT_NOFILE and RLIMIT_NPROC: the syscalls "
       "setrlimit and prlimit64, the events' limit_target, limit_resource, limit_soft and limit_hard); the samples' "
       "go_max_threads is a Go program's own limit read from its memory, go_limit_unread why not; every haproxy's "
       "configuration and the stats sockets it names are read without --haproxy-socket (the haproxy table's source, "
       "nbthread, listeners)",
    8: "memory: the samples' rss_anon_kb, rss_file_kb, rss_shmem_kb and the tightest memory cgroup's "
       "memcg_limit_bytes, memcg_usage_bytes and memcg_oom_kills; the system's mem_total_kb and mem_available_kb; "
       "the thread census's site (the code blocked threads wait in)",
}

#: The column a recording keeps in its folder names (``host=NAME``), never in its part files: the
#: live stream carries it, the Parquet sink leaves it to the folder, and readers give it back.
PARTITION_COLUMN = "host"

_TS = Field("ts_ns", "int64", False, "CLOCK_MONOTONIC nanoseconds of the host that wrote the row")
_TIME = Field("time", "timestamp_utc", False, "UTC wall time of ts_ns (the clock table's offset at the time)")


@dataclass(frozen=True)
class Table:
    """One table: its name, columns in order, and where its rows come from.

    Attributes:
        name: the table's folder in a recording.
        fields: its columns, in order.
        description: one line for docs/recording.md.
        optional: columns written only when asked for (``cmdline``).
    """

    name: str
    fields: tuple[Field, ...]
    description: str
    optional: tuple[str, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """Column names, in order."""
        return tuple(f.name for f in self.fields)

    @property
    def stored_fields(self) -> tuple[Field, ...]:
        """The columns its part files hold (all but the partition column, kept in the folder name)."""
        return tuple(f for f in self.fields if f.name != PARTITION_COLUMN)

    def field(self, name: str) -> Field:
        """One column's declaration."""
        return next(f for f in self.fields if f.name == name)

    def arrow_schema(self, with_optional: tuple[str, ...] | None = None) -> Any:
        """The table as a ``pyarrow.Schema``; ``with_optional``: the optional columns to keep
        (all of them when None)."""
        import pyarrow as pa

        keep = self.optional if with_optional is None else with_optional
        return pa.schema(
            [pa.field(f.name, arrow_type(f.arrow_type), nullable=f.nullable) for f in self.fields
             if f.name not in self.optional or f.name in keep],
            metadata={"fdtrace.schema_version": str(SCHEMA_VERSION), "fdtrace.table": self.name},
        )


EVENTS = Table("events", EVENT_FIELDS, "one row per traced call or event (docs/format.md)")

SAMPLES = Table("samples", (
    _TS,
    Field("pid", "int64", False, "process id"),
    Field("start_ns", "int64", False, "process start, CLOCK_BOOTTIME ns; (pid, start_ns) identifies a process"),
    Field("comm", "string", False, "task name"),
    Field("open_fds", "int64", False, "open file descriptors"),
    Field("fd_soft_limit", "int64", True, "RLIMIT_NOFILE soft limit (null: unlimited)"),
    Field("fd_hard_limit", "int64", True, "RLIMIT_NOFILE hard limit (null: unlimited)"),
    Field("threads", "int64", False, "threads of the process"),
    Field("sockets", "int64", True, "open sockets (null past 10,000 open FDs: not counted)"),
    Field("uid", "int64", True, "real user id"),
    Field("nproc_soft_limit", "int64", True, "RLIMIT_NPROC soft limit, where it applies (not to root)"),
    Field("user_threads", "int64", True, "threads of every process of uid (what RLIMIT_NPROC counts)"),
    Field("pids_current", "int64", True, "tasks in the tightest cgroup pids limit over the process"),
    Field("pids_max", "int64", True, "that cgroup's pids.max"),
    Field("go_max_threads", "int64", True, "a Go program's thread limit, read from its memory (runtime.sched."
          "maxmcount: what debug.SetMaxThreads set), or Go's default 10000 where that cannot be read"),
    Field("go_limit_unread", "dict_string", True, "why a Go program's limit could not be read (its default is shown)"),
    Field("cgroup", "dict_string", True, "its cgroup: v2's path, else v1's systemd (or pids) hierarchy's"),
    Field("unit", "dict_string", True, "its systemd unit (the innermost .service or .scope of the path)"),
    Field("container_id", "dict_string", True, "its container's id (docker, containerd, cri-o, podman)"),
    Field("container_runtime", "dict_string", True, "docker, containerd, cri-o or podman"),
    Field("pod_uid", "dict_string", True, "its Kubernetes pod's UID"),
    Field("rss_anon_kb", "int64", True, "resident anonymous memory, kB (RssAnon: what an OOM kill frees)"),
    Field("rss_file_kb", "int64", True, "resident file-backed memory, kB (RssFile)"),
    Field("rss_shmem_kb", "int64", True, "resident shared memory, kB (RssShmem)"),
    Field("memcg_limit_bytes", "int64", True, "the memory cgroup limit that leaves it the least to spare (its "
          "own or an ancestor's: v2 memory.max, v1 memory.limit_in_bytes; null: none)"),
    Field("memcg_usage_bytes", "int64", True, "that cgroup's usage (memory.current, memory.usage_in_bytes)"),
    Field("memcg_oom_kills", "int64", True, "OOM kills in that cgroup so far (the oom_kill of memory.events "
          "or memory.oom_control)"),
    Field("cmdline", "string", True, "command line (only with record --cmdline: it can hold secrets)"),
    _TIME,
), "per-process FD and thread headroom from /proc, every interval", optional=("cmdline",))

SYSTEM = Table("system", (
    _TS,
    Field("file_nr", "int64", False, "allocated file handles (fs.file-nr)"),
    Field("file_max", "int64", False, "fs.file-max"),
    Field("nr_open", "int64", True, "fs.nr_open, the ceiling of any RLIMIT_NOFILE"),
    Field("threads_max", "int64", True, "kernel.threads-max"),
    Field("threads_total", "int64", True, "threads on the system (what threads-max bounds)"),
    Field("pid_max", "int64", True, "kernel.pid_max"),
    Field("somaxconn", "int64", True, "net.core.somaxconn"),
    Field("listen_overflows", "int64", True, "TcpExt ListenOverflows since boot"),
    Field("listen_drops", "int64", True, "TcpExt ListenDrops since boot"),
    Field("mem_total_kb", "int64", True, "MemTotal of /proc/meminfo, kB"),
    Field("mem_available_kb", "int64", True, "MemAvailable of /proc/meminfo, kB"),
    _TIME,
), "system-wide FD, thread, listen-queue and memory figures, every interval")

LOSSES = Table("losses", (
    _TS,
    *(f for name in STATS for f in (
        Field(name, "int64", True, f"{name}: lost in this interval"),
        Field(f"{name}_total", "int64", True, f"{name}: lost since the start"),
    )),
    _TIME,
), "what the kernel side lost, per interval and in total (schema.STATS)")

COUNTERS_TABLE = Table("counters", (
    _TS,
    Field("pid", "int64", False, "process id"),
    Field("first_ts", "int64", False, "CLOCK_MONOTONIC ns of the process's first counted call"),
    Field("exit_ts", "int64", True, "CLOCK_MONOTONIC ns of its exit (null: alive)"),
    Field("comm", "string", False, "task name"),
    *(Field(name, "int64", False, f"exact count: {name}") for name in COUNTERS),
    Field("errors", "errors_list", False, "failed calls by (syscall, errno)"),
), "exact in-kernel counters per process, cumulative, written when they change")

CLOCK = Table("clock", (
    _TS,
    Field("realtime_offset_ns", "int64", False, "CLOCK_REALTIME - CLOCK_MONOTONIC"),
    Field("boottime_offset_ns", "int64", False, "CLOCK_BOOTTIME - CLOCK_MONOTONIC"),
    Field("synchronized", "bool", True,
          "adjtimex(2): the kernel clock is synchronized (STA_UNSYNC clear, not TIME_ERROR)"),
    Field("est_error_us", "int64", True, "adjtimex(2): estimated error of the clock, microseconds"),
    Field("max_error_us", "int64", True, "adjtimex(2): maximum error of the clock, microseconds"),
    Field("chrony_offset_ns", "int64", True,
          "how far the system clock was ahead of chronyd's sources, from chronyc tracking (null: no chronyd)"),
), "the host's clock offsets and its own view of its clock's quality, every interval")

#: `show info` fields sampled from HAProxy's stats socket: (HAProxy's name, column).
HAPROXY_INFO_FIELDS: tuple[tuple[str, str], ...] = (
    ("Pid", "haproxy_pid"), ("CurrConns", "curr_conns"), ("Maxconn", "maxconn"), ("Ulimit-n", "ulimit_n"),
    ("Maxsock", "maxsock"), ("CumConns", "cum_conns"), ("ConnRate", "conn_rate"),
)

HAPROXY = Table("haproxy", (
    _TS,
    Field("socket", "string", False, "the stats socket's path (source configuration: the configuration's)"),
    Field("error", "string", True, "why the socket did not answer, or the configuration was not read (no figures)"),
    *(Field(column, "int64", True, f"show info: {name}" + (
        " (no answer: the haproxy the socket was asked of)" if column == "haproxy_pid" else ""))
      for name, column in HAPROXY_INFO_FIELDS),
    Field("source", "dict_string", True, "asked (--haproxy-socket), found (a stats socket its configuration names), "
          "or configuration (its maxconn, ulimit-n, nbthread and listeners, and the Maxsock they make)"),
    Field("nbthread", "int64", True, "source configuration: nbthread"),
    Field("listeners", "int64", True, "source configuration: its bind lines"),
    _TIME,
), "HAProxy: `show info` of its stats sockets (--haproxy-socket, or named in its configuration), and what its "
   "configuration demands")

CONNECTIONS = Table("connections", (
    _TS,
    Field("role", "string", False, "client: the SYN-ACK arrived (connect side); server: the final ACK arrived"),
    Field("family", "string", False, "AF_INET or AF_INET6"),
    Field("local_addr", "string", False, "this host's address of the connection"),
    Field("local_port", "int32", False, "this host's port"),
    Field("remote_addr", "string", False, "the other end's address"),
    Field("remote_port", "int32", False, "the other end's port"),
    _TIME,
), "TCP connections (not loopback) becoming established, from sock:inet_sock_set_state: matched between "
   "hosts, they bound the offsets of the hosts' clocks (record)")

PHASES = Table("phases", (
    Field("rank", "int32", True, "global rank"),
    Field("local_rank", "int32", True, "rank on its host"),
    Field("world_size", "int32", True, "ranks in the job"),
    Field("pid", "int32", False, "process id"),
    Field("tid", "int32", True, "thread that marked the phase"),
    Field("step", "int64", True, "training step (optimizer steps so far)"),
    Field("phase", "string", False, "init_process_group, forward, backward, allreduce, optimizer, ..."),
    Field("name", "string", True, "the phase's own name (user phases, process groups, checkpoints)"),
    Field("bucket", "int32", True, "allreduce: the gradient bucket"),
    Field("start_mono_ns", "int64", False, "start, CLOCK_MONOTONIC ns (BPF's clock)"),
    Field("end_mono_ns", "int64", True, "end, CLOCK_MONOTONIC ns"),
    Field("start_wall_ns", "int64", False, "start, wall ns"),
    Field("end_wall_ns", "int64", True, "end, wall ns"),
    Field("source", "string", True, "shim, lightning, huggingface or kineto (null in version 1: shim)"),
    _TIME,
), "training phases per rank (fdtrace run --record)")

STACKS = Table("stacks", (
    _TS,
    Field("stack_id", "int64", False, "the stack's id, as events.stack_id and fd_sites.stack_id name it"),
    Field("pid", "int32", False, "the process whose stack it is (its addresses mean something only there)"),
    Field("comm", "string", False, "its task name when the stack was read"),
    Field("frames", "string_list", False, "innermost first, each 'function+0xoffset [module]'"),
    Field("truncated", "string", True, "why the stack may lack its outer frames (null: it reaches the thread's start)"),
    _TIME,
), "--stacks: user stacks, symbolized while their process lived, each written once")

FD_SITES = Table("fd_sites", (
    _TS,
    Field("pid", "int32", False, "process id"),
    Field("comm", "string", False, "task name"),
    Field("origin", "string", False, "traced: made while fdtrace traced (stack_id says where); before_tracing"),
    Field("stack_id", "int64", True, "the call site that made the descriptors (null: before tracing, or no stack)"),
    Field("open", "int64", False, "descriptors made there that are still open"),
    Field("opened", "int64", True, "descriptors made there since tracing began"),
    Field("closed", "int64", True, "of those, closed since (by close(), dup2 over them, close_range, exec, exit)"),
    Field("oldest_ns", "int64", True, "CLOCK_MONOTONIC ns when the oldest still-open one was made"),
    _TIME,
), "--stacks: open descriptors per process and call site, written when they change")

THREAD_CENSUS = Table("thread_census", (
    _TS,
    Field("pid", "int32", False, "process id"),
    Field("comm", "string", False, "task name"),
    Field("syscall", "string", False, "what its threads are in: a syscall's name, 'running', or 'user' (no syscall)"),
    Field("fd_kind", "string", True, "for a syscall on a descriptor: socket, dns (a UDP socket to port 53), pipe, "
                                     "file, directory, device, anon (eventfd, epoll, ...) or unknown"),
    Field("site", "string", True, "the function of the program they wait in: the first frame outside libc and Go's "
          "syscall plumbing of the stack above each thread's stack pointer; in CPython 3.11 to 3.13, the innermost "
          "Python frame outside the standard library, 'hold_pipe (loader.py:12)'; the C library's DNS lookup "
          "(null: not found, or not blocked)"),
    Field("threads", "int64", False, "threads of the process in that state"),
    _TIME,
), "threads of the processes nearest a thread limit, by the syscall they are blocked in and the code they wait in, "
   "every interval")

#: Every table, in the order of docs/recording.md.
TABLES: dict[str, Table] = {t.name: t for t in (EVENTS, SAMPLES, SYSTEM, LOSSES, COUNTERS_TABLE, CLOCK, HAPROXY,
                                                   CONNECTIONS, PHASES, STACKS, FD_SITES, THREAD_CENSUS)}


#: The fields of a recording's metadata (meta/host=NAME.json) and their JSON types; a reader
#: drops a field of another type (and says so) rather than trusting it.
META_FIELDS: dict[str, tuple[type, ...]] = {
    "schema_version": (int,), "fdtrace_version": (str,), "host": (str,), "kernel": (str,), "boot_id": (str,),
    "probes_attached": (list,), "probes_skipped": (list,), "options": (dict,), "argv": (list,),
    "started": (int, float), "ended": (int, float), "complete": (bool,), "rows": (dict,), "bytes": (int,),
    "rotated_out": (dict,), "unread": (list,),
}


def arrow_schema(table: str = "events") -> Any:
    """A table's ``pyarrow.Schema`` (the events table's by default)."""
    return TABLES[table].arrow_schema()
