"""The ``fdtrace`` command line."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from types import FrameType
from typing import Any

import click

from fdtrace import __version__
from fdtrace.errors import FdtraceError


def _fail(error: FdtraceError) -> None:
    click.echo(f"fdtrace: error: {error}", err=True)
    sys.exit(error.exit_code)


class _StopFlag:
    """Set by SIGTERM (and SIGINT) so the main loop ends cleanly."""

    def __init__(self) -> None:
        self.stopped = False
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        self.stopped = True


def parse_size(text: str) -> int:
    """Bytes from a size such as 4096, 500K, 500M or 2G (powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = text.strip().upper().rstrip("IB"), ""
    if number and number[-1] in units:
        number, unit = number[:-1], number[-1]
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use e.g. 500M or 2G)") from None
    if value <= 0:
        raise ValueError(f"not a positive size: {text!r}")
    return int(value * units[unit])


def _start_source(options: Any, keep_exited: int = 100_000, echo_notes: bool = True) -> Any:
    """Check the options, attach the probes and say what the user should know; any problem is
    one line and an exit."""
    from fdtrace.sources.live_bpf import LiveBpfSource

    if options.ring_pages < 1 or options.ring_pages & (options.ring_pages - 1):
        _fail(FdtraceError("--ring-pages must be a power of two"))
    if options.follow and not options.pids:
        _fail(FdtraceError("--follow follows the processes of --pid: give at least one"))
    source = LiveBpfSource(options, keep_exited=keep_exited)
    try:
        source.start()
    except FdtraceError as error:
        source.stop()
        _fail(error)
    if echo_notes:
        for note in source.notes:
            click.echo(f"fdtrace: {note}", err=True)
    return source


def _count_values(column: object) -> dict[str, int]:
    import pyarrow.compute as pc

    return {str(item["values"]): int(item["counts"]) for item in pc.value_counts(column).to_pylist()}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fdtrace")
def main() -> None:
    """Trace sockets, FD exhaustion (EMFILE/ENFILE), threads and OOM kills with eBPF."""


@main.command()
@click.option("--pid", "pids", type=int, multiple=True, help="Only these processes (repeatable).")
@click.option("-f", "--follow", is_flag=True,
              help="With --pid: also the processes they start from now on, and theirs (a job's workers).")
@click.option("--comm", "comms", multiple=True, help="Only tasks with this name (repeatable).")
@click.option("--errors-only", is_flag=True,
              help="Only failures: failed calls (not EAGAIN/EINPROGRESS), EMFILE/ENFILE, OOM kills, "
                   "abnormal exits. Cheaper: failed close() calls then carry no fd.")
