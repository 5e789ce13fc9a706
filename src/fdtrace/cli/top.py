"""`fdtrace top` (the live view) and `fdtrace replay` (a recording in the same view)."""

from __future__ import annotations

from pathlib import Path

import click

from fdtrace.cli.common import (
    DrawnOn,
    check_trace_options,
    end_now,
    fail,
    follow_option,
    live_without_pandas,
    note,
    pid_option,
    placement_options,
    ring_pages_option,
    stacks_options,
    start_live,
    view_terminal,
)
from fdtrace.errors import FdtraceError


@click.command()
@placement_options
@pid_option
@follow_option
@click.option("--top", "top_processes", type=int, default=30, show_default=True,
              help="Sample this many processes with the most open FDs (besides those with events).")
@click.option("--record-dir", type=click.Path(file_okay=False), default=None,
              help="Where the R key records (default: ./fdtrace-DATE-TIME).")
@click.option("--haproxy-socket", "haproxy_sockets", multiple=True,
              help="Show HAProxy's `show info` from this stats socket every second (repeatable).")
@click.option("--comm", "comms", multiple=True,
              help="Only processes with this task name, in the table and the log (repeatable).")
@click.option("--keep-exited", type=float, default=300.0, show_default=True,
              help="Seconds a process that ended stays in the table (and one not seen, without alerts).")
@click.option("--prometheus", "prometheus_url", default=None, metavar="URL",
              help="The fleet instead of this host: every host's fdtrace metrics from this Prometheus server, "
                   "hosts ranked by failures and least headroom (Enter opens one). Needs no root.")
@click.option("--host-label", default="instance", show_default=True,
              help="With --prometheus: the label that names a host.")
@click.option("--job", "prometheus_job", default="fdtrace", show_default=True,
              help="With --prometheus: the scrape job of the fdtrace exporters.")
@click.option("--window", default="5m", show_default=True,
              help="With --prometheus: how far back failures, OOM kills and losses are counted.")
@ring_pages_option
@stacks_options
def top(pids: tuple[int, ...], follow: bool, top_processes: int, record_dir: str | None,
        haproxy_sockets: tuple[str, ...], comms: tuple[str, ...], keep_exited: float, prometheus_url: str | None,
        host_label: str, prometheus_job: str, window: str, ring_pages: int, stacks: bool, max_stacks: int,
        max_fds: int) -> None:
    """The live view: processes by FD headroom, errors, OOM kills and threads, as they happen
    (with --prometheus: the fleet's hosts)."""
    if prometheus_url is not None:
        from fdtrace.sources.prometheus_fleet import PrometheusFleet

        try:
            fleet = PrometheusFleet(prometheus_url, host_label=host_label, window=window, job=prometheus_job)
        except FdtraceError as error:
            fail(error)
        from fdtrace.tui.fleet import FleetApp

        with DrawnOn(view_terminal()):
            FleetApp(fleet).run()
        return
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.kernel.session import reserve_descriptors
    from fdtrace.recording.writer import RecordingWriter
    from fdtrace.sources.live import LiveOptions, LiveSource

    check_trace_options(pids, follow, ring_pages, max_stacks, max_fds)
    live_without_pandas()
    terminal = view_terminal()  # before the probes load: a view with no terminal says so at once
    source = LiveSource(LiveOptions(exiting=True, trace=TraceOptions(pids=pids, follow=follow, ring_pages=ring_pages,
            stacks=stacks, max_stacks=max_stacks, max_fds=max_fds),
                                    top_processes=top_processes, haproxy_sockets=haproxy_sockets,
                                    live_phases=True, keep_exited=0, comms=comms, samples_of_comms_only=True,
                                    failures_first=True))
    # the R key records: its writer's descriptors are counted before the probes attach
    reserve_descriptors(source, "the R key's recording", RecordingWriter.DESCRIPTORS)
    start_live(source)
    from fdtrace.pipeline import Pipeline
    from fdtrace.sinks.recorder import LiveControls
    from fdtrace.tui.app import make_app

    pipeline = Pipeline(source, source_started=True)
    controls = LiveControls(pipeline, Path(record_dir) if record_dir else None)
    with DrawnOn(terminal):
        app = make_app(pipeline, controls, keep_exited_s=keep_exited)
        app.run()
    for text in source.notes:
        note(text)
    end_now(app.return_code or 0)


@click.command()
@click.argument("directories", nargs=-1, required=True, type=click.Path())
@click.option("--speed", type=float, default=1.0, show_default=True, help="Replay speed (2 = twice real time).")
def replay(directories: tuple[str, ...], speed: float) -> None:
    """Replay recordings in the live view: play, pause, faster/slower, jump from incident to incident (n/N)."""
    from fdtrace.pipeline import Pipeline
    from fdtrace.sources.replay import ReplayControls, ReplaySource

    if speed <= 0:
        fail(FdtraceError("--speed must be positive"))
    try:
        source = ReplaySource(list(directories), speed=speed)
    except FdtraceError as error:
        fail(error)
    from fdtrace.tui.app import make_app

    pipeline = Pipeline(source, source_started=True)
    with DrawnOn(view_terminal()):
        make_app(pipeline, ReplayControls(pipeline, source)).run()
    for skipped in source.skipped:
        note(f"skipped an unreadable file: {skipped}")
