"""`fdtrace rehearse`: a DDP-shaped burst of connections against a balancer, traced meanwhile."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from fdtrace.cli.common import StartupProgress, fail, note, say
from fdtrace.display import shown
from fdtrace.errors import FdtraceError

if TYPE_CHECKING:
    from fdtrace.pipeline import Pipeline
    from fdtrace.rehearsal.result import RehearsalResult
    from fdtrace.rehearsal.runner import Rehearsal
    from fdtrace.rehearsal.shape import Shape
    from fdtrace.rehearsal.target import Target
    from fdtrace.rehearsal.watch import TargetWatch


def _one(error: FdtraceError) -> FdtraceError:
    """The error with rehearse's exit status for errors (2 says the target failed)."""
    return FdtraceError(str(error), exit_code=1)


@click.command()
@click.option("--target", required=True, metavar="HOST:PORT",
              help="The balancer to rehearse ([ADDRESS]:PORT for IPv6).")
@click.option("--comm", default=None, help="Trace the process of this name (the one listening there among several).")
@click.option("--pid", type=int, default=None,
              help="Trace this process (default: the one listening on the target, when it is on this host).")
@click.option("--ranks", type=int, required=True, help="Workers opening connections at the same instant.")
@click.option("--connections-per-rank", "per_rank", type=int, required=True,
              help="Connections each rank opens at once (at the last step of a ramp).")
@click.option("--bursts", type=int, default=1, show_default=True,
              help="Times each step is opened, held and closed (syncs or checkpoint barriers).")
@click.option("--hold", "hold_s", type=float, default=1.0, show_default=True,
              help="Seconds the connections are held once answered.")
@click.option("--ramp", type=int, default=None,
              help="Grow the concurrency in this many steps up to ranks x connections, stopping at the first "
                   "failure (default: the whole shape at once).")
@click.option("--processes", is_flag=True, help="Each rank a process of its own (default: threads of this one).")
@click.option("--timeout", "timeout_s", type=float, default=5.0, show_default=True,
              help="Seconds a connection may take to connect and be answered.")
@click.option("--no-reply", is_flag=True,
              help="Count a connection as held once connected (for a backend that does not answer a few bytes).")
@click.option("--project-ranks", type=int, default=None,
              help="Also say what the target needs for this many ranks of the same shape (the scaling change).")
@click.option("--max-connections", type=int, default=20_000, show_default=True,
              help="Refuse a shape that would hold more connections at once.")
@click.option("--max-rate", type=float, default=10_000, show_default=True,
              help="Connections opened per second at most, on average (bursts wait for it).")
@click.option("--duration", "duration_s", type=float, default=600, show_default=True,
              help="Start no burst after this many seconds (one under way ends first), whatever is left of the shape.")
@click.option("--allow-remote", is_flag=True,
              help="Allow a target that is not on this host nor in its network namespaces (it is not traced).")
@click.option("--interval", "interval_s", type=float, default=0.25, show_default=True,
              help="Seconds between the tracer's samples of the target.")
@click.option("--json", "as_json", is_flag=True, help="The result as JSON.")
@click.option("-o", "--output", default=None, type=click.Path(file_okay=False),
              help="Record the rehearsal (as fdtrace record) to this directory.")
