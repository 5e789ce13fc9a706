"""`fdtrace info`: a recording, or a fleet of them, in a few lines."""

from __future__ import annotations

import click

from fdtrace.cli.common import engine_options, fail, open_recordings, say
from fdtrace.errors import FdtraceError


@click.command()
@click.argument("directories", nargs=-1, required=True, type=click.Path())
@engine_options
def info(directories: tuple[str, ...], engine: str, spark_master: str | None, memory_limit: str | None,
         no_clock_correction: bool) -> None:
    """Summarise recordings, or a fleet (a directory of many hosts' recordings): what went wrong,
    hosts with their spans, events and losses, least FD and thread headroom, OOM kills."""
    from fdtrace.analysis.summary import summary

    with open_recordings(directories, engine, spark_master, memory_limit, no_clock_correction) as recording:
        try:
            say(summary(recording))
        except FdtraceError as error:
            fail(error)
