"""The Prometheus metrics fdtrace serves, declared once from the schema's columns: each per-process
gauge names the ``samples`` column it reads (or a figure made of them, ``rss_kb``) and each
counter the ``counters`` column; the exporter (``sinks.prometheus``) generates its families
from these, and a test holds every declaration to a declared column. Names follow what client
libraries (``process_*``) and node_exporter (``node_*``) call the same figures, so dashboards
made for them read fdtrace's too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessGauge:
    """A per-process gauge read from one sampling round.

    Attributes:
        name: the metric's name.
        column: the ``samples`` column (or ``ProcessSample`` figure) it reads; a process without a
            value there has no series.
        help: its help text (where a limit is set, the exporter adds).
        scale: the column's unit in the metric's (1024: kB to bytes).
    """

    name: str
    column: str
    help: str
    scale: int = 1


PROCESS_GAUGES: tuple[ProcessGauge, ...] = (
    ProcessGauge("process_open_fds", "open_fds", "Number of open file descriptors."),
    ProcessGauge("process_max_fds", "fd_soft_limit", "Maximum number of open file descriptors (soft limit)"),
    ProcessGauge("fdtrace_process_threads", "threads", "Threads of the process."),
    ProcessGauge("process_resident_memory_bytes", "rss_kb", "Resident memory size in bytes.", 1024),
    ProcessGauge("fdtrace_process_memory_cgroup_limit_bytes", "memcg_limit_bytes",
                 "The memory cgroup limit that leaves the process the least to spare (its own cgroup's or an "
                 "ancestor's)"),
    ProcessGauge("fdtrace_process_memory_cgroup_usage_bytes", "memcg_usage_bytes",
                 "That cgroup's memory usage (memory.current, memory.usage_in_bytes)."),
)


@dataclass(frozen=True)
class ProcessCounter:
    """An exact in-kernel counter per process (a ``counters`` column, ``schema.COUNTERS``)."""

    name: str
    column: str
    counts: str

    @property
    def help(self) -> str:
        """Its help text."""
        return f"Exact count of {self.counts}, per process."


PROCESS_COUNTERS: tuple[ProcessCounter, ...] = (
    ProcessCounter("fdtrace_sockets_total", "sockets", "socket() calls"),
    ProcessCounter("fdtrace_accepts_total", "accepts", "accept() and accept4() calls"),
    ProcessCounter("fdtrace_connects_total", "connects", "connect() calls"),
    ProcessCounter("fdtrace_closes_total", "closes", "close() calls"),
    ProcessCounter("fdtrace_threads_started_total", "threads_started", "threads started"),
)
