"""What the commands share: one-line errors, option checks, and starting a live pipeline."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

import click

from fdtrace.display import shown, shown_lines
from fdtrace.errors import FdtraceError
from fdtrace.pipeline import Pipeline, Stop, Update

if TYPE_CHECKING:
    from fdtrace.analysis.engines.dataset import EngineRecording, Recording
    from fdtrace.sources.live import LiveSource


def say(text: str, err: bool = False, nl: bool = True) -> None:
    """Write lines to the terminal (stdout, or stderr with ``err``): anything unprintable in them
    but their own line breaks is shown as an escape (names come from processes and recordings)."""
    click.echo(shown_lines(text), err=err, nl=nl)


def end_now(code: int = 0) -> NoReturn:
    """End a live command whose pipeline is closed (its sinks flushed, its probes handed to the
    detaching helper) at once, without the interpreter's teardown: freeing the live view's
    objects one by one took over a second on a busy host, while `q` should end `top` at once."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fail(error: FdtraceError) -> NoReturn:
    """Print an error as one line and exit with its code."""
    click.echo(f"fdtrace: error: {shown(str(error))}", err=True)
    sys.exit(error.exit_code)


def note(text: str) -> None:
    """One line for the user on stderr."""
    click.echo(f"fdtrace: {shown(text)}", err=True)


