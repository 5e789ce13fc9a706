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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fdtrace")
def main() -> None:
    """Trace sockets, FD exhaustion (EMFILE/ENFILE), threads and OOM kills with eBPF."""


for command in (trace, record, info, top, replay, doctor, export, report, run, leaks, threads, compact,
                trace_export, rehearse, service, scale):
    main.add_command(command)
