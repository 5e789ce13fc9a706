"""The detail and help screens."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Label, Sparkline, Static

from fdtrace.tui.adapters import chart_title, process_detail
from fdtrace.tui.columns import Column, help_lines

if TYPE_CHECKING:
    from fdtrace.tui.app import FdtraceApp

HELP_HEAD = """\
[b]fdtrace[/b]: who is closest to an FD limit, what fails, since when, how fast.

[b]Process table[/b], sorted by headroom: those that failed first (EMFILE/ENFILE, an OOM kill,
Go's thread limit, a kill), ended or not; then the live ones, nearest an FD or memory cgroup
limit first; then those that ended without failing
"""
HELP_KEYS = """\

[b]Keys[/b]
  enter  details of the selected process     /  filter by name, pid, unit or container
  escape clears the filter (the header shows it while it is on)
  d      (in the details) doctor's checks of the process: its limits and what to change
  e      non-zero exits in the log too
  s      next sort order     r  reverse it    p  freeze the view (collection goes on)
  f      follow the selected process          g G  first/last row (home, end)
  R      start/stop recording (live)          ?  this help          q  quit
[b]Replay[/b]
  space  pause/play    + -  faster/slower    n N  next/previous EMFILE, OOM kill, kill
  [ ]    10 s back/forward                  { }  60 s back/forward
"""


def help_text(columns: Iterable[Column]) -> str:
    """The help screen: what the table shows, a line for each column that has one, then the keys."""
    return HELP_HEAD + help_lines(columns) + HELP_KEYS


class DoctorScreen(Screen[None]):
    """Doctor's checks of one running process: its limits, where they are set, and what to change
    (the same table `fdtrace doctor --pid PID` prints), read on a worker thread."""

    BINDINGS = [Binding("escape,q,d", "app.pop_screen", "Back")]

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(f"doctor: checking pid {self.pid} ...", id="doctor")
        yield Footer()

    def on_mount(self) -> None:
        self.run_worker(self._check, thread=True)

    def _check(self) -> None:
        from rich.text import Text

        from fdtrace.display import shown_lines
        from fdtrace.doctor.checks import Doctor
        from fdtrace.doctor.report import as_table

        checks = Doctor().process_checks(self.pid)
        text = as_table(checks) if checks else f"pid {self.pid} is gone: run fdtrace doctor --from a recording of it"
        self.app.call_from_thread(self.query_one("#doctor", Static).update, Text(shown_lines(text)))


class ProcessScreen(Screen[None]):
    """One process: FDs against its limit over time, rates, errors by syscall, threads, limits."""

    BINDINGS = [Binding("escape,q", "app.pop_screen", "Back"), Binding("d", "doctor", "Doctor")]

    def action_doctor(self) -> None:
        """d: doctor's checks of this process (live only: a replay's process is not running)."""
        app: FdtraceApp = self.app  # type: ignore[assignment]
        if not app.controls.running:
            self.notify(f"doctor's checks read a running process: fdtrace doctor --pid {self.pid} --from DIR "
                        "checks one from a recording", markup=False)
            return
        app.push_screen(DoctorScreen(self.pid))

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid

    def compose(self) -> ComposeResult:
        yield Label("open FDs", id="fd-title", classes="chart-title")
        yield Sparkline([], id="fd-chart")
        yield Label("threads", id="thread-title", classes="chart-title")
        yield Sparkline([], id="thread-chart")
        with VerticalScroll():
            yield Static(id="detail")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_detail()
        self.set_interval(0.5, self.refresh_detail)

    def refresh_detail(self) -> None:
        """Redraw from the app's current state."""
        app: FdtraceApp = self.app  # type: ignore[assignment]
        view = app.state.processes.get(self.pid)
        if view is None:
            self.query_one("#detail", Static).update(f"pid {self.pid}: no longer known")
            return
        fds = [v for _, v in view.history]
        threads = [v for _, v in view.thread_history]
        self.query_one("#fd-title", Label).update(chart_title("open FDs, one sample a second", fds, view.fd_soft_limit))
        self.query_one("#thread-title", Label).update(chart_title("threads", threads))
        self.query_one("#fd-chart", Sparkline).data = [float(v) for v in fds] or [0.0]
        self.query_one("#thread-chart", Sparkline).data = [float(v) for v in threads] or [0.0]
        self.query_one("#detail", Static).update(process_detail(view, app.state.boot_wall_ns,
                                                                      app.state.site_names))


class HelpScreen(ModalScreen[None]):
    """Keys and columns."""

    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "Close")]

    def __init__(self, columns: Iterable[Column]) -> None:
        super().__init__()
        self.text = help_text(columns)

    def compose(self) -> ComposeResult:
        yield Static(self.text, id="help")
