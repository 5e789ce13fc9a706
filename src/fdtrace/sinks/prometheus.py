"""A Prometheus /metrics endpoint (prometheus_client): per-process FD and memory headroom under the
names client libraries use, exact call and error counters, OOM kills, the system FD table under
node_exporter's names, and fdtrace's own losses. Label sets are bounded to the top processes, and
the server's threads and connections too, whoever its clients are (``metrics_server``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from fdtrace.advice.change import fd_limit_places
from fdtrace.advice.fixes import thread_limit_places
from fdtrace.advice.haproxy import MAXCONN_PLACE
from fdtrace.advice.memory import MEMORY_PLACES
from fdtrace.errors import FdtraceError
from fdtrace.kernel.counters import CounterStore
from fdtrace.kernel.session import release_descriptors, reserve_descriptors
from fdtrace.pipeline.update import HaproxyRow, SourceInfo, SystemFigures, Update
from fdtrace.policy import FD_EXHAUSTION_ERRNOS
from fdtrace.procfs.thread_limits import binding_limit
from fdtrace.schema.failures import FAILURE_CLASSES, HARM, INCIDENT_CLASSES, failure_class, incident_mask
from fdtrace.schema.metrics import PROCESS_COUNTERS, PROCESS_GAUGES
from fdtrace.schema.records import ProcessSample, ProcessTotals
from fdtrace.sinks.metrics_server import DESCRIPTORS, MetricsServer

#: Where the limit a gauge shows is set, added to its help (``schema.metrics`` declares the rest).
_WHERE_SET = {"process_max_fds": f"; {fd_limit_places()}.",
              "fdtrace_process_memory_cgroup_limit_bytes": f"; set with {MEMORY_PLACES}."}

#: Labels of the per-process gauges: the process, its systemd unit and its container (the id's first
#: 12 characters; empty, so absent, when none). The series are bounded by ``max_processes``.
PROCESS_LABELS = ["pid", "comm", "unit", "container"]

def parse_listen(text: str) -> tuple[str, int]:
    """'127.0.0.1:9877' or ':9877' (loopback) to (address, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise FdtraceError(f"--listen {text!r}: give ADDRESS:PORT, e.g. 127.0.0.1:9877")
    return (host.strip("[]") or "127.0.0.1"), int(port)


@dataclass
class _Snapshot:
    processes: list[ProcessSample] = field(default_factory=list)
    counters: list[ProcessTotals] = field(default_factory=list)
    system: SystemFigures = field(default_factory=dict)
    losses: dict[str, int] = field(default_factory=dict)
    oom_kills: int = 0
    haproxy: list[HaproxyRow] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)


