"""`fdtrace trace-export`: a recording as a Chrome trace for Perfetto, or merged into a PyTorch
profiler trace of the same run."""

from __future__ import annotations

from pathlib import Path

import click

from fdtrace.cli.common import fail, note, open_recordings
from fdtrace.errors import FdtraceError
from fdtrace.safe_files import PRIVATE_FILE, SHARED_FILE, write_atomically


@click.command("trace-export")
@click.argument("directories", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="trace.json.gz", show_default=True,
              help="The trace file (gzipped when it ends in .gz).")
@click.option("--merge", "kineto", type=click.Path(dir_okay=False), default=None,
              help="A PyTorch profiler (Kineto) trace of the same run: write it with fdtrace's tracks added, on "
                   "its clock.")
@click.option("--host", default=None, help="With --merge and several hosts: the host that ran the traced rank.")
@click.option("--top", type=int, default=20, show_default=True,
              help="Processes with counter tracks at most (ranks, then failed, then nearest a limit).")
@click.option("--shared", is_flag=True, help="Make the file readable by everyone (default: owner only).")
def trace_export(directories: tuple[str, ...], output: str, kineto: str | None, host: str | None, top: int,
                 shared: bool) -> None:
    """Write recordings as a Chrome Trace Event file that Perfetto (ui.perfetto.dev) and
    chrome://tracing open: per process, counter tracks of open FDs against the soft limit, of
    threads against their limit and of EMFILE/ENFILE per second, an instant event per failure,
    and each rank's training phases as slices. With --merge, those tracks are added to a
    PyTorch profiler trace of the run (Holistic Trace Analysis reads the result)."""
    from fdtrace.analysis.chrome_trace import chrome_trace, merge_into_kineto, trace_bytes

    if top < 1:
        fail(FdtraceError("--top must be positive"))
    recording = open_recordings(directories, "pandas", None, None, False)
    from fdtrace.analysis.summary import named_problems

    for line in named_problems(recording):
        note(line)
    try:
        trace = (merge_into_kineto(recording, Path(kineto), top=top, host=host) if kineto is not None
                 else chrome_trace(recording, top=top, host=host))
    except FdtraceError as error:
        fail(error)
    data = trace_bytes(trace, output.endswith(".gz"))
    try:
        write_atomically(Path(output), lambda out: out.write(data), SHARED_FILE if shared else PRIVATE_FILE,
                         check_parent=False)
    except FdtraceError as error:  # its folder refused: another user's, or one they can change
        fail(error)
    except OSError as exc:
        fail(FdtraceError(f"{output}: cannot write the trace ({exc.strerror})", exit_code=1))
    shown = trace["otherData"]
    note(f"trace written to {output} ({len(trace['traceEvents']):,} events; "
               f"{shown['fdtrace.failures_shown']:,} of {shown['fdtrace.failures']:,} failures as instants)")
