"""`fdtrace doctor`: limits checked, and what to change."""

from __future__ import annotations

import sys

import click

from fdtrace.cli.common import fail, note, say
from fdtrace.errors import FdtraceError


@click.command()
@click.option("--pid", "pids", type=int, multiple=True, help="Check this process (repeatable).")
@click.option("--comm", "comms", multiple=True, help="Check the processes of this name (repeatable).")
@click.option("--from", "from_dir", type=click.Path(file_okay=False), default=None,
              help="A recording: recommend limits from the peaks it saw.")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@click.option("--engine", type=click.Choice(["auto", "pandas", "duckdb", "spark"]), default="auto", show_default=True,
              help="Where --from's recording is read (see fdtrace info --help).")
def doctor(pids: tuple[int, ...], comms: tuple[str, ...], from_dir: str | None, as_json: bool, engine: str) -> None:
    """Check FD, listen-queue and thread limits and say exactly what to change.

    Exit code 0 when every check is OK, 1 with warnings, 2 with failures.
    """
    from pathlib import Path

    from fdtrace.doctor import report
    from fdtrace.doctor.checks import Doctor

    checker = Doctor()
    selected = report.select_pids(checker, pids, comms)
    listen_moved = None
    if from_dir is not None:
        try:
            found = report.apply_recording(Path(from_dir), checker, selected, engine, comms)
        except FdtraceError as error:
            fail(error)
        for line in found.problems:
            note(line)
        listen_moved = found.listen_moved
        selected = sorted({*selected, *found.gone})
    known = {pid for pid in selected if checker.sampler.sample(pid) is not None or pid in checker.recorded}
    missing = [pid for pid in pids if pid not in known]
    names = {checker.recorded[p].comm if p in checker.recorded else getattr(checker.sampler.sample(p), "comm", "")
             for p in known}
    unmatched = [name for name in comms if name not in names]
    later = " (for one that is gone, give --from RECORDING)" if from_dir is None else ", running or in the recording"
    if missing:
        fail(FdtraceError(f"no such process: {', '.join(map(str, missing))}{later}"))
    if unmatched:
        fail(FdtraceError(f"no process named {', '.join(unmatched)}{later}"))
    checks = report.run_checks(checker, sorted(known), listen_moved)
    say(report.as_json(checks) if as_json else report.as_table(checks))
    sys.exit(int(report.worst(checks)))
