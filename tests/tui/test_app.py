"""Pilot tests of the live view, driven by a replay of tests/data/emfile (made by fdtrace's own
recorder): the same app `fdtrace top` runs, fed from a recording on a clock the test moves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import DataTable, RichLog, Static

from fdtrace.analysis import load
from fdtrace.sources.replay import ReplaySource
from fdtrace.tui.app import FdtraceApp
from fdtrace.tui.screens import ProcessScreen
from tests.helpers import replay_app, settle

EMFILE = Path(__file__).parents[1] / "data" / "emfile"
RECORDING = load(EMFILE)
PIDS = {comm: int(RECORDING.events[RECORDING.events["comm"] == comm]["pid"].iloc[0])
        for comm in ("emfile-child", "busy-85", "quiet-10")}


class FakeClock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def run(scenario: Callable[[FdtraceApp, Pilot[None], FakeClock, ReplaySource], Awaitable[None]]) -> None:
    clock = FakeClock()
    feed = ReplaySource(EMFILE, clock=clock)
    app = replay_app(feed)

    async def main() -> None:
        async with app.run_test(size=(180, 40)) as pilot:
            await scenario(app, pilot, clock, feed)

    asyncio.run(main())


async def play_to_end(pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
    for _ in range(200):
        if feed.player.finished:
            break
        clock.ns += 250_000_000
        await pilot.pause(0.05)
    clock.ns += 2_000_000_000  # one more rate window after the last event
    await settle(pilot)


def table_pids(app: FdtraceApp) -> list[int]:
    table = app.query_one("#processes", DataTable)
    return [int(table.get_row_at(i)[0]) for i in range(table.row_count)]


def ended_pids(app: FdtraceApp) -> list[int]:
    """The rows of processes that ended, in table order."""
    return [pid for pid in table_pids(app) if app.state.processes[pid].ended]


def cell(app: FdtraceApp, pid: int, column: str) -> str:
    return str(app.query_one("#processes", DataTable).get_cell(str(pid), column))


def test_processes_sorted_by_headroom_with_alerts_on_the_right_rows() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
        await play_to_end(pilot, clock, feed)
        pids = table_pids(app)
        ended = ended_pids(app)
        # the test's processes have all exited by the end: the one that failed with EMFILE ranks with
        # the failing, above every live one; those that exited cleanly below every live one, by headroom
        assert ended[:3] == [PIDS["emfile-child"], PIDS["busy-85"], PIDS["quiet-10"]]
        assert pids[0] == PIDS["emfile-child"] and pids[-2:] == [PIDS["busy-85"], PIDS["quiet-10"]]
        assert not any(app.state.processes[pid].ended for pid in pids[1:-2])
        assert cell(app, PIDS["emfile-child"], "use") == "100%"
        assert "64/64" in cell(app, PIDS["emfile-child"], "fds")
        assert cell(app, PIDS["emfile-child"], "emfile") == "4"
        assert "4 EMFILE/ENFILE" in cell(app, PIDS["emfile-child"], "state")
        assert "exit 1" in cell(app, PIDS["emfile-child"], "state")
        assert "FDs at 85%" in cell(app, PIDS["busy-85"], "state")
        assert "FDs at" not in cell(app, PIDS["quiet-10"], "state")
        assert cell(app, PIDS["quiet-10"], "use") == "10%"

    run(scenario)


def test_sort_by_clicking_a_header_and_by_key() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
        await play_to_end(pilot, clock, feed)
        table = app.query_one("#processes", DataTable)
        table.post_message(DataTable.HeaderSelected(table, table.columns["fds"].key, 2, table.columns["fds"].label))
        await pilot.pause(0.2)
        assert app.sort == "fds"
        pids = [pid for pid in ended_pids(app) if not app.state.processes[pid].failed]  # the clean exits
        fds = [app.state.processes[pid].open_fds or 0 for pid in pids]
        assert fds == sorted(fds, reverse=True) and pids[0] == PIDS["busy-85"]
        await pilot.press("s")
        assert app.sort == "mem"  # the column after FDs: memory against its cgroup's limit
        await pilot.press("s")
        assert app.sort == "sockets"
        await pilot.pause(0.2)
        assert ended_pids(app)[0] == PIDS["emfile-child"]  # 61 sockets
        await pilot.press("r")
        await pilot.pause(0.2)
        clean = [pid for pid in ended_pids(app) if not app.state.processes[pid].failed]
        sockets = [app.state.processes[pid].sockets or 0 for pid in clean]
        assert app.reverse and sockets == sorted(sockets)  # fewest sockets first
        assert "reversed" in str(app.query_one("#system", Static).render())
        views = app.state.processes
        live = [pid for pid in table_pids(app) if not views[pid].ended and not views[pid].failed]
        # reversed within each group: the failing still come first, the clean exits last
        assert table_pids(app) == [PIDS["emfile-child"]] + live + clean

    run(scenario)


def test_filter_keeps_matching_rows() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
        await play_to_end(pilot, clock, feed)
        await pilot.press("slash", *"busy")
        await pilot.pause(0.2)
        assert table_pids(app) == [PIDS["busy-85"]]
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert len(table_pids(app)) > 3

    run(scenario)


def test_enter_opens_the_selected_process() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
        await play_to_end(pilot, clock, feed)
        await pilot.press("slash", *"busy", "enter")  # the filter stays, the table has the focus again
        await pilot.pause(0.2)
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert isinstance(app.screen, ProcessScreen) and app.screen.pid == PIDS["busy-85"]
        text = str(app.screen.query_one("#detail", Static).render())
        assert "busy-85" in text and "open FDs 870  soft limit 1024  hard limit 4096" in text
        await pilot.press("escape")
        await pilot.press("slash", "escape", "slash", *"emfile", "enter")
        await pilot.pause(0.2)
        await pilot.press("enter")
        await pilot.pause(0.3)
        text = str(app.screen.query_one("#detail", Static).render())
        assert "emfile-child" in text and "socket         EMFILE         3" in text

    run(scenario)


def test_replay_controls_move_time() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
        start = feed.player.start_ns
        await pilot.press("space")
        clock.ns += 5_000_000_000
        await settle(pilot)
        assert feed.player.paused and feed.player.now_ns == start
        assert "paused" in str(app.query_one("#system", Static).render())
        await pilot.press("space", "plus", "plus")
        assert feed.player.speed == 4.0
        await pilot.press("minus")
        assert feed.player.speed == 2.0
        await pilot.press("n")
        # the first EMFILE of any call: the socket() ones come before the pipe2 fd_error
        first_emfile = RECORDING.events[RECORDING.events["errno"] == "EMFILE"]
        assert first_emfile["kind"].iloc[0] == "socket"
        assert abs(feed.player.now_ns - first_emfile["time"].iloc[0].value) < 1_000
        clock.ns += 1_500_000_000
        await settle(pilot)
        log = app.query_one("#log", RichLog)
        assert any("pipe2 failed with EMFILE" in line.text for line in log.lines)
        events = RECORDING.events
        problems = events[events["errno"].isin(["EMFILE", "ENFILE"])]["time"].map(lambda t: t.value)
        expected = problems[problems < feed.player.now_ns].max()
        await pilot.press("less_than_sign")  # one failed call back: the last one before now
        await pilot.pause(0.2)
        assert feed.player.now_ns == expected
        await pilot.press("N")  # back to where the incident began: emfile-child's first EMFILE
        await settle(pilot)
        assert abs(feed.player.now_ns - first_emfile["time"].iloc[0].value) < 1_000
        assert "incident 1 of 1: emfile-child socket EMFILE ×4" in str(app.query_one("#position", Static).render())
        await pilot.press("left_curly_bracket")  # a minute back: to the start, state rebuilt from there
        await pilot.pause(0.3)
        assert feed.player.now_ns == start

    run(scenario)


def test_the_log_shows_failures_hides_exits_until_asked_and_follows_the_filter() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
        await play_to_end(pilot, clock, feed)

        def lines() -> list[str]:
            return [line.text for line in app.query_one("#log", RichLog).lines]

        child = f"emfile-child[{PIDS['emfile-child']}]"
        assert any(f"{child} pipe2 failed with EMFILE" in line for line in lines())
        assert not any(line.endswith("exit 1") for line in lines())  # a non-zero exit: not by default
        await pilot.press("e")
        await pilot.pause(0.2)
        assert any(line.endswith(f"{child} exit 1") for line in lines())
        await pilot.press("slash", *"busy")
        await pilot.pause(0.2)
        assert lines() == []  # busy-85 failed nothing and exited 0
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert any(f"{child} pipe2 failed with EMFILE" in line for line in lines())

    run(scenario)


def test_the_footer_shows_the_replay_keys() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
        await pilot.pause(0.2)
        shown = {key for key, active in app.active_bindings.items() if active.binding.show and active.enabled}
        assert {"space", "plus", "minus", "n", "N", "left_square_bracket", "right_square_bracket"} <= shown

    run(scenario)


def test_help_screen_and_freeze() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
        await pilot.press("question_mark")
        await pilot.pause(0.1)
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape", "p")
        frozen = table_pids(app)
        await play_to_end(pilot, clock, feed)
        assert table_pids(app) == frozen and "FROZEN" in str(app.query_one("#system", Static).render())
        # the last process to show up (first sampled 4.5 s in): collection went on while frozen
        first_seen = RECORDING.samples.groupby("pid")["time"].min()
        late = int(first_seen.idxmax())
        assert late not in frozen and late in app.state.processes
        await pilot.press("p")
        await pilot.pause(0.2)
        assert late in table_pids(app)

    run(scenario)


def test_thousands_of_processes_draw_the_worst_rows_and_say_so() -> None:
    from fdtrace.schema.records import ProcessSample
    from fdtrace.tui.app import MAX_ROWS
    from fdtrace.tui.state import IncidentState

    async def scenario(app: FdtraceApp, pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
        await pilot.press("space")  # the replay stands still; this test sets the state itself
        state = IncidentState()
        state.apply_samples([ProcessSample(pid=i, start_ns=i, comm="lonely" if i == 7 else f"proc-{i}", open_fds=i,
                                           fd_soft_limit=2000,
                                           fd_hard_limit=4096, threads=1, sockets=0) for i in range(1, 1201)], 1)
        state.roll(2, {})
        app.state = state
        app.redraw()
        assert table_pids(app) == list(range(1200, 1200 - MAX_ROWS, -1))  # fullest first
        assert f"showing {MAX_ROWS} of 1200 processes" in str(app.query_one("#system", Static).render())
        await pilot.press("slash", *"lonely")
        await pilot.pause(0.2)
        assert table_pids(app) == [7]  # the filter reaches rows not drawn

    run(scenario)


def test_training_ranks_show_their_step_and_phase() -> None:
    ddp = Path(__file__).parents[1] / "data" / "ddp"
    phases = load(ddp).phases
    ranks = {int(r): int(phases[phases["rank"] == r]["pid"].iloc[0]) for r in (0, 1)}
    rank1 = phases[phases["rank"] == 1]
    optimizer = int(rank1[(rank1["phase"] == "optimizer") & (rank1["step"] == 0)]["start_wall_ns"].iloc[0])
    clock = FakeClock()
    feed = ReplaySource(ddp, clock=clock)
    app = replay_app(feed)

    async def main() -> None:
        async with app.run_test(size=(180, 40)) as pilot:
            await pilot.press("space")  # paused: only the seek moves time
            feed.seek(optimizer + 1)
            await settle(pilot)
            line = str(app.query_one("#phases", Static).render())
            # rank 1 has begun its first optimizer step; rank 0's all-reduce is done, its backward not
            assert f"rank 0 pid {ranks[0]} step 0 backward" in line, line
            assert f"rank 1 pid {ranks[1]} step 0 optimizer 0.0s" in line, line
            assert app.query_one("#phases", Static).display

    asyncio.run(main())


def test_the_cursor_keeps_its_row_as_the_order_changes_unless_a_process_is_followed() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
        await play_to_end(pilot, clock, feed)
        table = app.query_one("#processes", DataTable)
        assert app.selected_pid() == table_pids(app)[0]
        await pilot.press("s")  # sockets: another process comes to the top row
        await pilot.pause(0.2)
        assert table.cursor_row == 0 and app.selected_pid() == table_pids(app)[0]
        await pilot.press("down", "f")  # follow the second row's process
        followed = app.selected_pid()
        await pilot.press("s")
        await pilot.pause(0.2)
        assert app.selected_pid() == followed and app.followed_pid == followed
        await pilot.press("f", "G")
        assert app.followed_pid is None and table.cursor_row == table.row_count - 1
        await pilot.press("g")
        assert table.cursor_row == 0

    run(scenario)


def test_replay_shows_its_position_with_the_failures_marked() -> None:
    async def scenario(app: FdtraceApp, pilot: Pilot[None], clock: FakeClock, feed: ReplaySource) -> None:
        await settle(pilot)
        player = feed.player
        bar = app.query_one("#position", Static)
        assert bar.display
        shown = str(bar.render())
        start = time.strftime("%H:%M:%S", time.gmtime(player.start_ns / 1e9))
        end = time.strftime("%H:%M:%S", time.gmtime(player.end_ns / 1e9))
        assert shown.startswith(f"{start} ●") and f" {end} {start} UTC" in shown
        # every EMFILE of the recording is marked, at its place in the span (the fixture's fall in one cell)
        cells = shown[len(start) + 1:shown.index(f" {end}")]
        emfile = RECORDING.events[RECORDING.events["errno"].isin(["EMFILE", "ENFILE"])]["time"]
        first = (emfile.iloc[0].value - player.start_ns) / (player.end_ns - player.start_ns)
        assert cells.index("▲") == min(len(cells) - 1, int(first * len(cells)))
        assert cells.count("▲") == len({int((t.value - player.start_ns) / (player.end_ns - player.start_ns)
                                            * len(cells)) for t in emfile})
        await play_to_end(pilot, clock, feed)
        played = str(app.query_one("#position", Static).render())
        now = time.strftime("%H:%M:%S", time.gmtime(feed.player.now_ns / 1e9))
        assert "─" not in played and played.endswith(f" {end} {now} UTC")  # all of it played, and time goes on

    run(scenario)
