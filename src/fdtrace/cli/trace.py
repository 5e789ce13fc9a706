"""`fdtrace trace`: events as JSON lines on stdout."""

from __future__ import annotations

import sys

import click

from fdtrace.cli.common import (
    check_trace_options,
    duration_option,
    follow_option,
    live_without_pandas,
    note,
    pid_option,
    placement_options,
    ring_pages_option,
    run,
    stacks_options,
    start,
)


@click.command()
@placement_options
@pid_option
@follow_option
@click.option("--comm", "comms", multiple=True, help="Only tasks with this name (repeatable).")
@click.option("--errors-only", is_flag=True,
              help="Only failures: failed calls (not EAGAIN/EINPROGRESS), EMFILE/ENFILE, OOM kills, "
                   "abnormal exits. Cheaper: failed close() calls then carry no fd.")
@duration_option
@click.option("--totals", "totals_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="At the end, write exact per-process counts as JSON to this file.")
@click.option("--shared", is_flag=True, help="Make the --totals file readable by everyone (default: owner only).")
@click.option("--json", "as_json", is_flag=True,
              help="JSON lines (the default when stdout is not a terminal); else one aligned line per event.")
@click.option("-s", "--summary", "per_process", is_flag=True,
              help="At the end, a table of each process's exact counts and failures (on stderr with --json).")
@ring_pages_option
@stacks_options
def trace(pids: tuple[int, ...], follow: bool, comms: tuple[str, ...], errors_only: bool, duration: float | None,
          totals_path: str | None, shared: bool, as_json: bool, per_process: bool, ring_pages: int,
        stacks: bool, max_stacks: int, max_fds: int) -> None:
    """Stream events until Ctrl-C, SIGTERM or --duration: one aligned line per event on a
    terminal, JSON lines when piped or with --json.

    A summary line of counts and losses goes to stderr at the end.
    """
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.pipeline import Pipeline, Sink, Stop
    from fdtrace.sinks.jsonl import JsonLinesSink, TotalsSink
    from fdtrace.sinks.text import ProcessSummarySink, TextLinesSink
    from fdtrace.sources.live import LiveOptions, LiveSource

    check_trace_options(pids, follow, ring_pages, max_stacks, max_fds)
    live_without_pandas()
    stop = Stop(duration)
    json_lines = as_json or not sys.stdout.isatty()
    output: JsonLinesSink | TextLinesSink = JsonLinesSink(sys.stdout) if json_lines else TextLinesSink(sys.stdout)
    sinks: list[Sink] = [output]
    if totals_path is not None:
        sinks.append(TotalsSink(totals_path, comms, shared=shared))
    if per_process:
        sinks.append(ProcessSummarySink(sys.stderr if json_lines else sys.stdout, comms))
    source = LiveSource(LiveOptions(exiting=True,
        trace=TraceOptions(pids=pids, follow=follow, errors_only=errors_only, ring_pages=ring_pages,
            stacks=stacks, max_stacks=max_stacks, max_fds=max_fds),
        comms=comms, sample=False, keep_exited=100_000 if totals_path or per_process else 0))
    pipeline = Pipeline(source, sinks)
    start(pipeline)
    note(f"tracing ({len(source.kernel.probes)} probes attached); Ctrl-C to stop")
    try:
        run(pipeline, stop)
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (| head): end quietly
        sys.exit(0)
    note(output.summary())
