"""SVG snapshots of the main screens (pytest-textual-snapshot), over the fixture recording with
the replay clock frozen. After a deliberate change of the UI, look at the report, then
`pytest tests/tui/test_snapshots.py --snapshot-update`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from fdtrace.sources.replay import ReplaySource
from tests.helpers import replay_app, settle

EMFILE = Path(__file__).parents[1] / "data" / "emfile"
SIZE = (170, 34)


def replayed_app() -> tuple[Any, Any]:
    clock = {"ns": 0}
    feed = ReplaySource(EMFILE, clock=lambda: clock["ns"])
    app = replay_app(feed)

    async def play(pilot: Pilot[None]) -> None:
        while not feed.player.finished:
            clock["ns"] += 250_000_000
            await pilot.pause(0.05)
        for _ in range(2):  # two more rate windows: the last one empty, so every rate shown is 0
            clock["ns"] += 2_000_000_000
            await settle(pilot)

    return app, play


def test_main_screen(snap_compare: Any) -> None:
    app, play = replayed_app()
    assert snap_compare(app, terminal_size=SIZE, run_before=play)


def test_process_detail_screen(snap_compare: Any) -> None:
    app, play = replayed_app()

    async def open_detail(pilot: Pilot[None]) -> None:
        await play(pilot)
        await pilot.press("enter")
        await pilot.pause(0.8)

    assert snap_compare(app, terminal_size=SIZE, run_before=open_detail)


def test_help_screen(snap_compare: Any) -> None:
    app, play = replayed_app()

    async def open_help(pilot: Pilot[None]) -> None:
        await play(pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=SIZE, run_before=open_help)