class PrometheusSink:
    """Serves /metrics from the latest update's figures.

    The server starts when the sink is made (so a busy port is an error before anything else
    starts); ``write`` takes each update, ``close`` stops serving. It holds at most
    ``metrics_server.DESCRIPTORS`` descriptors and ``WORKERS`` + 1 threads; connections it
    refused or cut off are counted in ``fdtrace_metrics_connections_refused_total``.

    Args:
        listen: ADDRESS:PORT (loopback by default).
        max_processes: processes with series, the ones with the most open FDs (and, for the
            counters, the most calls): keeps the label sets bounded.
    """

    required = True

    def __init__(self, listen: str = "127.0.0.1:9877", max_processes: int = 50) -> None:
        self.address, self.port = parse_listen(listen)
        self.name = f"metrics on {listen}"
        self.max_processes = max_processes
        self._lock = threading.Lock()
        self._snapshot = _Snapshot()
        self._oom_kills = 0
        self._failures: dict[str, int] = dict.fromkeys(FAILURE_CLASSES, 0)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        try:
            self._server = MetricsServer(self.address, self.port, self.registry)
        except OSError as exc:
            raise FdtraceError(f"cannot serve metrics on {listen}: {exc.strerror or exc}") from None
        self.port = self._server.port  # the one bound, when 0 asked for any
        # its listening socket is open already: the rest is what it will hold besides
        reserve_descriptors(self, self.name, DESCRIPTORS - 1)
        self._serving = True

    def open(self, info: SourceInfo) -> None:
        """Already serving."""

    def write(self, update: Update) -> None:
        self.observe(update.events)
        for sample_round in update.rounds:
            if update.counters is not None:
                self.update(sample_round.samples, sample_round.system or {}, update.counters, update.losses,
                            sample_round.haproxy)

    def observe(self, events: Any) -> None:
        """Count what only the event stream tells (OOM kills, failures by class)."""
        if events.num_rows:
            import pyarrow as pa
            import pyarrow.compute as pc

            self._oom_kills += int(pc.sum(pc.equal(events["kind"].cast("string"), "oom_kill")).as_py() or 0)
            failed = events.filter(incident_mask(events, exits=True))
            if failed.num_rows:
                errno = pc.fill_null(failed["errno"].cast(pa.string()), "")
                full = pc.is_in(errno, value_set=pa.array(sorted(FD_EXHAUSTION_ERRNOS)))
                self._failures["EMFILE/ENFILE"] += int(pc.sum(full).as_py() or 0)
                columns = [c for c in ("kind", "errno", "signal", "exit_code") if c in failed.column_names]
                for row in failed.filter(pc.invert(full)).select(columns).to_pylist():  # ends: few
                    found = failure_class(row)
                    if found is not None:
                        self._failures[found] += 1

    def update(self, samples: list[ProcessSample], system: SystemFigures, counters: CounterStore,
               losses: dict[str, int], haproxy: list[HaproxyRow] | None = None) -> None:
        """Take the latest sampling round and counter reading."""
        top = sorted(samples, key=lambda s: s.open_fds, reverse=True)[: self.max_processes]
        live = sorted(counters.live.values(), key=lambda t: sum(t.counts.values()), reverse=True)
        snapshot = _Snapshot(top, live[: self.max_processes], dict(system), dict(losses), self._oom_kills,
                             list(haproxy or []), dict(self._failures))
        with self._lock:
            self._snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        """Called by prometheus_client on each scrape."""
        with self._lock:
            snap = self._snapshot
        gauges = [GaugeMetricFamily(g.name, g.help + _WHERE_SET.get(g.name, ""), labels=PROCESS_LABELS)
                  for g in PROCESS_GAUGES]
        thread_limit = GaugeMetricFamily(
            "fdtrace_process_thread_limit", "The thread limit that leaves the process the fewest threads to spare "
            f"(Go default, RLIMIT_NPROC, cgroup pids.max); set where each is set: {thread_limit_places()}.",
            labels=[*PROCESS_LABELS, "limit"])
        thread_used = GaugeMetricFamily(
            "fdtrace_process_thread_limit_used", "What that limit counts now (the process's threads, its user's "
            "threads, or its cgroup's tasks).", labels=[*PROCESS_LABELS, "limit"])
        for sample in snap.processes:
            labels = [str(sample.pid), sample.comm, sample.unit or "", (sample.container_id or "")[:12]]
            for gauge, family in zip(PROCESS_GAUGES, gauges, strict=True):
                value = getattr(sample, gauge.column)
                if value is not None:
                    family.add_metric(labels, value * gauge.scale)
            binding = binding_limit(sample)
            if binding is not None:
                thread_limit.add_metric([*labels, binding[0]], binding[2])
                thread_used.add_metric([*labels, binding[0]], binding[1])
        yield from (*gauges, thread_limit, thread_used)
        conns = GaugeMetricFamily("fdtrace_haproxy_curr_conns", "HAProxy's current connections (show info CurrConns).",
                                  labels=["socket"])
        maxconn = GaugeMetricFamily("fdtrace_haproxy_maxconn", "HAProxy's connection limit (show info Maxconn); set "
                                    f"with {MAXCONN_PLACE}.", labels=["socket"])
        for row in snap.haproxy:
            if row.get("source") == "configuration":  # what its configuration demands, not a socket's answer
                continue
            if row.get("curr_conns") is not None:
                conns.add_metric([str(row["socket"])], float(row["curr_conns"] or 0))
            if row.get("maxconn") is not None:
                maxconn.add_metric([str(row["socket"])], float(row["maxconn"] or 0))
        yield from (conns, maxconn)
        for counter in PROCESS_COUNTERS:
            counted = CounterMetricFamily(counter.name, counter.help, labels=["pid", "comm"])
            for totals in snap.counters:
                counted.add_metric([str(totals.pid), totals.comm], totals.counts[counter.column])
            yield counted
        errors = CounterMetricFamily("fdtrace_failed_calls_total", "Failed calls by syscall and errno, per process.",
                                     labels=["pid", "comm", "syscall", "errno"])
        for totals in snap.counters:
            for (syscall, errno), count in sorted(totals.errors.items()):
                errors.add_metric([str(totals.pid), totals.comm, syscall, errno], count)
        yield errors
        yield CounterMetricFamily("fdtrace_oom_kills_total", "OOM kills seen.", value=snap.oom_kills)
        classes = CounterMetricFamily("fdtrace_failures_total", "Failures seen by class, with the class's rank of "
                                      "harm (0 the worst; ended on request and non-zero exits are no incidents).",
                                      labels=["class", "harm", "incident"])
        for name, count in snap.failures.items():
            classes.add_metric([name, str(HARM[name]), "true" if name in INCIDENT_CLASSES else "false"], count)
        yield classes
        if snap.system:
            yield GaugeMetricFamily("node_filefd_allocated", "File descriptor statistics: allocated.",
                                    value=snap.system["file_nr"])
            yield GaugeMetricFamily("node_filefd_maximum", "File descriptor statistics: maximum.",
                                    value=snap.system["file_max"])
            for name, key in (("MemTotal", "mem_total_kb"), ("MemAvailable", "mem_available_kb")):
                if snap.system.get(key) is not None:
                    yield GaugeMetricFamily(f"node_memory_{name}_bytes", f"Memory information field {name}_bytes.",
                                            value=int(snap.system[key] or 0) * 1024)
        lost = CounterMetricFamily("fdtrace_events_lost_total", "Events or counts fdtrace lost, by reason.",
                                   labels=["reason"])
        for reason, count in sorted(snap.losses.items()):
            lost.add_metric([reason], count)
        yield lost
        refused = CounterMetricFamily("fdtrace_metrics_connections_refused", "Connections to this endpoint "
                                      "refused or cut off, by reason (busy, peer: its cap; timeout: a slow "
                                      "request).", labels=["reason"])
        for reason, count in sorted(self._server.refused.items()):
            refused.add_metric([reason], count)
        yield refused

    def close(self, failed: bool = False) -> None:
        """Stop serving (once; closing again does nothing)."""
        if self._serving:
            self._serving = False
            self._server.close()
            release_descriptors(self)