def rehearse(target: str, comm: str | None, pid: int | None, ranks: int, per_rank: int, bursts: int, hold_s: float,
             ramp: int | None, processes: bool, timeout_s: float, no_reply: bool, project_ranks: int | None,
             max_connections: int, max_rate: float, duration_s: float, allow_remote: bool, interval_s: float,
             as_json: bool, output: str | None) -> None:
    """Rehearse a balancer before a scaling change: RANKS workers open CONNECTIONS-PER-RANK
    connections each at the same instant, as a DDP job does at a gradient sync or a checkpoint
    barrier, hold them, close them, --bursts times (growing step by step with --ramp), while the
    target is traced: its descriptors against its limits, EMFILE/ENFILE, listen-queue overflows,
    OOM kills, threads.

    Says the most connections held with no failure, where the target first failed and how, the
    descriptors it takes per connection, what the shape needs and what to change. Exit status
    0 when the shape held, 2 when the target failed, 1 on errors or when stopped first.
    """
    from fdtrace.rehearsal.runner import Rehearsal, ensure_own_limit, start_ranks, stop_ranks
    from fdtrace.rehearsal.shape import Shape
    from fdtrace.rehearsal.target import choose_pids, find_target
    from fdtrace.rehearsal.watch import TargetWatch

    if comm is not None and pid is not None:
        fail(FdtraceError("give --comm or --pid, not both", exit_code=1))
    for name, value in (("--project-ranks", project_ranks), ("--max-connections", max_connections)):
        if value is not None and value < 1:
            fail(FdtraceError(f"{name} must be at least 1", exit_code=1))
    if max_rate <= 0 or duration_s <= 0 or interval_s <= 0:
        fail(FdtraceError("--max-rate, --duration and --interval must be more than 0", exit_code=1))
    try:
        shape = Shape(ranks, per_rank, bursts=bursts, hold_s=hold_s, ramp=ramp or 1, timeout_s=timeout_s,
                      expect_reply=not no_reply, processes=processes)
        if shape.total > max_connections:
            raise FdtraceError(f"the shape holds {shape.total} connections at once, more than --max-connections "
                               f"{max_connections}: raise it to rehearse this shape", exit_code=1)
        found = find_target(target, allow_remote)
        pids = choose_pids(found, (pid,) if pid is not None else (), comm)
        if output is not None and not pids:
            raise FdtraceError("-o records the traced process: this target is not on this host; name a process "
                               "of this host with --pid or --comm to trace one", exit_code=1)
        ensure_own_limit(shape, tracing=bool(pids))
    except FdtraceError as error:
        fail(error)
    traced = pids[0] if pids else None
    comm_now = _comm(traced)
    watch = TargetWatch(pids) if pids else None
    try:
        rank_list = start_ranks(shape, found)
    except FdtraceError as error:
        fail(error)
    sampler = None
    if len(pids) > 1:  # the workers that accept there, measured as one (their descriptors summed)
        from fdtrace.rehearsal.runner import WorkersSampler

        sampler = WorkersSampler(pids)
    rehearsal = Rehearsal(shape, rank_list, traced, watch, max_rate, duration_s, sampler=sampler)
    _stop_on_signals(rehearsal)  # from now: a signal during the compile counts too
    pipeline = None
    if watch is not None:
        try:
            pipeline = _pipeline(watch, interval_s, output)
        except FdtraceError as error:
            stop_ranks(rank_list)
            fail(_one(error))
        from fdtrace.sources.live import LiveSource

        if isinstance(pipeline.source, LiveSource):
            rehearsal.ask_round = pipeline.source.round_now
        if rehearsal.cancelled is not None:
            pipeline.close()
            stop_ranks(rank_list)
            fail(FdtraceError(f"{rehearsal.cancelled} before the load began", exit_code=1))
        probes = len(pipeline.source.info.probes_attached)
        more = len(pids) - 1
        workers = f" and {more} more worker{'s' * (more > 1)}, their descriptors summed" if more else ""
        note(f"tracing pid {traced} ({shown(comm_now)}){workers}: {probes} probes attached; rehearsing "
             f"{shape.ranks} ranks x {shape.per_rank} connections against {shown(found.text)}")
    else:
        note(f"{shown(found.text)} is not on this host: not traced; rehearsing {shape.ranks} ranks x {shape.per_rank} "
             "connections")
    failed = _play(rehearsal, pipeline)
    stop_ranks(rank_list)
    if failed is not None:
        fail(_one(failed))
    if rehearsal.error is not None:
        fail(_one(rehearsal.error))
    result = _result(rehearsal, found, shape, traced, comm_now, watch, project_ranks)
    say(result.as_json() if as_json else result.as_text())
    if output is not None:
        note(f"recorded to {output}")
    sys.exit(result.exit_code)


