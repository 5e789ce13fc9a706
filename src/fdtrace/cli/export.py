"""`fdtrace export`: Prometheus metrics."""

from __future__ import annotations

import click

from fdtrace.cli.common import (
    check_trace_options,
    duration_option,
    fail,
    follow_option,
    live_without_pandas,
    note,
    pid_option,
    placement_options,
    run,
    start,
)
from fdtrace.errors import FdtraceError


@click.command()
@placement_options
@click.option("--listen", default="127.0.0.1:9877", show_default=True,
              help="ADDRESS:PORT to serve /metrics on (loopback by default).")
@pid_option
@follow_option
@click.option("--top", "top_processes", type=int, default=50, show_default=True,
              help="Processes with series: the ones with the most open FDs (bounds the label sets).")
@click.option("--haproxy-socket", "haproxy_sockets", multiple=True,
              help="Also export HAProxy's current connections and maxconn from this stats socket (repeatable).")
@click.option("--rules", "print_rules", is_flag=True,
              help="Print fdtrace's Prometheus alerting rules (YAML for rule_files:) and exit.")
@click.option("--dashboard", "print_dashboard", is_flag=True,
              help="Print fdtrace's Grafana dashboard (JSON to import) and exit.")
@duration_option
def export(listen: str, pids: tuple[int, ...], follow: bool, top_processes: int, haproxy_sockets: tuple[str, ...],
           print_rules: bool, print_dashboard: bool, duration: float | None) -> None:
    """Serve Prometheus metrics: process_open_fds / process_max_fds per process, exact counters of
    sockets, accepts, connects, closes, FD errors and threads, thread limits, HAProxy's
    connections, OOM kills, file-nr and losses. --rules and --dashboard print the alerting rules
    and the Grafana dashboard made for these metrics."""
    if print_rules or print_dashboard:
        from importlib import resources

        name = "fdtrace-alerts.yml" if print_rules else "fdtrace-dashboard.json"
        click.echo((resources.files("fdtrace") / "data" / name).read_text(), nl=False)
        return
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.pipeline import Pipeline, Stop
    from fdtrace.sinks.prometheus import PrometheusSink
    from fdtrace.sources.live import LiveOptions, LiveSource

    check_trace_options(pids, follow, 4096)
    live_without_pandas()
    stop = Stop(duration)
    try:
        exporter = PrometheusSink(listen, max_processes=top_processes)
    except FdtraceError as error:
        fail(error)
    source = LiveSource(LiveOptions(exiting=True, trace=TraceOptions(pids=pids, follow=follow, errors_only=True),
                                    top_processes=top_processes, keep_exited=0, haproxy_sockets=haproxy_sockets))
    pipeline = Pipeline(source, [exporter], poll_interval_s=0.1)
    start(pipeline)
    note(f"serving metrics on http://{exporter.address}:{exporter.port}/metrics")
    run(pipeline, stop)