@click.option("--duration", type=float, default=None, help="Stop after this many seconds.")
@click.option("--totals", "totals_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="At the end, write exact per-process counts as JSON to this file.")
@click.option("--ring-pages", type=int, default=4096, show_default=True,
              help="Ring buffer size in pages (a power of two).")
def trace(
    pids: tuple[int, ...],
    follow: bool,
    comms: tuple[str, ...],
    errors_only: bool,
    duration: float | None,
    totals_path: str | None,
    ring_pages: int,
) -> None:
    """Stream events as JSON lines on stdout until Ctrl-C, SIGTERM or --duration.

    A summary line of counts and losses goes to stderr at the end.
    """
    from fdtrace.bpf.loader import TraceOptions
    from fdtrace.sinks.jsonl import JsonLinesSink
    from fdtrace.sources.base import keep_comms

    stop = _StopFlag()
    source = _start_source(TraceOptions(pids=pids, follow=follow, errors_only=errors_only, ring_pages=ring_pages),
                           keep_exited=100_000 if totals_path else 0)
    click.echo(f"fdtrace: tracing ({len(source.probes)} probes attached); Ctrl-C to stop", err=True)
    next_counters = time.monotonic() + 1.0

    sink = JsonLinesSink(sys.stdout)
    kinds: Counter[str] = Counter()
    losses: dict[str, int] = {}
    end = time.monotonic() + duration if duration is not None else None
    try:
        while True:
            last = stop.stopped or (end is not None and time.monotonic() >= end)
            batch = source.poll()
            losses = batch.losses
            events = keep_comms(batch.events, comms)
            if events.num_rows:
                kinds.update(_count_values(events["kind"]))
                sink.write(events)
            if time.monotonic() >= next_counters:
                source.read_counters()
                next_counters = time.monotonic() + 1.0
            if last:
                losses = source.read_losses()
                break
            time.sleep(0.01)
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (| head): end quietly
        sys.exit(0)
    finally:
        if totals_path is not None and source.started:
            totals = [t.as_dict() for t in source.read_counters().all() if not comms or t.comm in comms]
            with open(totals_path, "w") as out:
                json.dump(totals, out)
        source.stop()

    counted = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"
    lost = sum(losses.values())
    detail = ", ".join(f"{k} {v}" for k, v in losses.items() if v)
    click.echo(
        f"fdtrace: {sum(kinds.values())} events ({counted}); lost {lost}" + (f" ({detail})" if detail else ""),
        err=True,
    )


@main.command()
@click.option("-o", "--output", "output", required=True, type=click.Path(file_okay=False),
              help="Recording directory (created; several hosts may share one).")
@click.option("--duration", type=float, default=None, help="Stop after this many seconds.")
@click.option("--pid", "pids", type=int, multiple=True, help="Only these processes (repeatable).")
@click.option("-f", "--follow", is_flag=True,
              help="With --pid: also the processes they start from now on, and theirs (a job's workers).")
@click.option("--comm", "comms", multiple=True, help="Only events of tasks with this name (repeatable).")
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
                   "what is deleted is counted in the metadata.")
@click.option("--listen", default=None, help="Also serve Prometheus /metrics on ADDRESS:PORT.")
@click.option("--haproxy-socket", "haproxy_sockets", multiple=True,
              help="Sample HAProxy's `show info` from this stats socket every interval (repeatable).")
@click.option("--ring-pages", type=int, default=4096, show_default=True,
              help="Ring buffer size in pages (a power of two).")
def record(output: str, duration: float | None, pids: tuple[int, ...], follow: bool, comms: tuple[str, ...],
           errors_only: bool,
           interval: float, top_processes: int, cmdline: bool, shared: bool, rotate: float | None,
           max_size: str | None, listen: str | None, haproxy_sockets: tuple[str, ...], ring_pages: int) -> None:
    """Record events, FD headroom samples, exact counters and losses to Parquet, headless.

    Runs until --duration, SIGINT or SIGTERM; every file on disk is complete at any moment.
    """
    from pathlib import Path

    from fdtrace.bpf.loader import TraceOptions
    from fdtrace.recorder import Recorder, RecordOptions, run_metadata
    from fdtrace.sampler import ProcSampler
    from fdtrace.sinks.parquet import RecordingWriter

    if rotate is not None and rotate < interval:
        _fail(FdtraceError("--rotate must be at least --interval"))
    max_bytes = None
    if max_size is not None:
        try:
            max_bytes = parse_size(max_size)
        except ValueError as exc:
            _fail(FdtraceError(f"--max-size: {exc}"))
    stop = _StopFlag()
    source = _start_source(TraceOptions(pids=pids, follow=follow, errors_only=errors_only, ring_pages=ring_pages))
    try:
        writer = RecordingWriter(Path(output), source.host, run_metadata(source, sys.argv), shared=shared,
                                 max_size=max_bytes)
    except FdtraceError as error:
        source.stop()
        _fail(error)
    click.echo(f"fdtrace: recording to {output} ({len(source.probes)} probes attached); Ctrl-C to stop", err=True)
    exporter = None
    if listen is not None:
        from fdtrace.sinks.prometheus import MetricsExporter

        try:
            exporter = MetricsExporter(listen)
        except FdtraceError as error:
            source.stop()
            writer.abandon()
            _fail(error)
    recorder = Recorder(source, writer, ProcSampler(cmdline=cmdline),
                        RecordOptions(interval_s=interval, top_processes=top_processes, comms=comms,
                                      rotate_s=rotate, haproxy_sockets=haproxy_sockets), exporter=exporter)
    deadline = time.monotonic() + duration if duration is not None else None
    try:
        recorder.run(lambda: stop.stopped, deadline)
        writer.write_meta(complete=True, ended=time.time())
        writer.close()
    except FdtraceError as error:
        source.stop()
        writer.abandon()
        _fail(error)
    source.stop()
    losses = recorder.losses
    click.echo(
        f"fdtrace: recorded {recorder.events} events, {writer.bytes_written} bytes; lost {sum(losses.values())}",
        err=True,
    )


