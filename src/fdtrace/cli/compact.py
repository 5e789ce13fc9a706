"""`fdtrace compact`: few large part files instead of many small ones, for the engines."""

from __future__ import annotations

import sys

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
    and host, atomically. Safe while a recorder still writes: what it changes meanwhile is left.
    A host whose parts cannot be compacted is named and left as it was (exit code 1); the other
    hosts are compacted."""
    from fdtrace.recording.compaction import Compacted, FleetCompaction, compact_recordings

    try:
        target = parse_size(target_size)
    except ValueError as exc:
        fail(FdtraceError(f"--target-size: {exc}"))
    found = FleetCompaction()
    failed = []
    try:
        for done in compact_recordings(list(directories), target, found):
            if not isinstance(done, Compacted):  # that host's parts stay as they were; the others are compacted
                failed.append(f"{done[0]}: {done[1]}")
                continue
            left = f", {done.changed_meanwhile} merges left (the recorder changed those parts)" \
                if done.changed_meanwhile else ""
            say(shown(f"{done.host} ({done.root}): {done.files_before} files -> {done.files_after}, "
                      f"{done.rows} rows merged{left}"))
    except FdtraceError as error:
        fail(error)
    for skipped in found.skipped:
        note(f"skipped {skipped}")
    for text in found.notes:
        note(text)
    for why in failed:
        note(f"not compacted: {why}")
    if failed:
        sys.exit(1)
