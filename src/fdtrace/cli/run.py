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
from typing import Any, BinaryIO

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

    from fdtrace.integrations.phases.collect import read_phase_files
    from fdtrace.integrations.phases.live import RUN_DIR_PREFIX, runs_base
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.pipeline import Pipeline, Stop
    from fdtrace.safe_files import HeldDirectory

    try:  # before the job runs: a folder another user planted or can change is refused in one line
        HeldDirectory.open(runs_base(), shared=True).close()
        if phases_out is not None:
            HeldDirectory.open(Path(phases_out).absolute().parent, shared=True).close()
    except FdtraceError as error:
        fail(error)
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
        _write_phases(Path(phases_out), phases)
    _remove_run_folder(Path(phases_dir))
    note(f"{phases.num_rows} phase marks from {len(set(phases['pid'].to_pylist()))} processes")
    sys.exit(returncode)


def _write_phases(path: Path, phases: Any) -> None:
    """--phases-out: Parquet, else JSON lines, written whole through its held folder."""
    from fdtrace.recording.writer import write_parquet
    from fdtrace.safe_files import PRIVATE_FILE, write_atomically

    def parquet(out: BinaryIO) -> None:
        write_parquet(phases, out)

    def lines(out: BinaryIO) -> None:
        for row in phases.drop_columns(["time"]).to_pylist():
            out.write((json.dumps(row) + "\n").encode())

    try:
        write_atomically(path, parquet if path.suffix == ".parquet" else lines, PRIVATE_FILE, check_parent=False)
    except FdtraceError as error:
        note(f"error: {error}")
    except OSError as exc:
        note(f"error: {path}: cannot write the phases ({exc.strerror})")


def _remove_run_folder(folder: Path) -> None:
    """The run's own phases folder and the files its ranks wrote, removed through the folder's
    descriptor (a name swapped meanwhile is not followed)."""
    from fdtrace.safe_files import HeldDirectory

    try:
        with HeldDirectory.open(folder) as held:
            for name in held.names():
                if name.startswith("phases-") and name.endswith(".jsonl") or \
                        name.startswith("state-") and name.endswith(".bin"):
                    held.unlink(name)
        os.rmdir(folder)
    except (FdtraceError, OSError):  # something else was put there: not fdtrace's to delete, nor a reason to fail
        note(f"left {folder}: it holds files fdtrace did not write")