@main.command()
@click.argument("directories", nargs=-1, required=True, type=click.Path())
def info(directories: tuple[str, ...]) -> None:
    """Summarise recordings: span, hosts, events by kind, losses, least FD headroom, OOM kills."""
    from fdtrace.recording import load
    from fdtrace.report_text import summary

    try:
        recording = load(list(directories))
    except FdtraceError as error:
        _fail(error)
    click.echo(summary(recording))


@main.command()
@click.option("--pid", "pids", type=int, multiple=True, help="Only these processes (repeatable).")
@click.option("-f", "--follow", is_flag=True,
              help="With --pid: also the processes they start from now on, and theirs (a job's workers).")
@click.option("--top", "top_processes", type=int, default=30, show_default=True,
              help="Sample this many processes with the most open FDs (besides those with events).")
@click.option("--record-dir", type=click.Path(file_okay=False), default=None,
              help="Where the R key records (default: ./fdtrace-DATE-TIME).")
@click.option("--haproxy-socket", "haproxy_sockets", multiple=True,
              help="Show HAProxy's `show info` from this stats socket every second (repeatable).")
@click.option("--ring-pages", type=int, default=4096, show_default=True,
              help="Ring buffer size in pages (a power of two).")
def top(pids: tuple[int, ...], follow: bool, top_processes: int, record_dir: str | None,
        haproxy_sockets: tuple[str, ...], ring_pages: int) -> None:
    """The live view: processes by FD headroom, errors, OOM kills and threads, as they happen."""
    from pathlib import Path

    from fdtrace.bpf.loader import TraceOptions
    from fdtrace.feeds import LiveFeed

    source = _start_source(TraceOptions(pids=pids, follow=follow, ring_pages=ring_pages), keep_exited=0,
                           echo_notes=False)
    from fdtrace.tui.app import make_app

    feed = LiveFeed(source, top=top_processes, haproxy_sockets=haproxy_sockets)
    make_app(feed, Path(record_dir) if record_dir else None).run()
    for note in source.notes:
        click.echo(f"fdtrace: {note}", err=True)


@main.command()
@click.argument("directories", nargs=-1, required=True, type=click.Path())
@click.option("--speed", type=float, default=1.0, show_default=True, help="Replay speed (2 = twice real time).")
def replay(directories: tuple[str, ...], speed: float) -> None:
    """Replay recordings in the live view: play, pause, faster/slower, jump to the next error."""
    from fdtrace.feeds import ReplayFeed

    if speed <= 0:
        _fail(FdtraceError("--speed must be positive"))
    try:
        feed = ReplayFeed(list(directories), speed=speed)
    except FdtraceError as error:
        _fail(error)
    from fdtrace.tui.app import make_app

    make_app(feed).run()


@main.command()
@click.option("--pid", "pids", type=int, multiple=True, help="Check this process (repeatable).")
@click.option("--comm", "comms", multiple=True, help="Check the processes of this name (repeatable).")
@click.option("--from", "from_dir", type=click.Path(file_okay=False), default=None,
              help="A recording: recommend limits from the peaks it saw.")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