def parse_size(text: str) -> int:
    """Bytes from a size such as 4096, 500K, 500M or 2G (powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = text.strip().upper().rstrip("IB"), ""
    if number and number[-1] in units:
        number, unit = number[:-1], number[-1]
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use e.g. 500M or 2G)") from None
    if value <= 0:
        raise ValueError(f"not a positive size: {text!r}")
    return int(value * units[unit])


def check_trace_options(pids: tuple[int, ...], follow: bool, ring_pages: int, max_stacks: int = 1,
                        max_fds: int = 1) -> None:
    """The options every tracing command shares, checked before anything is compiled."""
    if max_stacks < 1 or max_fds < 1:
        fail(FdtraceError("--max-stacks and --max-tracked-fds must be positive"))
    if ring_pages < 1 or ring_pages & (ring_pages - 1):
        fail(FdtraceError("--ring-pages must be a power of two"))
    if follow and not pids:
        fail(FdtraceError("--follow follows the processes of --pid: give at least one"))


class StartupProgress:
    """The line that says what fdtrace is doing while it starts (bcc compiles for seconds): on a
    terminal, one line redrawn with the step and the seconds so far, cleared at the end. Not on
    a terminal it says nothing (logs and pipes get the result, and an error stays one line)."""

    TICK_S = 0.2

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._stage = ""
        self._began = time.monotonic()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._ticker: threading.Thread | None = None

    def stage(self, text: str) -> None:
        """A new step begins."""
        with self._lock:
            self._stage = text
        if not self.tty:
            return
        if self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="fdtrace-startup", daemon=True)
            self._ticker.start()
        self._draw()

    def _draw(self) -> None:
        with self._lock:
            if self._done.is_set():
                return
            seconds = time.monotonic() - self._began
            self.stream.write(f"\r\033[Kfdtrace: {shown(self._stage)}... {seconds:.1f} s")
            self.stream.flush()

    def _tick(self) -> None:
        while not self._done.wait(self.TICK_S):
            self._draw()

    def __enter__(self) -> StartupProgress:
        return self

    def __exit__(self, *_exc: object) -> None:
        with self._lock:
            self._done.set()
            if self.tty and self._stage:
                self.stream.write("\r\033[K")
                self.stream.flush()
        if self._ticker is not None:
            self._ticker.join()


def live_without_pandas() -> None:
    """Tell pyarrow, before its first use, that this process has no pandas: the live commands
    never hand it a DataFrame, and its first conversion would otherwise import pandas to look for
    one, half of the CPU second a start takes (bench/startup). Only for commands that read no
    recording (a replay, a report, doctor --from convert to pandas)."""
    import importlib.abc
    import sys

    if "pandas" in sys.modules:
        return

    class _NoPandas(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> None:
            if name == "pandas" or name.startswith("pandas."):
                raise ImportError(f"{name} is not imported by fdtrace's live commands")

    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    try:
        import pyarrow as pa

        pa.array([0])  # pyarrow looks for pandas once, at its first conversion: now, and finds none
    finally:
        sys.meta_path.remove(blocker)


def start_live(source: LiveSource) -> None:
    """Start a live source with the start-up line shown; any problem is one line and an exit."""
    failed = None
    with StartupProgress() as progress:
        source.on_stage = progress.stage
        try:
            source.start()
        except FdtraceError as error:
            failed = error
    if failed is not None:  # after the start-up line is cleared
        source.stop()
        fail(failed)


def start(pipeline: Pipeline, echo_notes: bool = True) -> None:
    """Start a pipeline over the live source; any problem is one line and an exit."""
    from fdtrace.sources.live import LiveSource

    failed = None
    with StartupProgress() as progress:
        if isinstance(pipeline.source, LiveSource):
            pipeline.source.on_stage = progress.stage
        try:
            pipeline.start()
        except FdtraceError as error:
            failed = error
    if failed is not None:
        fail(failed)
    if echo_notes and isinstance(pipeline.source, LiveSource):
        for text in pipeline.source.notes:
            note(text)


def run(pipeline: Pipeline, stop: Stop) -> Update:
    """Run a started pipeline to its end; a failing sink is one line and an exit."""
    try:
        return pipeline.run(stop)
    except FdtraceError as error:
        fail(error)


def with_placement(pids: tuple[int, ...], cgroup: str | None, unit: str | None,
                   container: str | None, cgroupfs: Path = Path("/sys/fs/cgroup")) -> tuple[int, ...]:
    """``pids`` and the processes now in the cgroups that ``--cgroup``, ``--unit`` and
    ``--container`` name (traced with their descendants: ``--follow``); none found is one line."""
    from fdtrace.procfs.containers import matching_pids

    if container is not None and len(container) < 12:
        fail(FdtraceError(f"--container {container!r}: give at least the id's first 12 characters"))
    found, cgroups = matching_pids(cgroupfs, cgroup=cgroup, unit=unit, container=container)
    asked = ", ".join(f"--{name} {value}" for name, value in (("cgroup", cgroup), ("unit", unit),
                                                               ("container", container)) if value is not None)
    if not found:
        fail(FdtraceError(f"{asked}: no process in a matching cgroup under {cgroupfs}"
                          + (f" (matched {', '.join(cgroups[:3])}, empty)" if cgroups else "")))
    return tuple(sorted({*pids, *found}))


def placement_options(command: Any) -> Any:
    """--cgroup, --unit and --container: trace the processes of a cgroup, a systemd unit or a
    container (and the processes they start), as --pid with --follow would."""
    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        cgroup, unit, container = (kwargs.pop(name) for name in ("cgroup", "unit", "container"))
        if cgroup is not None or unit is not None or container is not None:
            kwargs["pids"] = with_placement(kwargs["pids"], cgroup, unit, container)
            kwargs["follow"] = True
        return command(**kwargs)

    for option in (
        click.option("--container", default=None, metavar="ID",
                     help="Only the processes of this container (docker, containerd, cri-o, podman: its id, 12 "
                          "characters or more) and those they start."),
        click.option("--unit", default=None, help="Only the processes of this systemd unit and those they start."),
        click.option("--cgroup", default=None, metavar="PATH",
                     help="Only the processes of this cgroup (a path from the root of the cgroup tree) and below."),
    ):
        wrapper = option(wrapper)
    return wrapper


#: Options of every command that traces: (decorators, in order).
pid_option = click.option("--pid", "pids", type=int, multiple=True, help="Only these processes (repeatable).")
follow_option = click.option(
    "-f", "--follow", is_flag=True,
    help="With --pid: also the processes they start from now on, and theirs (a job's workers).")
ring_pages_option = click.option("--ring-pages", type=int, default=4096, show_default=True,
                                 help="Ring buffer size in pages (a power of two).")
duration_option = click.option("--duration", type=float, default=None, help="Stop after this many seconds.")


def stacks_options(command: Any) -> Any:
    """--stacks and the sizes of its kernel tables."""
    command = click.option("--max-tracked-fds", "max_fds", type=int, default=262144, show_default=True,
                           help="With --stacks: descriptors remembered at once (more: fds_full).")(command)
    command = click.option("--max-stacks", type=int, default=16384, show_default=True,
                           help="With --stacks: distinct stacks kept (more are counted as stacks_full).")(command)
    return click.option(
        "--stacks", is_flag=True,
        help="Take the user stack of every EMFILE/ENFILE, failed connect/accept and thread creation, and "
             "remember which call site made each descriptor (see `fdtrace leaks`).")(command)


def engine_options(command: Any) -> Any:
    """--engine, --spark-master, --memory-limit and --no-clock-correction: where a command's
    analyses run, and on which clock."""
    command = click.option("--no-clock-correction", is_flag=True,
                           help="Leave each host's times as its own clock gave them (by default the hosts are put "
                                "on one clock by the connections between them).")(command)
    command = click.option("--memory-limit", default=None, metavar="SIZE",
                           help="DuckDB's memory limit (e.g. 2GB); it spills to a private temporary folder beyond.")(
        command)
    command = click.option("--spark-master", default=None, metavar="URL",
                           help="With --engine spark: the cluster (spark://HOST:7077); local[2] by default, "
                                "Spark Connect when SPARK_REMOTE is set.")(command)
    return click.option("--engine", type=click.Choice(["auto", "pandas", "duckdb", "spark"]), default="auto",
                        show_default=True,
                        help="Where the analysis runs: pandas (in memory), DuckDB over the Parquet files (out of "
                             "core), Spark; auto: pandas for small recordings, DuckDB for large ones.")(command)


def open_recordings(directories: tuple[str, ...], engine: str, spark_master: str | None,
                    memory_limit: str | None, no_clock_correction: bool = False,
                    columns: dict[str, list[str]] | None = None,
                    phases: list[str] | None = None) -> Recording | EngineRecording:
    """Recordings or a fleet, opened once in the chosen engine
    (``fdtrace.analysis.engines.dataset.open_dataset``); a bad recording, or an engine that cannot
    do what is asked, fails with one line."""
    from fdtrace.analysis.engines.dataset import open_dataset

    try:
        return open_dataset(list(directories), engine, columns=columns, phases=list(phases or ()) or None,
                            spark_master=spark_master, memory_limit=memory_limit,
                            clock_correction=not no_clock_correction)
    except FdtraceError as error:
        fail(error)


def view_terminal() -> int | None:
    """The terminal a view draws on. Textual draws on stderr; when stderr is redirected (`top
    2>log`), the terminal it was started from: stdout's, else /dev/tty. Returns a descriptor to
    draw on (None: stderr itself); fails with why when there is no terminal at all."""
    import os

    if os.isatty(2):
        return None
    if os.isatty(1):
        return os.dup(1)
    try:
        return os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        fail(FdtraceError(f"the view draws on a terminal, and there is none: stderr and stdout are redirected and "
                          f"/dev/tty cannot be opened ({exc.strerror}); run it in a terminal, or use "
                          "`fdtrace record`/`trace` for output to files"))


class DrawnOn:
    """While the view runs, stderr is the terminal ``view_terminal()`` found; after it, stderr is
    given back (what fdtrace says at the end goes where it was redirected)."""

    def __init__(self, terminal: int | None) -> None:
        self.terminal = terminal
        self.saved = -1

    def __enter__(self) -> DrawnOn:
        import os

        if self.terminal is not None:
            sys.stderr.flush()
            self.saved = os.dup(2)
            os.dup2(self.terminal, 2)
            os.close(self.terminal)
        return self

    def __exit__(self, *exc: object) -> None:
        import os

        if self.saved >= 0:
            sys.stderr.flush()
            os.dup2(self.saved, 2)
            os.close(self.saved)
