"""`fdtrace compact`: few large part files instead of many small ones, for the engines."""

from __future__ import annotations

import click

from fdtrace.cli.common import fail, note, parse_size, say
from fdtrace.display import shown
from fdtrace.errors import FdtraceError


@click.command()
@click.argument("directories", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--target-size", default="256M", show_default=True, metavar="SIZE",
              help="Merge consecutive parts into files of up to this size.")
def compact(directories: tuple[str, ...], target_size: str) -> None:
    """Merge the many small part files of recordings (or of a fleet) into few large ones per table
    and host, atomically. Safe while a recorder still writes: what it changes meanwhile is left."""
    from fdtrace.recording.compaction import compact_host
    from fdtrace.recording.fleet import find_fleet

    try:
        target = parse_size(target_size)
    except ValueError as exc:
        fail(FdtraceError(f"--target-size: {exc}"))
    try:
        fleet = find_fleet(list(directories))
        for recording in fleet.hosts:
            done = compact_host(recording, target)
            left = f", {done.changed_meanwhile} merges left (the recorder changed those parts)" \
                if done.changed_meanwhile else ""
            say(shown(f"{recording.host} ({recording.root}): {done.files_before} files -> {done.files_after}, "
                      f"{done.rows} rows merged{left}"))
    except FdtraceError as error:
        fail(error)
    for skipped in fleet.skipped:
        note(f"skipped: {skipped}")
