"""The ``fdtrace`` command line: one module per command, each attaching its sinks to a source."""

from __future__ import annotations

import click

from fdtrace import __version__
from fdtrace.cli.call_sites import leaks, threads
from fdtrace.cli.compact import compact
from fdtrace.cli.doctor import doctor
from fdtrace.cli.export import export
from fdtrace.cli.info import info
from fdtrace.cli.record import record
from fdtrace.cli.rehearse import rehearse
from fdtrace.cli.report import report
from fdtrace.cli.run import run
from fdtrace.cli.scale import scale
from fdtrace.cli.service import service
from fdtrace.cli.top import replay, top
from fdtrace.cli.trace import trace
from fdtrace.cli.trace_export import trace_export

#: The commands that can trace the live kernel: Arrow allocates from the system allocator in them
#: (``sources.memory.arrow_allocates_from_system``), chosen before any of them loads pyarrow.
LIVE_COMMANDS = frozenset({"trace", "record", "top", "export", "run", "rehearse", "leaks", "threads"})


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fdtrace")
@click.pass_context
def main(context: click.Context) -> None:
    """Trace sockets, FD exhaustion (EMFILE/ENFILE), threads and OOM kills with eBPF."""
    if context.invoked_subcommand in LIVE_COMMANDS:
        from fdtrace.sources.memory import arrow_allocates_from_system

        arrow_allocates_from_system()


for command in (trace, record, info, top, replay, doctor, export, report, run, leaks, threads, compact,
                trace_export, rehearse, service, scale):
    main.add_command(command)
