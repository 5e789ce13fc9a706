"""The live view: `fdtrace top` over the kernel, `fdtrace replay` over a recording, one UI."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.widgets import DataTable, Footer, Input, RichLog, Static

from fdtrace.display import shown
from fdtrace.pipeline import Controls, Pipeline, SourceInfo, Stop, Update
from fdtrace.tui import columns as registry
from fdtrace.tui.adapters import (
    fresh_status,
    haproxy_line,
    log_line,
    phases_line,
    position_bar,
    round_note,
    system_line,
)
from fdtrace.tui.columns import Column, process_cells, sorts, top_columns
from fdtrace.tui.messages import FeedFailed, FeedUpdated
from fdtrace.tui.screens import HelpScreen, ProcessScreen
from fdtrace.tui.state import VIEW_SKIPPED, IncidentState, LogEntry, ProcessView, held_events

POLL_INTERVAL_S = 0.1  # at most ten redraws a second
#: The screen is redrawn at least this often from what has arrived, whether updates come or not
#: (a poll stuck on a busy host must show as data getting old, not as a frozen "live").
REDRAW_EVERY_S = 1.0
#: Rows drawn at most: the worst by the current sort; the filter reaches the others. Drawing
#: 5,000 rows took over 100 ms here, too slow for ten redraws a second; on a host that forks
#: thousands a second the rows change at every redraw, and 300 of them cost the UI thread
#: about 100 ms of CPU a redraw (its table laid out again): a screenful and more is kept.
MAX_ROWS = 100
#: Keys that act on a replay (hidden in the live view).
REPLAY_ACTIONS = frozenset({"toggle_play", "faster", "slower", "next_problem", "previous_problem", "next_failed_call",
                            "previous_failed_call", "seek"})


#: What the live view holds back at most while the app folds in an update: past this many events
#: it keeps half as many, the oldest common ones left out first (counted in the header's losses as
#: ``view_skipped``; a failed call, an end, an OOM kill and Go's thread limit are kept first); past
#: this many rounds the oldest two are merged into one (each process's latest sample). An event
#: takes about 190 bytes of Arrow here: 200,000 are 38 MB. Cut to half, a cut (80 ms for 250,000
#: events here) comes once per 100,000 events, not at every poll of a view that is behind.
MAX_HELD_EVENTS = 200_000
MAX_HELD_ROUNDS = 10


class ViewSink:
    """The live view as a sink of the pipeline: updates go to the app as messages, one at a time.
    While the app is still folding in the previous one (a burst of events, thousands of
    processes), the next updates are merged into one, so the app's queue never grows: the view
    falls behind by at most one update, and its memory stays within ``MAX_HELD_EVENTS`` and
    ``MAX_HELD_ROUNDS`` however long the app takes (a replay is held back whole: its counts come
    from its events alone, and its source is on disk). An urgent update (a round
    brought forward by a new failure: a few samples and the counters) is sent at once, ahead of
    those held back, so the failure is on screen as soon as the app has folded in what it is
    folding in now (the state takes rounds and events in any order: a failed call's count is the
    larger of the events' and the counters')."""

    name = "the live view"
    required = True

    def __init__(self, app: App[None]) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._pending: Update | None = None
        self._in_flight = False
        self._ahead = 0  # urgent updates sent while another was in flight, not applied yet
        self._live = False
        self._caught_up = False
        self.skipped = 0  # events left out while the app was behind (live)
        self.received = 0  # updates the pipeline has handed over, one per poll of the source

    def open(self, info: SourceInfo) -> None:
        """A live source's updates are held back within bounds."""
        self._live = info.live

    def write(self, update: Update) -> None:
        with self._lock:
            self.received += 1
            self._caught_up = not update.more
            if update.urgent and self._in_flight and not update.reset:
                self._ahead += 1
                message = self._message(update)
            else:
                self._pending = update if self._pending is None else self._bounded(self._pending.then(update))
                if self._in_flight:
                    return
                message, self._pending, self._in_flight = self._message(self._pending), None, True
        self.app.post_message(message)

    def _bounded(self, held: Update) -> Update:
        if not self._live:
            return held
        rounds = held.rounds
        while len(rounds) > MAX_HELD_ROUNDS:
            rounds = [rounds[0].then(rounds[1]), *rounds[2:]]
        events, skipped = held.events, 0
        if events.num_rows > MAX_HELD_EVENTS:
            events, skipped = held_events(events, MAX_HELD_EVENTS // 2)
        self.skipped += skipped
        return replace(held, events=events, rounds=rounds)

    def _message(self, update: Update) -> FeedUpdated:
        if self.skipped:
            update = replace(update, losses={**update.losses, VIEW_SKIPPED: self.skipped})
        return FeedUpdated(update)

    def applied(self) -> None:
        """The app has folded in an update: once none is in flight, send what came since, if
        anything."""
        with self._lock:
            if self._ahead:
                self._ahead -= 1
                return
            if self._pending is None:
                self._in_flight = False
                return
            message, self._pending = self._message(self._pending), None
        self.app.post_message(message)

    @property
    def settled(self) -> bool:
        """The app has folded in every update handed over, and the source's last poll left no
        backlog."""
        with self._lock:
            return self._caught_up and not self._in_flight and self._pending is None and not self._ahead

    def close(self, failed: bool = False) -> None:
        """The app closes itself."""


class FdtraceApp(App[None]):
    """Process table, system header and event log, fed by a pipeline polled on a worker thread.

    Args:
        pipeline: the started source, fanned out to the view (and to what the controls attach).
        controls: what the keys that depend on the source do (replay's time keys, R).
        keep_exited_s: how long a process that ended stays in the table.
    """

    CSS_PATH = "app.tcss"
    TITLE = "fdtrace"
    BINDINGS = [
        # Checked as the key reaches the app, before the focused widget: otherwise q passes the
        # app's queue up to three times on its way (app, table, back up), each time behind an
        # update being folded in, and took 2.5 s to quit a flooded host's view.
        Binding("q", "quit", "Quit", priority=True),
        Binding("s", "next_sort", "Sort"),
        Binding("slash", "filter", "Filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("p", "freeze", "Freeze"),
        Binding("f", "follow", "Follow"),
        Binding("home,g", "first_row", "First", show=False),
        Binding("end,G", "last_row", "Last", show=False),
        Binding("R", "record", "Record", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("r", "reverse_sort", "Reverse", show=False),
        Binding("e", "toggle_exits", "Exits", show=False),
        Binding("space", "toggle_play", "Play/pause"),
        Binding("plus", "faster", "Faster"),
        Binding("minus", "slower", "Slower"),
        Binding("n", "next_problem", "Next incident"),
        Binding("N", "previous_problem", "Prev incident"),
        Binding("greater_than_sign", "next_failed_call", "Next failed call", show=False),
        Binding("less_than_sign", "previous_failed_call", "Prev failed call", show=False),
        Binding("left_square_bracket", "seek(-10)", "-10s"),
        Binding("right_square_bracket", "seek(10)", "+10s"),
        Binding("left_curly_bracket", "seek(-60)", "-60s", show=False),
        Binding("right_curly_bracket", "seek(60)", "+60s", show=False),
    ]

    def __init__(self, pipeline: Pipeline, controls: Controls, keep_exited_s: float = 300.0,
                 columns: tuple[Column, ...] | None = None) -> None:
        super().__init__()
        #: The process table's columns (``columns.COLUMNS`` unless given) and the sorts they make.
        self.columns = top_columns(registry.COLUMNS if columns is None else columns)
        self.sorts = sorts(self.columns)
        self.keep_exited_ns = int(keep_exited_s * 1e9)
        self.pipeline = pipeline
        self.controls = controls
        self.state = IncidentState(keep_exited_ns=self.keep_exited_ns)
        self.sort = "headroom"
        self.reverse = False
        self.text_filter = ""
        self.frozen = False
        self.followed_pid: int | None = None
        self._shown_keys: list[str] = []
        self._shown_cells: dict[str, dict[str, Any]] = {}
        self._log_shown = 0
        self._log_rebuild = False
        self.show_exits = False
        self._last_roll_ns: int | None = None
        self._applied_mono: float | None = None  # when the last update was folded in
        self._applied_lag_s = 0.0  # how old its data already was then (a live source's poll time)
        self._quitting = False  # q pressed: no update is folded in any more
        self._round_note = ""  # a live source's last /proc round, when it ran out of time

    def compose(self) -> ComposeResult:
        yield Static(id="system")
        yield Static(id="haproxy")
        yield Static(id="phases")
        yield DataTable(id="processes", cursor_type="row", zebra_stripes=True)
        yield Static(id="position")
        yield RichLog(id="log", max_lines=2000)
        yield Input(placeholder="filter by name or pid; escape clears", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#processes", DataTable)
        for column in self.columns:
            table.add_column(column.label, key=column.key, width=column.width)
        if self.controls.playback:
            self.sub_title = ("replay: space play/pause, +/- speed, n/N next/previous incident, < > failed call, "
                              "[ ] seek")
        skipped = list(self.controls.skipped)
        if skipped:
            some = "; ".join(skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
            self.notify(f"skipped {len(skipped)} unreadable files: {shown(some)}", severity="warning",
                        timeout=30, markup=False)
        self.view_sink = ViewSink(self)
        self.pipeline.attach(self.view_sink)
        self.poll_feed()
        self.set_interval(REDRAW_EVERY_S, self._tick)

    def _tick(self) -> None:
        """Once a second: redraw from what has arrived (the header says how old it is)."""
        if not self.frozen:
            self.redraw()

    def data_age_s(self) -> float | None:
        """How old the data shown is: the time since the last update was folded in, plus how old
        its data was when it came (a live source stamps each update with the wall time of its
        poll). None before the first update."""
        if self._applied_mono is None:
            return None
        return time.monotonic() - self._applied_mono + self._applied_lag_s

    def on_unmount(self) -> None:
        self.pipeline.close(quitting=getattr(self, "view_sink", None))  # the poll below stops at its next turn

    # The pipeline, polled on a thread; updates come back as messages.

    @work(thread=True, exclusive=True, group="feed")
    def poll_feed(self) -> None:
        """Poll the pipeline every 100 ms until the view quits; the view's sink posts what it gives."""
        from textual.worker import get_current_worker

        worker = get_current_worker()
        try:
            self.pipeline.poll_until(Stop(condition=lambda: worker.is_cancelled, signals=False), POLL_INTERVAL_S)
        except Exception as exc:  # the source died: say so in the UI rather than vanish
            self.post_message(FeedFailed(" ".join(str(exc).split()) or type(exc).__name__))

    async def action_quit(self) -> None:
        """q: end the view. Updates queued or still coming are not folded in any more (on a
        flooded host each took a fraction of a second, and the view went on taking them)."""
        self._quitting = True
        self.exit()

    @on(FeedUpdated)
    async def apply_update(self, message: FeedUpdated) -> None:
        """Fold an update into the state and redraw (unless frozen); then take the next."""
        if self._quitting:
            return
        try:
            self._apply(message.update)
            # A turn of the event loop before the next update is queued: the keys the terminal
            # sent meanwhile get in first. Without it, on a flooded host, the app's queue was never
            # empty, its loop never yielded, and q waited seconds (or for ever) behind the folds.
            await asyncio.sleep(0)
        finally:
            self.view_sink.applied()

    def _apply(self, update: Update) -> None:
        self._applied_mono = time.monotonic()
        info = self.pipeline.source.info
        self._applied_lag_s = max(0.0, (time.time_ns() - update.now_ns) / 1e9) if info.live else 0.0
        if update.reset:
            self.state = IncidentState(keep_exited_ns=self.keep_exited_ns)
            self._last_roll_ns = None
            self._log_shown = 0
            self.query_one("#log", RichLog).clear()
            if update.baseline is not None:  # a replay's jump: the totals before its window
                self.state.apply_baseline(update.baseline)
        if update.boot_wall_ns is not None:
            self.state.boot_wall_ns = update.boot_wall_ns
        if update.phases is not None:
            self.state.apply_phases(update.phases)
        self.state.apply_events(update.events)
        if update.stacks:
            self.state.apply_stacks(update.stacks)
        for sample_round in update.rounds:
            self.state.apply_samples(sample_round.samples, sample_round.time_ns)
            if sample_round.threads:
                self.state.apply_census(sample_round.threads)
            if sample_round.fd_sites:
                self.state.apply_fd_sites(sample_round.fd_sites, sample_round.time_ns)
            if sample_round.system:
                self.state.apply_system(sample_round.system)
            if sample_round.haproxy:
                self.state.apply_haproxy(sample_round.haproxy, sample_round.time_ns)
            if sample_round.cost_s is not None:
                self._round_note = round_note(sample_round.cost_s, sample_round.unsampled)
        if update.counters is not None:  # live: failed calls with exact counts, ahead of their events
            self.state.apply_counters([*update.counters.live.values(), *update.counters.newly_exited],
                                      update.now_ns)
        if self._last_roll_ns is None or update.now_ns - self._last_roll_ns >= 1_000_000_000 or update.reset:
            self.state.roll(update.now_ns, update.losses)
            self._last_roll_ns = update.now_ns
        if not self.frozen:
            self.redraw()

    @on(FeedFailed)
    def feed_failed(self, message: FeedFailed) -> None:
        """Show why the feed stopped."""
        self.notify(f"the event feed stopped: {shown(message.error)}", severity="error", timeout=30, markup=False)

    # Drawing

    def redraw(self) -> None:
        """Header, table (rows updated by key) and new log lines."""
        status = self.status()
        if self._round_note:
            status += f", {self._round_note}"
        if self.state.forgotten:
            status += f", {self.state.forgotten:,} gone processes forgotten"
        rows, matching = self.state.top_rows(self.sorts[self.sort].order, self.text_filter, reverse=self.reverse,
                                             limit=MAX_ROWS)
        if matching > MAX_ROWS:
            status += f", showing {MAX_ROWS} of {matching} processes (/ filters)"
        try:
            header = self.query_one("#system", Static)
        except NoMatches:  # an update that arrived while the app was closing: nothing to draw on
            return
        sort = self.sorts[self.sort].label + (" reversed" if self.reverse else "")
        header.update(system_line(self.state.system, status, sort, self.frozen, self.text_filter))
        haproxy = self.query_one("#haproxy", Static)
        haproxy.display = bool(self.state.haproxy)
        if self.state.haproxy:
            haproxy.update(haproxy_line(list(self.state.haproxy.values()), self.state.now_ns))
        phases = self.query_one("#phases", Static)
        phases.display = bool(self.state.phases)
        if self.state.phases:
            phases.update(phases_line(self.state.phases, self.state.now_ns))
        self._redraw_table(rows)
        position = self.query_one("#position", Static)
        where = self.controls.position()
        position.display = where is not None
        if where is not None:
            position.update(position_bar(where.start_ns, where.end_ns, where.now_ns, where.problems_ns,
                                         max(self.size.width - 2, 20), where.incident))
        log = self.query_one("#log", RichLog)
        if self._log_rebuild:
            log.clear()
            entries = list(self.state.log)
            self._log_rebuild = False
        else:
            entries = self.state.new_log_entries(self._log_shown)
        for entry in entries:
            if self._log_shows(entry):
                log.write(log_line(entry))
        self._log_shown = self.state.logged

    def _log_shows(self, entry: LogEntry) -> bool:
        return (entry.severity != "exit" or self.show_exits) and entry.matches(self.text_filter)

    def action_toggle_exits(self) -> None:
        """e: show the non-zero exits in the event log too, or hide them again."""
        self.show_exits = not self.show_exits
        self._log_rebuild = True
        self.notify("the log shows non-zero exits" if self.show_exits else "the log hides non-zero exits")
        self.redraw()

    def status(self) -> str:
        """One line saying what the view shows: live (and recording), or where the replay is; a
        live view whose data is older than the source's interval says how old instead of live."""
        status = self.controls.status()
        if self.controls.playback:
            return status
        return fresh_status(status, self.data_age_s(), self.pipeline.source.info.interval_s)

    def _redraw_table(self, rows: list[ProcessView]) -> None:
        table = self.query_one("#processes", DataTable)
        keys = [str(view.pid) for view in rows]
        cells = {str(view.pid): process_cells(view, self.columns) for view in rows}
        with self.batch_update():
            if keys != self._shown_keys:
                row = table.cursor_row
                table.clear()
                for key in keys:
                    table.add_row(*(cells[key][c.key] for c in self.columns), key=key)
                # The cursor keeps its row (the worst process stays under it as the order
                # changes), unless a process is followed (f): then it stays on that process.
                if self.followed_pid is not None and str(self.followed_pid) in keys:
                    table.move_cursor(row=keys.index(str(self.followed_pid)))
                elif keys:
                    table.move_cursor(row=min(max(row, 0), len(keys) - 1))
            else:
                for key in keys:
                    before = self._shown_cells.get(key, {})
                    for column, value in cells[key].items():
                        if before.get(column) != value:
                            table.update_cell(key, column, value)
        self._shown_keys = keys
        self._shown_cells = cells

    def selected_pid(self) -> int | None:
        """The pid of the row under the cursor."""
        table = self.query_one("#processes", DataTable)
        if not table.row_count:
            return None
        row_key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
        return int(row_key.value) if row_key.value is not None else None

    # Actions

    @on(DataTable.RowSelected)
    def open_detail(self, message: DataTable.RowSelected) -> None:
        """Enter: the selected process's detail screen."""
        if message.row_key.value is not None:
            self.push_screen(ProcessScreen(int(message.row_key.value)))

    def action_reverse_sort(self) -> None:
        """Best first instead of worst first, within each group of rows (``IncidentState.rows``)."""
        self.reverse = not self.reverse
        self.redraw()

    def action_next_sort(self) -> None:
        keys = tuple(self.sorts)
        self.sort = keys[(keys.index(self.sort) + 1) % len(keys)]
        self.redraw()

    @on(DataTable.HeaderSelected)
    def sort_by_column(self, message: DataTable.HeaderSelected) -> None:
        """A click on a column's header sorts by it (USE and ALERTS: by headroom)."""
        key = str(message.column_key.value)
        self.sort = key if key in self.sorts else "headroom"
        self.redraw()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("visible")
        box.focus()

    @on(Input.Changed, "#filter")
    def filter_changed(self, message: Input.Changed) -> None:
        self.text_filter = message.value
        self._log_rebuild = True  # the filter applies to the log as well
        self.redraw()

    def action_clear_filter(self) -> None:
        """escape: clear the filter and hide its box, wherever the focus is on the main screen."""
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("visible")
        self.query_one("#processes", DataTable).focus()
        if self.text_filter:
            self.text_filter = ""
            self._log_rebuild = True
            self.redraw()

    @on(Input.Submitted, "#filter")
    def filter_done(self) -> None:
        self.query_one("#processes", DataTable).focus()

    def action_follow(self) -> None:
        """f: keep the cursor on the selected process as the order changes, or stop."""
        selected = self.selected_pid()
        if self.followed_pid is not None or selected is None:
            self.followed_pid = None
            self.notify("the cursor keeps its row")
        else:
            self.followed_pid = selected
            self.notify(f"following pid {selected}")

    def action_first_row(self) -> None:
        """Home or g: the first row."""
        self.query_one("#processes", DataTable).move_cursor(row=0)

    def action_last_row(self) -> None:
        """End or G: the last row."""
        table = self.query_one("#processes", DataTable)
        table.move_cursor(row=max(table.row_count - 1, 0))

    def action_freeze(self) -> None:
        self.frozen = not self.frozen
        self.redraw()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.columns))

    def action_record(self) -> None:
        """R: start recording what the view shows to a new directory, or stop (live)."""
        notice = self.controls.toggle_recording()
        self.notify(notice.text, severity=notice.severity, markup=False)

    # The replay's keys: they exist (and show in the footer) only where time can be moved.

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The replay's keys exist (and show in the footer) only in a replay. q quits from the
        process table; typed in the filter it is a letter, and on a screen above (a process, the
        help) that screen's q closes it."""
        if action == "quit":
            return len(self.screen_stack) == 1 and not isinstance(self.focused, Input)
        return self.controls.playback or action not in REPLAY_ACTIONS

    def action_toggle_play(self) -> None:
        self.controls.toggle_pause()

    def action_faster(self) -> None:
        self.controls.faster()

    def action_slower(self) -> None:
        self.controls.slower()

    def action_next_problem(self) -> None:
        if not self.controls.next_problem():
            self.notify("no incident (EMFILE, ENFILE, OOM kill, Go thread limit or crash) after this point")

    def action_previous_problem(self) -> None:
        if not self.controls.previous_problem():
            self.notify("no incident (EMFILE, ENFILE, OOM kill, Go thread limit or crash) before this point")

    def action_next_failed_call(self) -> None:
        if not self.controls.next_failed_call():
            self.notify("no EMFILE, ENFILE, OOM kill, Go thread limit or crash after this point")

    def action_previous_failed_call(self) -> None:
        if not self.controls.previous_failed_call():
            self.notify("no EMFILE, ENFILE, OOM kill, Go thread limit or crash before this point")

    def action_seek(self, seconds: int) -> None:
        self.controls.seek_by(seconds)


def make_app(pipeline: Pipeline, controls: Controls, keep_exited_s: float = 300.0) -> FdtraceApp:
    """The app over a pipeline whose source is started, with the controls its command built
    (``LiveControls`` for `top`, ``ReplayControls`` for `replay`; tests replay fixture
    recordings). ``keep_exited_s``: how long a process that ended stays in the table."""
    return FdtraceApp(pipeline, controls, keep_exited_s)
