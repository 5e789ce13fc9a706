"""`fdtrace record`: a Parquet recording, headless."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fdtrace.cli.common import (
    check_trace_options,
    duration_option,
    fail,
    follow_option,
    live_without_pandas,
    note,
    parse_size,
    pid_option,
    placement_options,
    ring_pages_option,
    run,
    stacks_options,
    start,
)
from fdtrace.errors import FdtraceError


@click.command()
@placement_options
@click.option("-o", "--output", "output", required=True, type=click.Path(file_okay=False),
              help="Recording directory (created; several hosts may share one).")
@duration_option
@pid_option
@follow_option
@click.option("--comm", "comms", multiple=True,
              help="Only events of tasks with this name (repeatable); /proc samples still cover the host's "
                   "fullest processes (--top), the postmortem's context.")
@click.option("--errors-only", is_flag=True, help="Record only failure events (counters stay complete).")
@click.option("--interval", type=float, default=1.0, show_default=True,
              help="Seconds between samples and flushes to disk (what a crash can lose).")
@click.option("--top", "top_processes", type=int, default=20, show_default=True,
              help="Also sample this many processes with the most open FDs.")
@click.option("--cmdline", is_flag=True, help="Record command lines in samples (they can hold secrets).")
@click.option("--shared", is_flag=True, help="Make the files readable by everyone (default: owner only).")
@click.option("--rotate", type=float, default=None,
              help="Every this many seconds, merge the per-interval files into one (fewer files).")
@click.option("--max-size", "max_size", default=None,
              help="Keep the recording under this size (e.g. 500M, 2G) by deleting its oldest files; "
                   "what is deleted is counted in the metadata. Incident windows are kept apart (--keep-incidents).")
@click.option("--keep-incidents", default=None, metavar="SIZE",
              help="With --max-size: bytes, besides --max-size, for the files around each EMFILE/ENFILE, OOM kill, "
                   "Go thread limit and crash, which the ring does not delete (default: half of --max-size). "
                   "Shared out: root's and system services' programs before other users', each program's first "
                   "window before its latest before the others, the seconds with the failures before the wider "
                   "time; windows are trimmed before any is given up, and both are counted in the metadata.")
@click.option("--keep-before", type=float, default=60.0, show_default=True,
              help="With --max-size: seconds before an incident that its window keeps, as --keep-incidents "
                   "allows (the default and --keep-after hold 90 s of 1 M events/s in the service's 1G).")
@click.option("--keep-after", type=float, default=30.0, show_default=True,
              help="With --max-size: seconds after an incident that its window keeps.")
@click.option("--resume", is_flag=True,
              help="Continue this host's recording already in the directory (a service's restart) instead of "
                   "refusing it: its files, counts and incident windows are kept.")
@click.option("--listen", default=None, help="Also serve Prometheus /metrics on ADDRESS:PORT.")
@click.option("--haproxy-socket", "haproxy_sockets", multiple=True,
              help="Sample HAProxy's `show info` from this stats socket every interval (repeatable).")
@click.option("--no-connections", is_flag=True,
              help="Do not record the TCP connections this host makes with others (they put the hosts of a "
                   "fleet on one clock).")
@ring_pages_option
@stacks_options
def record(output: str, duration: float | None, pids: tuple[int, ...], follow: bool, comms: tuple[str, ...],
           errors_only: bool, interval: float, top_processes: int, cmdline: bool, shared: bool,
           rotate: float | None, max_size: str | None, keep_incidents: str | None, keep_before: float,
           keep_after: float, resume: bool, listen: str | None, haproxy_sockets: tuple[str, ...],
           no_connections: bool, ring_pages: int, stacks: bool, max_stacks: int, max_fds: int) -> None:
    """Record events, FD headroom samples, exact counters and losses to Parquet, headless.

    Runs until --duration, SIGINT or SIGTERM; every file on disk is complete at any moment.
    """
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.pipeline import Pipeline, Sink, Stop
    from fdtrace.sinks.parquet import ParquetSink
    from fdtrace.sources.live import LiveOptions, LiveSource

    check_trace_options(pids, follow, ring_pages, max_stacks, max_fds)
    live_without_pandas()
    if rotate is not None and rotate < interval:
        fail(FdtraceError("--rotate must be at least --interval"))
    max_bytes = kept_bytes = None
    if max_size is not None:
        try:
            max_bytes = parse_size(max_size)
        except ValueError as exc:
            fail(FdtraceError(f"--max-size: {exc}"))
    if keep_incidents is not None:
        if max_bytes is None:
            fail(FdtraceError("--keep-incidents keeps incidents of a --max-size ring: give --max-size too"))
        try:
            kept_bytes = parse_size(keep_incidents)
        except ValueError as exc:
            fail(FdtraceError(f"--keep-incidents: {exc}"))
    if keep_before < 0 or keep_after < 0:
        fail(FdtraceError("--keep-before and --keep-after must not be negative"))
    stop = Stop(duration)
    try:
        recording = ParquetSink(Path(output), sys.argv, shared=shared, max_size=max_bytes, rotate_s=rotate,
                                keep_incidents=kept_bytes, keep_before_s=keep_before, keep_after_s=keep_after,
                                resume=resume)
    except FdtraceError as error:
        fail(error)
    sinks: list[Sink] = [recording]
    if listen is not None:
        from fdtrace.sinks.prometheus import PrometheusSink

        try:
            sinks.append(PrometheusSink(listen))
        except FdtraceError as error:
            fail(error)
    # Exited processes' final counters are written once, as they exit: none are kept in memory.
    source = LiveSource(LiveOptions(exiting=True, keep_exited=0,
        trace=TraceOptions(pids=pids, follow=follow, errors_only=errors_only, ring_pages=ring_pages,
            stacks=stacks, max_stacks=max_stacks, max_fds=max_fds, connections=not no_connections),
        comms=comms, interval_s=interval, top_processes=top_processes, cmdline=cmdline,
        haproxy_sockets=haproxy_sockets))
    pipeline = Pipeline(source, sinks)
    start(pipeline)
    note(f"recording to {output} ({len(source.kernel.probes)} probes attached); Ctrl-C to stop")
    final = run(pipeline, stop)
    watched = sum(probe.startswith("uprobe:runtime.gwrite") for probe in source.kernel.probes)
    skipped = source.sampler.describe_skipped()
    unread = source.shortfalls()
    note(f"recorded {recording.events} events, {recording.bytes_written} bytes; lost {sum(final.losses.values())} "
         "in the kernel"
         + (f"; {recording.rotated_note}" if recording.rotated_note else "")
         + (f"; {watched} Go binar{'y' if watched == 1 else 'ies'} watched for its thread-limit message"
            if watched else "")
         + (f"; samples skipped: {skipped}" if skipped else "")
         + (f"; left unread: {'; '.join(unread)}" if unread else "")
         + (f"; {recording.incident_note}" if recording.incident_note else ""))
