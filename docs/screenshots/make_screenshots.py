"""Makes the screenshots in docs/screenshots from tests/data/emfile (no root needed): the live
view's as SVG, and the report's as PNG, taken by a headless Chromium.

    .venv/bin/python docs/screenshots/make_screenshots.py
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from pathlib import Path

from fdtrace.analysis import load
from fdtrace.analysis.report import build, to_html
from fdtrace.pipeline import Pipeline
from fdtrace.sources.replay import ReplayControls, ReplaySource
from fdtrace.tui.app import make_app

HERE = Path(__file__).parent
RECORDING = HERE.parents[1] / "tests" / "data" / "emfile"


async def main() -> None:
    clock = {"ns": 0}
    feed = ReplaySource(RECORDING, clock=lambda: clock["ns"])
    pipeline = Pipeline(feed, source_started=True)  # as `fdtrace replay` builds it
    app = make_app(pipeline, ReplayControls(pipeline, feed))
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


def report_screenshot() -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("make_screenshots: the report's screenshot needs chromium (scripts/setup.sh installs it)")
    with tempfile.TemporaryDirectory() as scratch:
        page = Path(scratch) / "report.html"
        page.write_text(to_html(build(load(RECORDING))))
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1100,1500", "--virtual-time-budget=5000",
                        f"--screenshot={HERE / 'report.png'}", page.as_uri()], check=True, capture_output=True)


if __name__ == "__main__":
    asyncio.run(main())
    report_screenshot()
