"""`fdtrace run`: a training job with its phases marked, recorded in-process if asked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path
from types import FrameType

import click

from fdtrace.cli.common import fail, note, start
from fdtrace.errors import FdtraceError


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--record", "record_dir", type=click.Path(file_okay=False), default=None,
              help="Record the whole run (as fdtrace record) and store the phases in the recording.")
@click.option("--phases-out", type=click.Path(dir_okay=False), default=None,
              help="Also write the phases to this file (.parquet, else JSON lines).")
@click.option("--skip", "skip", multiple=True, type=click.Choice(["forward", "backward", "allreduce"]),
              help="Do not mark this phase. `--skip allreduce` leaves DDP's reducer as it is: no bucket is "
                   "timed, the all-reduce shows inside backward (see docs/phases.md). Repeatable.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(record_dir: str | None, phases_out: str | None, skip: tuple[str, ...], command: tuple[str, ...]) -> None:
    """Run a training command unchanged, marking its PyTorch phases in every rank.

    A shim on PYTHONPATH (sitecustomize, standard library and torch only) marks
    init_process_group, new_group, barrier, destroy_process_group, forward, backward, each
    gradient all-reduce bucket, optimizer steps and checkpoints, per rank and step. The exit code
    is the command's.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fdtrace.integrations.phases.collect import read_phase_files
    from fdtrace.integrations.phases.live import RUN_DIR_PREFIX, runs_base
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.pipeline import Pipeline, Stop

    pipeline = None
    recording = None
    if record_dir is not None:
        from fdtrace.sinks.parquet import ParquetSink
        from fdtrace.sources.live import LiveOptions, LiveSource

        try:
            recording = ParquetSink(Path(record_dir), sys.argv)
        except FdtraceError as error:
            fail(error)
        pipeline = Pipeline(LiveSource(LiveOptions(exiting=True, keep_exited=0,
                                                   trace=TraceOptions(connections=True))), [recording])
        start(pipeline)
        note(f"recording to {record_dir}")
    shim = str(resources.files("fdtrace.integrations.phases") / "_shim")
    # Where `fdtrace top` looks for the ranks' live state files.
    phases_dir = tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=runs_base())
    env = dict(os.environ, FDTRACE_PHASES_DIR=phases_dir, FDTRACE_PHASES_SKIP=",".join(skip),
               PYTHONPATH=os.pathsep.join(p for p in (shim, os.environ.get("PYTHONPATH", "")) if p))
    try:
        job = subprocess.Popen(list(command), env=env)
    except OSError as exc:
        job = None
        note(f"error: cannot run {command[0]}: {exc.strerror}")

    def forward(signum: int, _frame: FrameType | None) -> None:
        """SIGINT and SIGTERM are the job's to act on; recording goes on until it ends."""
        if job is not None and job.poll() is None:
            job.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    if pipeline is not None:
        try:
            pipeline.run(Stop(condition=lambda: job is None or job.poll() is not None, signals=False))
        except FdtraceError as error:  # the job goes on; its phases are still collected
            note(f"error: the recording stopped: {error}")
            recording = None
    returncode = job.wait() if job is not None else 127
    phases = read_phase_files(Path(phases_dir))
    phases = phases.append_column("time", pa.array(phases["start_wall_ns"].to_numpy(zero_copy_only=False))
                                  .cast(pa.timestamp("ns", tz="UTC")))
    if recording is not None and pipeline is not None:
        from fdtrace.recording.writer import append_part

        append_part(Path(record_dir or "."), "phases", pipeline.source.info.host, phases)
    if phases_out is not None:
        if phases_out.endswith(".parquet"):
            pq.write_table(phases, phases_out)
        else:
            with open(phases_out, "w") as out:
                for row in phases.drop_columns(["time"]).to_pylist():
                    out.write(json.dumps(row) + "\n")
    for leftover in [*Path(phases_dir).glob("phases-*.jsonl"), *Path(phases_dir).glob("state-*.bin")]:
        leftover.unlink(missing_ok=True)
    try:
        os.rmdir(phases_dir)
    except OSError:  # something else was put there: not fdtrace's to delete, nor a reason to fail the job
        note(f"left {phases_dir}: it holds files fdtrace did not write")
    note(f"{phases.num_rows} phase marks from {len(set(phases['pid'].to_pylist()))} processes")
    sys.exit(returncode)
