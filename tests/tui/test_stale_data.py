"""The live view says how old its data is (issue 34): with the pipeline stuck on purpose (a sink
that blocks while the pipeline's worker holds its lock, as a long /proc round or a flood's decode
held it on a busy host), the header says "data N s old" instead of "live", is redrawn every second
and the keys still act; once the pipeline moves again it says "live". Fed by tests/data/emfile (made
by fdtrace's own recorder) through the controls `fdtrace top` gives the view."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

from textual.widgets import Static

from fdtrace.pipeline import Pipeline, SourceInfo, Update
from fdtrace.sinks.recorder import LiveControls
from fdtrace.sources.replay import ReplaySource
from fdtrace.tui.app import FdtraceApp, make_app

EMFILE = Path(__file__).parents[1] / "data" / "emfile"


class Gate:
    """A sink that blocks the pipeline while it is shut."""

    name = "gate"
    required = False

    def __init__(self) -> None:
        self.open_ = threading.Event()
        self.open_.set()
        self.blocked = threading.Event()

    def open(self, info: SourceInfo) -> None:
        """Nothing to prepare."""

    def write(self, update: Update) -> None:
        if not self.open_.is_set():
            self.blocked.set()
            self.open_.wait(timeout=60)

    def close(self, failed: bool = False) -> None:
        self.open_.set()


def header(app: FdtraceApp) -> str:
    return str(app.query_one("#system", Static).render())


def test_a_stuck_pipeline_shows_as_data_getting_old_not_as_live() -> None:
    clock = [0]
    feed = ReplaySource(EMFILE, clock=lambda: clock[0])
    pipeline = Pipeline(feed, source_started=True)
    app = make_app(pipeline, LiveControls(pipeline))
    gate = Gate()

    async def main() -> None:
        async with app.run_test(size=(200, 40)) as pilot:
            pipeline.attach(gate)
            for _ in range(8):
                clock[0] += 250_000_000
                await pilot.pause(0.05)
            assert "│  live  │" in header(app), header(app)
            gate.open_.clear()
            for _ in range(100):  # until the pipeline's worker is stuck in the gate
                if gate.blocked.is_set():
                    break
                await pilot.pause(0.05)
            assert gate.blocked.is_set()
            await pilot.pause(2.6)
            said = re.search(r"data (\d+) s old", header(app))
            assert said is not None and int(said.group(1)) >= 2 and "│  live" not in header(app), header(app)
            # the keys act while it is stuck: the view's thread never waits for the pipeline
            await pilot.press("s")
            await pilot.pause(0.1)
            assert "sort: " in header(app) and app.sort != "headroom"
            await pilot.press("R")  # the recording key waits a quarter second at most, then says why
            await pilot.pause(0.5)
            gate.open_.set()
            for _ in range(60):
                if "│  live" in header(app):
                    break
                await pilot.pause(0.05)
            assert "│  live" in header(app) and "s old" not in header(app), header(app)
            await pilot.press("q")

    asyncio.run(main())
