"""Makes the SVG screenshots in docs/screenshots from tests/data/emfile (no root needed).

    .venv/bin/python docs/screenshots/make_screenshots.py
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fdtrace.sources.replay import ReplaySource
from fdtrace.tui.app import make_app

HERE = Path(__file__).parent
RECORDING = HERE.parents[1] / "tests" / "data" / "emfile"


async def main() -> None:
    clock = {"ns": 0}
    feed = ReplaySource(RECORDING, clock=lambda: clock["ns"])
    app = make_app(feed)
    async with app.run_test(size=(170, 34)) as pilot:
        while not feed.player.finished:
            clock["ns"] += 250_000_000
            await pilot.pause(0.05)
        clock["ns"] += 2_000_000_000
        await pilot.pause(0.5)
        app.save_screenshot("top.svg", str(HERE))
        await pilot.press("enter")
        await pilot.pause(0.8)
        app.save_screenshot("detail.svg", str(HERE))
        await pilot.press("escape", "question_mark")
        await pilot.pause(0.3)
        app.save_screenshot("help.svg", str(HERE))


if __name__ == "__main__":
    asyncio.run(main())