def _comm(pid: int | None) -> str | None:
    if pid is None:
        return None
    from fdtrace.procfs import ProcessAccessDeniedError, ProcessGoneError, ProcFS

    try:
        return ProcFS().stat(pid).comm
    except (ProcessGoneError, ProcessAccessDeniedError):
        fail(FdtraceError(f"pid {pid} is gone", exit_code=1))


def _pipeline(watch: TargetWatch, interval_s: float, output: str | None) -> Pipeline:
    """The live pipeline over the target, started (the probes attached), its notes said.
    Raises FdtraceError."""
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.pipeline import Pipeline, Sink
    from fdtrace.rehearsal.runner import TargetSampler
    from fdtrace.sources.live import LiveOptions, LiveSource

    pids = tuple(sorted(watch.pids))
    sinks: list[Sink] = [watch]
    if output is not None:
        from fdtrace.sinks.parquet import ParquetSink

        sinks.append(ParquetSink(Path(output), sys.argv))
    # No stats connection of fdtrace's to the target: it would be counted among the descriptors the
    # rehearsal measures (one more, now and then) and could cost a full target an accept.
    source = LiveSource(LiveOptions(exiting=True, keep_exited=16, interval_s=interval_s, top_processes=0,
                                    trace=TraceOptions(pids=pids), find_haproxy_sockets=False),
                        sampler=TargetSampler(pids))
    pipeline = Pipeline(source, sinks)
    with StartupProgress() as progress:
        source.on_stage = progress.stage
        pipeline.start()
    for text in source.notes:
        note(text)
    return pipeline


def _stop_on_signals(rehearsal: Rehearsal) -> None:
    """SIGINT and SIGTERM stop the rehearsal after the burst under way."""
    def stop(signum: int, _frame: FrameType | None) -> None:
        rehearsal.cancel(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def _play(rehearsal: Rehearsal, pipeline: Pipeline | None) -> FdtraceError | None:
    """Play the rehearsal on a thread while the pipeline (when tracing) runs here until it is
    done. Returns the pipeline's error."""
    from fdtrace.pipeline import Stop

    worker = threading.Thread(target=rehearsal.run, name="fdtrace-rehearsal", daemon=True)
    worker.start()
    problem = None
    if pipeline is None:
        while not rehearsal.done.wait(0.1):
            continue
    else:
        try:
            pipeline.run(Stop(condition=rehearsal.done.is_set, signals=False))
        except FdtraceError as error:  # a required sink failed (the recording's disk, ...)
            problem = error
            rehearsal.cancel("the tracer stopped")
    worker.join()
    return problem


def _result(rehearsal: Rehearsal, target: Target, shape: Shape, pid: int | None, comm: str | None,
            watch: TargetWatch | None, project_ranks: int | None) -> RehearsalResult:
    """The figures, with the doctor's advice for the need."""
    from fdtrace.rehearsal.result import RehearsalResult

    first = rehearsal.first_sample
    result = RehearsalResult(target, shape, pid, comm, rehearsal.bursts,
                             fd_soft_limit=first.fd_soft_limit if first is not None else None,
                             fd_hard_limit=first.fd_hard_limit if first is not None else None,
                             first_fds=first.open_fds if first is not None else None,
                             stopped=rehearsal.stopped, project_ranks=project_ranks, notes=list(rehearsal.notes))
    if watch is not None:
        result.errors, result.peak_fds, result.peak_threads = watch.errors, watch.peak_fds, watch.peak_threads
        lost = sum(watch.losses.values())
        if lost:
            result.notes.append(f"the tracer lost {lost} events: the failures by burst may be short (the failed "
                                "calls are exact)")
    result.advise()
    return result
