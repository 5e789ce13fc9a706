"""`fdtrace top --prometheus URL`: the fleet from a Prometheus server, hosts ranked by failures
and least headroom; Enter opens a host's processes."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from fdtrace.display import shown
from fdtrace.sources.prometheus_fleet import ProcessRow, PrometheusFleet
from fdtrace.tui import columns as registry
from fdtrace.tui.columns import HOST_COLUMNS, Column, fleet_cells, fleet_columns


def _process_key(process: ProcessRow) -> tuple[Any, ...]:
    shares = [s for s in (process.fd_usage, process.thread_usage) if s is not None]
    return (process.emfile_recent <= 0, -max(shares, default=0.0), process.pid)


class HostScreen(Screen[None]):
    """One host's processes, failing first, then by the share of a limit they use."""

    BINDINGS = [Binding("escape,q", "app.pop_screen", "Back")]

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host
        self.drawn = False  # on_mount has made the table's columns

    def compose(self) -> ComposeResult:
        yield Static(id="host-title")
        yield DataTable(id="host-processes", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#host-processes", DataTable)
        app = self.app
        assert isinstance(app, FleetApp)
        for column in app.columns:
            table.add_column(column.label, key=column.key, width=column.fleet_width or column.width)
        self.drawn = True
        self.refresh_rows()

    def refresh_rows(self) -> None:
        """Redraw from what the app last read (once its table has its columns: a refresh that ends
        between Enter and the screen's mount is drawn by ``on_mount``)."""
        if not self.drawn:
            return
        app = self.app
        assert isinstance(app, FleetApp)
        host = app.fleet.hosts.get(self.host)
        title = self.query_one("#host-title", Static)
        table = self.query_one("#host-processes", DataTable)
        table.clear()
        if host is None:
            title.update(Text(f"{shown(self.host)}: no longer in the fleet's metrics"))
            return
        title.update(Text(f"{shown(self.host)}: {len(host.processes)} processes, "
                          f"{host.emfile_recent:,.0f} EMFILE/ENFILE in the last {app.fleet.window}", style="bold"))
        for process in sorted(host.processes.values(), key=_process_key):
            cells = fleet_cells(process, app.columns)
            table.add_row(*(cells[column.key] for column in app.columns), key=str(process.pid))


class FleetApp(App[None]):
    """Hosts ranked worst first, refreshed every ``interval_s``."""

    TITLE = "fdtrace fleet"
    CSS = "#status, #host-title {height: 1; padding: 0 1; background: $boost;} DataTable {height: 1fr;}"
    BINDINGS = [Binding("q", "quit", "Quit"), Binding("r", "refresh_now", "Refresh")]

    def __init__(self, fleet: PrometheusFleet, interval_s: float = 5.0,
                 columns: tuple[Column, ...] | None = None) -> None:
        super().__init__()
        #: A host's process columns (``columns.COLUMNS`` unless given).
        self.columns = fleet_columns(registry.COLUMNS if columns is None else columns)
        self.fleet = fleet
        self.interval_s = interval_s
        self.polled_at: float | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield DataTable(id="hosts", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#hosts", DataTable)
        for column in HOST_COLUMNS:
            table.add_column(column.label, key=column.key, width=column.width)
        self.query_one("#status", Static).update(f"reading {self.fleet.url} ...")
        self.poll_fleet()

    @work(thread=True, exclusive=True, group="fleet")
    def poll_fleet(self) -> None:
        """Read the fleet now and every interval after, on a thread (a query may take seconds)."""
        from textual.worker import get_current_worker

        worker = get_current_worker()
        while not worker.is_cancelled:
            self.fleet.poll()
            self.call_from_thread(self.redraw)
            deadline = time.monotonic() + self.interval_s
            while time.monotonic() < deadline and not worker.is_cancelled:
                time.sleep(0.1)

    def action_refresh_now(self) -> None:
        """r: read the fleet again now."""
        self.poll_fleet()

    def redraw(self) -> None:
        """The status line and the hosts, keeping the cursor's row."""
        self.polled_at = time.time()
        hosts = self.fleet.ranked()
        failing = sum(1 for h in hosts if h.emfile_recent > 0 or h.oom_kills_recent > 0)
        status = Text(f"{self.fleet.url}  │  {len(hosts)} hosts, {failing} failing in the last {self.fleet.window}  "
                      f"│  {time.strftime('%H:%M:%S', time.gmtime(self.polled_at))} UTC")
        if self.fleet.error:
            status.append(f"  │  {shown(self.fleet.error)} (showing the last answer)", style="bold red")
        self.query_one("#status", Static).update(status)
        table = self.query_one("#hosts", DataTable)
        row = table.cursor_row
        table.clear()
        for host in hosts:
            table.add_row(*(column.cell(host) for column in HOST_COLUMNS), key=host.host)
        if hosts:
            table.move_cursor(row=min(row, len(hosts) - 1))
        if isinstance(self.screen, HostScreen):
            self.screen.refresh_rows()

    @on(DataTable.RowSelected, "#hosts")
    def open_host(self, message: DataTable.RowSelected) -> None:
        """Enter: the host's processes."""
        if message.row_key.value is not None:
            self.push_screen(HostScreen(str(message.row_key.value)))
