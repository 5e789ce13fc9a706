"""Pilot tests of what issue 25's newcomer met in `top`, driven by a replay of tests/data/newcomer
(made by fdtrace's own recorder): failed processes that ended, a never-sampled process's limits,
the filter and escape, and the failed calls a process's detail lists."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from fdtrace.analysis import load
from fdtrace.sources.replay import ReplaySource
from fdtrace.tui.app import FdtraceApp
from fdtrace.tui.screens import ProcessScreen
from tests.helpers import replay_app, replay_to_end

NEWCOMER = Path(__file__).parents[1] / "data" / "newcomer"
RECORDING = load(NEWCOMER)
EVENTS = RECORDING.events
PIDS = {comm: int(EVENTS[EVENTS["comm"] == comm]["pid"].iloc[0])
        for comm in ("burst-64", "go-threads", "clean-90", "haproxy", "steady-web")}
#: A grep of the loop: it lived between two /proc rounds, never sampled.
GREP = int(EVENTS[EVENTS["comm"] == "grep"]["pid"].iloc[-1])

Scenario = Callable[[FdtraceApp, Pilot[None]], Awaitable[None]]


def run_to_end(scenario: Scenario) -> None:
    clock = [0]
    feed = ReplaySource(NEWCOMER, clock=lambda: clock[0])
    app = replay_app(feed)

    async def main() -> None:
        async with app.run_test(size=(180, 40)) as pilot:
            await replay_to_end(pilot, feed, clock, step_ns=1_000_000_000)
            await scenario(app, pilot)

    asyncio.run(main())


def table_pids(app: FdtraceApp) -> list[int]:
    table = app.query_one("#processes", DataTable)
    return [int(table.get_row_at(i)[0]) for i in range(table.row_count)]


async def detail_of(app: FdtraceApp, pilot: Pilot[None], pid: int) -> str:
    app.push_screen(ProcessScreen(pid))
    await pilot.pause(0.3)
    text = str(app.screen.query_one("#detail", Static).render())
    await pilot.press("escape")
    await pilot.pause(0.1)
    return text


def test_processes_that_failed_rank_first_ended_or_not() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None]) -> None:
        views = app.state.processes
        order = table_pids(app)
        assert views[PIDS["burst-64"]].ended == "exit 1" and views[PIDS["clean-90"]].ended == "exit 0"
        assert views[PIDS["go-threads"]].ended.startswith("exit 2")  # type: ignore[union-attr]
        live = [pid for pid in order if views[pid].ended is None and pid != PIDS["haproxy"]]
        assert live, "the driver of the recording is live at its end"
        # ended after EMFILE, and after Go's thread limit: with the failing ones, above every live row
        for failed in (PIDS["burst-64"], PIDS["go-threads"], PIDS["haproxy"]):
            assert order.index(failed) < order.index(live[0]), app.state.processes[failed]
        # a clean exit 0 at 90 % of its FDs ranks below a real failure, and below the live rows
        assert order.index(PIDS["clean-90"]) > order.index(PIDS["go-threads"])
        assert order.index(PIDS["clean-90"]) > max(order.index(pid) for pid in live)

    run_to_end(scenario)


def test_a_never_sampled_process_has_unknown_limits_not_unlimited() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None]) -> None:
        assert GREP not in set(RECORDING.samples["pid"])
        text = await detail_of(app, pilot, GREP)
        assert "soft limit unknown" in text and "not sampled" in text and "unlimited" not in text
        sampled = await detail_of(app, pilot, PIDS["clean-90"])
        assert "soft limit 1024  hard limit 4096" in sampled

    run_to_end(scenario)


def test_escape_clears_the_filter_from_the_table_and_the_header_says_it_is_on() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None]) -> None:
        everyone = len(table_pids(app))
        await pilot.press("slash", *"burst", "enter")  # the table has the focus again, the filter stays
        await pilot.pause(0.2)
        header = str(app.query_one("#system", Static).render())
        assert table_pids(app) == [PIDS["burst-64"]] and "FILTER burst (escape clears)" in header
        assert app.query_one("#processes", DataTable).has_focus
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert app.text_filter == "" and len(table_pids(app)) == everyone
        assert "FILTER" not in str(app.query_one("#system", Static).render())

    run_to_end(scenario)


def test_the_failed_calls_listed_are_failures_only() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None]) -> None:
        text = await detail_of(app, pilot, PIDS["haproxy"])
        listed = text.split("failed calls by syscall", 1)[1].split("\n\n", 1)[0]
        assert "accept4        EMFILE" in listed and "socket         EMFILE" in listed
        assert "EAGAIN" not in listed and "EINPROGRESS" not in listed

    run_to_end(scenario)