def doctor(pids: tuple[int, ...], comms: tuple[str, ...], from_dir: str | None, as_json: bool) -> None:
    """Check FD, listen-queue and thread limits and say exactly what to change.

    Exit code 0 when every check is OK, 1 with warnings, 2 with failures.
    """
    from pathlib import Path

    from fdtrace.doctor import report
    from fdtrace.doctor.checks import Doctor

    checker = Doctor()
    selected = report.select_pids(checker, pids, comms)
    missing = [pid for pid in pids if checker.sampler.sample(pid) is None]
    if missing:
        _fail(FdtraceError(f"no such process: {', '.join(map(str, missing))}"))
    listen_moved = None
    if from_dir is not None:
        try:
            listen_moved = report.apply_recording(Path(from_dir), checker, selected)
        except FdtraceError as error:
            _fail(error)
    checks = report.run_checks(checker, selected, listen_moved)
    click.echo(report.as_json(checks) if as_json else report.as_table(checks))
    sys.exit(int(report.worst(checks)))


@main.command()
@click.option("--listen", default="127.0.0.1:9877", show_default=True,
              help="ADDRESS:PORT to serve /metrics on (loopback by default).")
@click.option("--pid", "pids", type=int, multiple=True, help="Only these processes (repeatable).")
@click.option("-f", "--follow", is_flag=True,
              help="With --pid: also the processes they start from now on, and theirs (a job's workers).")
@click.option("--top", "top_processes", type=int, default=50, show_default=True,
              help="Processes with series: the ones with the most open FDs (bounds the label sets).")
@click.option("--duration", type=float, default=None, help="Stop after this many seconds.")
def export(listen: str, pids: tuple[int, ...], follow: bool, top_processes: int, duration: float | None) -> None:
    """Serve Prometheus metrics: process_open_fds / process_max_fds per process, exact counters of
    sockets, accepts, connects, closes, FD errors and threads, OOM kills, file-nr and losses."""
    from fdtrace.bpf.loader import TraceOptions
    from fdtrace.feeds import LiveFeed
    from fdtrace.sinks.prometheus import MetricsExporter

    stop = _StopFlag()
    source = _start_source(TraceOptions(pids=pids, follow=follow, errors_only=True), keep_exited=0)
    try:
        exporter = MetricsExporter(listen, max_processes=top_processes)
    except FdtraceError as error:
        source.stop()
        _fail(error)
    click.echo(f"fdtrace: serving metrics on http://{exporter.address}:{exporter.port}/metrics", err=True)
    feed = LiveFeed(source, top=top_processes)
    deadline = time.monotonic() + duration if duration is not None else None
    try:
        while not stop.stopped and (deadline is None or time.monotonic() < deadline):
            update = feed.poll()
            exporter.observe(update.events)
            for sample_round in update.rounds:
                exporter.update(sample_round.samples, sample_round.system or {}, source.counters, update.losses)
            time.sleep(0.1)
    finally:
        exporter.close()
        feed.close()


@main.command()
@click.argument("directories", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="report.html", show_default=True,
              help="The report file.")
@click.option("--format", "fmt", type=click.Choice(["html", "md"]), default=None,
              help="html (self-contained) or md; by default from the output's extension.")
@click.option("--phases", "phase_files", multiple=True, type=click.Path(dir_okay=False),
              help="Training phases to add: a file of `fdtrace run --phases-out`, or a PyTorch profiler "
                   "(Kineto) trace JSON, put on the recording's clock. Repeatable.")
def report(directories: tuple[str, ...], output: str, fmt: str | None, phase_files: tuple[str, ...]) -> None:
    """A postmortem report of recordings: summary, timeline, spikes, FD headroom, incidents,
    losses and the limits to change."""
    from fdtrace.analysis.report import EVENT_COLUMNS, build, to_html, to_markdown
    from fdtrace.recording import load

    fmt = fmt or ("md" if output.endswith(".md") else "html")
    try:
        recording = load(list(directories), columns={"events": list(EVENT_COLUMNS)}, phases=list(phase_files))
    except FdtraceError as error:
        _fail(error)
    for skipped in recording.skipped:
        click.echo(f"fdtrace: skipped an unreadable file: {skipped}", err=True)
    content = build(recording)
    text = to_markdown(content) if fmt == "md" else to_html(content)
    try:
        with open(output, "w") as out:
            out.write(text)
    except OSError as exc:
        _fail(FdtraceError(f"{output}: cannot write the report ({exc.strerror})", exit_code=1))
    click.echo(f"fdtrace: report written to {output}", err=True)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--record", "record_dir", type=click.Path(file_okay=False), default=None,
              help="Record the whole run (as fdtrace record) and store the phases in the recording.")
