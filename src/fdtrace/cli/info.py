"""`fdtrace info`: a recording in a few lines."""

from __future__ import annotations

import click

from fdtrace.cli.common import fail
from fdtrace.errors import FdtraceError


@click.command()
@click.argument("directories", nargs=-1, required=True, type=click.Path())
def info(directories: tuple[str, ...]) -> None:
    """Summarise recordings: span, hosts, events by kind, losses, least FD headroom, OOM kills."""
    from fdtrace.analysis.summary import summary
    from fdtrace.recording import load

    try:
        recording = load(list(directories))
    except FdtraceError as error:
        fail(error)
    click.echo(summary(recording))
