"""The fleet as a Prometheus server sees it: every host's fdtrace metrics (``fdtrace export`` or
``fdtrace record --listen`` on each host, scraped by the server), read through Prometheus's HTTP
API with instant queries, and ranked: hosts with EMFILE/ENFILE, OOM kills or a Go thread limit
first, then by the least headroom left to any of their processes."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from fdtrace.errors import FdtraceError

#: The most a query's answer may be (a fleet's process series are bounded by each exporter's --top).
MAX_ANSWER_BYTES = 32 << 20
#: Seconds a query may take.
QUERY_TIMEOUT_S = 10.0
FAILURES = 'fdtrace_failed_calls_total{errno=~"EMFILE|ENFILE"}'


@dataclass
class ProcessRow:
    """One process of a host, as its exporter last said."""

    pid: int
    comm: str
    open_fds: float | None = None
    fd_soft_limit: float | None = None
    emfile_recent: float = 0.0  # EMFILE/ENFILE in the window
    threads: float | None = None
    thread_limit_kind: str | None = None
    thread_limit: float | None = None
    thread_used: float | None = None

    @property
    def fd_usage(self) -> float | None:
        """Open FDs over the soft limit."""
        if self.open_fds is None or not self.fd_soft_limit:
            return None
        return self.open_fds / self.fd_soft_limit

    @property
    def thread_usage(self) -> float | None:
        """What the binding thread limit counts, over that limit."""
        if self.thread_used is None or not self.thread_limit:
            return None
        return self.thread_used / self.thread_limit


@dataclass
class HostRow:
    """One host of the fleet."""

    host: str
    up: bool = True
    processes: dict[int, ProcessRow] = field(default_factory=dict)
    oom_kills_recent: float = 0.0
    lost_recent: float = 0.0

    @property
    def emfile_recent(self) -> float:
        """EMFILE/ENFILE of all its processes in the window."""
        return sum(p.emfile_recent for p in self.processes.values())

    def fullest(self) -> ProcessRow | None:
        """The process nearest its FD limit."""
        known = [p for p in self.processes.values() if p.fd_usage is not None]
        return max(known, key=lambda p: (p.fd_usage or 0.0, -p.pid), default=None)

    def nearest_thread_limit(self) -> ProcessRow | None:
        """The process nearest a thread limit."""
        known = [p for p in self.processes.values() if p.thread_usage is not None]
        return max(known, key=lambda p: (p.thread_usage or 0.0, -p.pid), default=None)

    def headroom(self) -> float:
        """The largest share of a limit any of its processes uses (FDs or threads)."""
        shares = [s for p in self.processes.values() for s in (p.fd_usage, p.thread_usage) if s is not None]
        return max(shares, default=0.0)

    def rank_key(self) -> tuple[Any, ...]:
        """Worst first: failing (EMFILE/ENFILE, OOM kills), down, then the least headroom."""
        failing = self.emfile_recent > 0 or self.oom_kills_recent > 0
        return (not failing, self.up, -self.headroom(), self.host)


class PrometheusFleet:
    """Reads the fleet from a Prometheus server.

    Args:
        url: the server, e.g. http://prometheus:9090 (its HTTP API is under /api/v1).
        host_label: the label that names a host in the fdtrace series (``instance`` unless the
            scrape configuration sets another).
        window: how far back "recent" failures, OOM kills and losses are counted (PromQL duration).
        job: the scrape job of the fdtrace exporters (its ``up`` says which hosts are down).
    """

    def __init__(self, url: str, host_label: str = "instance", window: str = "5m", job: str = "fdtrace") -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise FdtraceError(f"--prometheus {url!r}: give the server's URL, e.g. http://127.0.0.1:9090")
        if not host_label.replace("_", "").isalnum():
            raise FdtraceError(f"--host-label {host_label!r}: not a Prometheus label name")
        if not window[:-1].isdigit() or window[-1] not in "smhd":
            raise FdtraceError(f"--window {window!r}: give a duration such as 5m")
        if not job or '"' in job or "\\" in job:
            raise FdtraceError(f"--job {job!r}: not a job name")
        self.job = job
        self.url = url.rstrip("/")
        self.host_label = host_label
        self.window = window
        self.error: str | None = None  # why the last poll failed (the hosts of the one before are kept)
        self.hosts: dict[str, HostRow] = {}

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's vector; FdtraceError with Prometheus's own reason when it fails."""
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        try:
            with urllib.request.urlopen(address, timeout=QUERY_TIMEOUT_S) as answer:  # noqa: S310 (http(s) only)
                body = answer.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            body = exc.read(64 << 10)
            raise FdtraceError(f"Prometheus at {self.url} refused a query ({exc.code}: {_reason(body)})") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise FdtraceError(f"Prometheus at {self.url} did not answer ({reason})") from None
        if len(body) > MAX_ANSWER_BYTES:
            raise FdtraceError(f"Prometheus at {self.url}: an answer over {MAX_ANSWER_BYTES >> 20} MiB")
        try:
            data = json.loads(body)
        except ValueError:
            raise FdtraceError(f"Prometheus at {self.url}: the answer is not JSON") from None
        if not isinstance(data, dict) or data.get("status") != "success":
            raise FdtraceError(f"Prometheus at {self.url}: {_reason(body)}")
        result = data.get("data", {}).get("result", [])
        return [r for r in result if isinstance(r, dict) and isinstance(r.get("metric"), dict)]

    def poll(self) -> dict[str, HostRow]:
        """Read every host now; on failure keep the last hosts and say why in ``error``."""
        try:
            self.hosts = self._read()
            self.error = None
        except FdtraceError as exc:
            self.error = str(exc)
        return self.hosts

    def _read(self) -> dict[str, HostRow]:
        by = self.host_label
        hosts: dict[str, HostRow] = {}

        def host_of(metric: dict[str, Any]) -> HostRow | None:
            name = metric.get(by)
            if not isinstance(name, str):
                return None
            return hosts.setdefault(name, HostRow(name))

        def process_of(metric: dict[str, Any]) -> ProcessRow | None:
            host = host_of(metric)
            pid = str(metric.get("pid", ""))
            if host is None or not pid.isdigit():
                return None
            return host.processes.setdefault(int(pid), ProcessRow(int(pid), str(metric.get("comm", ""))))

        for series in self.query(f'max by ({by}) (up{{job="{self.job}"}})'):
            host = host_of(series["metric"])
            if host is not None:
                host.up = _value(series) == 1
        for metric_name, attribute in (("process_open_fds", "open_fds"), ("process_max_fds", "fd_soft_limit"),
                                       ("fdtrace_process_threads", "threads")):
            for series in self.query(f"max by ({by}, pid, comm) ({metric_name})"):
                process = process_of(series["metric"])
                if process is not None:
                    setattr(process, attribute, _value(series))
        for series in self.query(f"sum by ({by}, pid, comm) (increase({FAILURES}[{self.window}]))"):
            process = process_of(series["metric"])
            if process is not None:
                process.emfile_recent = _value(series) or 0.0
        for metric_name, attribute in (("fdtrace_process_thread_limit", "thread_limit"),
                                       ("fdtrace_process_thread_limit_used", "thread_used")):
            for series in self.query(f"max by ({by}, pid, comm, limit) ({metric_name})"):
                process = process_of(series["metric"])
                if process is not None:
                    setattr(process, attribute, _value(series))
                    process.thread_limit_kind = str(series["metric"].get("limit", "")) or None
        for series in self.query(f"sum by ({by}) (increase(fdtrace_oom_kills_total[{self.window}]))"):
            host = host_of(series["metric"])
            if host is not None:
                host.oom_kills_recent = _value(series) or 0.0
        for series in self.query(f"sum by ({by}) (increase(fdtrace_events_lost_total[{self.window}]))"):
            host = host_of(series["metric"])
            if host is not None:
                host.lost_recent = _value(series) or 0.0
        return hosts

    def ranked(self) -> list[HostRow]:
        """The hosts, worst first."""
        return sorted(self.hosts.values(), key=HostRow.rank_key)


def _value(series: dict[str, Any]) -> float | None:
    try:
        value = float(series["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _reason(body: bytes) -> str:
    try:
        data = json.loads(body)
        return str(data.get("error") or data.get("status"))[:200]
    except ValueError:
        return " ".join(body[:200].decode("utf-8", "replace").split())