@click.option("--phases-out", type=click.Path(dir_okay=False), default=None,
              help="Also write the phases to this file (.parquet, else JSON lines).")
@click.option("--skip", "skip", multiple=True, type=click.Choice(["forward", "backward", "allreduce"]),
              help="Do not mark this phase. `--skip allreduce` keeps DDP's built-in all-reduce: timing each "
                   "bucket needs a communication hook, whose averaging costs an extra pass over the gradients "
                   "on CPU (see docs/benchmarks.md). Repeatable.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(record_dir: str | None, phases_out: str | None, skip: tuple[str, ...], command: tuple[str, ...]) -> None:
    """Run a training command unchanged, marking its PyTorch phases in every rank.

    A shim on PYTHONPATH (sitecustomize, standard library and torch only) marks
    init_process_group, new_group, barrier, destroy_process_group, forward, backward, each
    gradient all-reduce bucket, optimizer steps and checkpoints, per rank and step. The exit code
    is the command's.
    """
    import os
    import subprocess
    import tempfile
    from importlib import resources
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    from fdtrace.phases.collect import read_phase_files
    from fdtrace.phases.live import RUN_DIR_PREFIX, runs_base

    shim = str(resources.files("fdtrace.phases") / "_shim")
    # Where `fdtrace top` looks for the ranks' live state files.
    phases_dir = tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=runs_base())
    env = dict(os.environ, FDTRACE_PHASES_DIR=phases_dir, FDTRACE_PHASES_SKIP=",".join(skip),
               PYTHONPATH=os.pathsep.join(p for p in (shim, os.environ.get("PYTHONPATH", "")) if p))
    recorder = None
    if record_dir is not None:
        recorder = subprocess.Popen([sys.executable, "-m", "fdtrace", "record", "-o", record_dir],
                                    stderr=subprocess.PIPE, text=True)
        assert recorder.stderr is not None
        for line in recorder.stderr:
            if "recording to" in line:
                break
            click.echo(line.rstrip(), err=True)
        else:
            recorder.wait()
            _fail(FdtraceError(f"the recorder did not start (exit {recorder.returncode})", exit_code=1))
    try:
        returncode = subprocess.call(list(command), env=env)
    except OSError as exc:
        returncode = 127
        click.echo(f"fdtrace: error: cannot run {command[0]}: {exc.strerror}", err=True)
    finally:
        if recorder is not None:
            recorder.send_signal(signal.SIGINT)
            recorder.communicate()
    phases = read_phase_files(Path(phases_dir))
    phases = phases.append_column("time", pa.array(phases["start_wall_ns"].to_numpy(zero_copy_only=False))
                                  .cast(pa.timestamp("ns", tz="UTC")))
    if record_dir is not None and recorder is not None and recorder.returncode == 0:
        from fdtrace.recording import read_meta
        from fdtrace.sinks.parquet import append_part

        [host] = list(read_meta(Path(record_dir)))[:1] or [""]
        append_part(Path(record_dir), "phases", host, phases)
    if phases_out is not None:
        if phases_out.endswith(".parquet"):
            pq.write_table(phases, phases_out)
        else:
            with open(phases_out, "w") as out:
                for row in phases.drop_columns(["time"]).to_pylist():
                    out.write(json.dumps(row) + "\n")
    for leftover in [*Path(phases_dir).glob("phases-*.jsonl"), *Path(phases_dir).glob("state-*.bin")]:
        leftover.unlink()
    os.rmdir(phases_dir)
    click.echo(f"fdtrace: {phases.num_rows} phase marks from {len(set(phases['pid'].to_pylist()))} processes",
               err=True)
    sys.exit(returncode)
