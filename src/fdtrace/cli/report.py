"""`fdtrace report`: the postmortem page of recordings."""

from __future__ import annotations

from pathlib import Path

import click

from fdtrace.cli.common import engine_options, fail, note, open_recordings
from fdtrace.errors import FdtraceError
from fdtrace.safe_files import PRIVATE_FILE, SHARED_FILE, write_text_atomically


@click.command()
@click.argument("directories", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="report.html", show_default=True,
              help="The report file.")
@click.option("--format", "fmt", type=click.Choice(["html", "md"]), default=None,
              help="html (self-contained) or md; by default from the output's extension.")
@click.option("--phases", "phase_files", multiple=True, type=click.Path(dir_okay=False),
              help="Training phases to add: a file of `fdtrace run --phases-out`, or a PyTorch profiler "
                   "(Kineto) trace JSON, put on the recording's clock. Repeatable.")
@click.option("--shared", is_flag=True, help="Make the report readable by everyone (default: owner only).")
@engine_options
def report(directories: tuple[str, ...], output: str, fmt: str | None, phase_files: tuple[str, ...],
           shared: bool, engine: str, spark_master: str | None, memory_limit: str | None,
           no_clock_correction: bool) -> None:
    """A postmortem report of recordings: summary, timeline, spikes, FD headroom, incidents,
    losses and the limits to change."""
    from fdtrace.analysis.report import EVENT_COLUMNS, build, to_html, to_markdown

    fmt = fmt or ("md" if output.endswith(".md") else "html")
    if phase_files and engine not in ("auto", "pandas"):
        fail(FdtraceError(f"--phases needs --engine pandas (the {engine} engine reads phases from the recordings)"))
    with open_recordings(directories, engine, spark_master, memory_limit, no_clock_correction,
                         columns={"events": list(EVENT_COLUMNS)}, phases=list(phase_files)) as recording:
        try:
            content = build(recording)
        except FdtraceError as error:
            fail(error)
    from fdtrace.analysis.summary import named_problems

    for line in named_problems(recording):
        note(line)
    text = to_markdown(content) if fmt == "md" else to_html(content)
    try:
        write_text_atomically(Path(output), text, SHARED_FILE if shared else PRIVATE_FILE)
    except FdtraceError as error:  # its folder refused: another user's, or one they can change
        fail(error)
    except OSError as exc:
        fail(FdtraceError(f"{output}: cannot write the report ({exc.strerror})", exit_code=1))
    note(f"report written to {output}")


