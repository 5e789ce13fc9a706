"""The process columns are declared once (fdtrace.tui.columns): a column added to a copy of the
registry shows in `top`'s table (its header and a row's cell), among its sort orders, in its help
screen, and in the fleet view's process table, with no other change."""

from __future__ import annotations

import asyncio
import socket

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from fdtrace.sources.prometheus_fleet import HostRow, ProcessRow, PrometheusFleet
from fdtrace.sources.replay import ReplaySource
from fdtrace.tui import columns as registry
from fdtrace.tui.app import FdtraceApp
from fdtrace.tui.columns import Column
from fdtrace.tui.fleet import FleetApp, HostScreen
from tests.tui.test_app import PIDS, FakeClock, cell, play_to_end, run, table_pids

#: A made-up column: the pid, marked, in both views; sorted by pid, highest first.
TEST_COLUMN = Column("test", "TEST", 8, cell=lambda v: f"t{v.pid}", sort=lambda v: -v.pid,
                     help="a made-up column of the test", fleet_cell=lambda p: f"t{p.pid}")


@pytest.fixture
def extended(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "COLUMNS", (*registry.COLUMNS, TEST_COLUMN))


def labels(table: DataTable[object]) -> list[str]:
    return [str(column.label) for column in table.columns.values()]


def test_a_column_added_to_the_registry_shows_in_tops_table_sorts_and_help(extended: None) -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
        await play_to_end(pilot, clock, feed)
        table = app.query_one("#processes", DataTable)
        assert labels(table)[-2:] == ["ALERTS", "TEST"]
        pid = PIDS["emfile-child"]
        assert cell(app, pid, "test") == f"t{pid}" and cell(app, pid, "use") == "100%"
        assert list(app.sorts)[-1] == "test"
        for _ in app.sorts:  # s cycles to the new order; a click on its header sorts by it too
            if app.sort == "test":
                break
            await pilot.press("s")
        await pilot.pause(0.2)
        assert app.sort == "test" and "sort: TEST" in str(app.query_one("#system", Static).render())
        live = [p for p in table_pids(app) if not app.state.processes[p].failed and not app.state.processes[p].ended]
        assert len(live) > 1 and live == sorted(live, reverse=True)
        await pilot.press("question_mark")
        await pilot.pause(0.1)
        shown = str(app.screen.query_one("#help", Static).render())
        assert "  TEST               a made-up column of the test" in shown.splitlines()

    run(scenario)


def test_a_column_added_to_the_registry_shows_in_the_fleet_view(extended: None) -> None:
    with socket.socket() as probe:  # a port nothing listens on: the fleet keeps the hosts it has
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    app = FleetApp(PrometheusFleet(url, host_label="host"), interval_s=60.0)

    async def scenario() -> None:
        async with app.run_test(size=(200, 30)) as pilot:
            for _ in range(100):  # its first read (refused) is drawn: the next is a minute away
                if app.polled_at is not None:
                    break
                await pilot.pause(0.05)
            assert app.polled_at is not None and app.fleet.error is not None
            app.fleet.hosts = {"alpha": HostRow("alpha", processes={
                4242: ProcessRow(4242, "worker", open_fds=48, fd_soft_limit=64, threads=3)})}
            app.redraw()
            app.push_screen(HostScreen("alpha"))
            await pilot.pause(0.2)
            table = app.screen.query_one("#host-processes", DataTable)
            assert labels(table) == ["PID", "COMM", "FDS / SOFT LIMIT", "USE", "EMFILE/ENFILE", "THR", "THREAD LIMIT",
                                     "THR USE", "TEST"]
            row = [str(value) for value in table.get_row_at(0)]
            assert row[0] == "4242" and row[2:4] == ["48/64", "75%"] and row[-1] == "t4242"

    asyncio.run(scenario())


def test_without_the_extra_column_the_views_have_their_usual_columns() -> None:
    """The registry as shipped: `top` shows 15 columns (the fleet-only ones are not among them) and
    s cycles headroom, then the columns' orders, EMFILE/ENFILE per second right after EMFILE/ENFILE."""
    top = registry.top_columns(registry.COLUMNS)
    assert [c.label for c in top][-1] == "ALERTS" and len(top) == 15
    assert list(registry.sorts(top)) == ["headroom", "pid", "comm", "fds", "mem", "sockets", "socket_s", "accept_s",
                                         "connect_s", "close_s", "emfile", "emfile_s", "threads", "threads_s", "tte"]
    assert [c.key for c in registry.fleet_columns(registry.COLUMNS)] == [
        "pid", "comm", "fds", "use", "emfile", "threads", "limit", "thr_use"]


def test_a_refresh_while_a_host_opens_and_while_it_is_shown_draws_it() -> None:
    """A read of the fleet that ends between Enter and the host screen's mount, and one while it is
    shown, redraw it (the first used to raise NoMatches from a table not yet composed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    app = FleetApp(PrometheusFleet(url, host_label="host"), interval_s=60.0)

    async def scenario() -> None:
        async with app.run_test(size=(200, 30)) as pilot:
            for _ in range(100):
                if app.polled_at is not None:
                    break
                await pilot.pause(0.05)
            app.fleet.hosts = {"alpha": HostRow("alpha", processes={
                4242: ProcessRow(4242, "worker", open_fds=48, fd_soft_limit=64, threads=3)})}
            app.push_screen(HostScreen("alpha"))
            app.redraw()  # before the screen is mounted
            await pilot.pause(0.2)
            app.fleet.hosts["alpha"].processes[4343] = ProcessRow(4343, "other", open_fds=8, fd_soft_limit=64,
                                                                  threads=1)
            app.redraw()  # while it is shown
            await pilot.pause(0.1)
            table = app.screen.query_one("#host-processes", DataTable)
            assert sorted(str(table.get_row_at(i)[0]) for i in range(table.row_count)) == ["4242", "4343"]

    asyncio.run(scenario())
