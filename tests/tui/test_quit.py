"""q quits the view at once however busy it is folding in updates (issue 34: on a flooded host q
took 2.5 s, each of its hops from the app to the table and back waiting behind an update), and q
stays a letter in the filter and closes the screens above the table. Fed by tests/data/emfile
(made by fdtrace's own recorder) through the controls `fdtrace top` gives the view."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from textual import events
from textual.widgets import Input

from fdtrace.pipeline import Pipeline, Update
from fdtrace.sinks.recorder import LiveControls
from fdtrace.sources.replay import ReplaySource
from fdtrace.tui.app import FdtraceApp, make_app
from fdtrace.tui.screens import HelpScreen

EMFILE = Path(__file__).parents[1] / "data" / "emfile"
#: How long each update takes to fold in here: a flood's batch on a busy host.
SLOW_FOLD_S = 0.2
#: When the test stops waiting for q to get through (it took one fold here).
GIVE_UP_S = 20


def _app(clock: Any = time.monotonic_ns) -> FdtraceApp:
    pipeline = Pipeline(ReplaySource(EMFILE, clock=clock), source_started=True)
    return make_app(pipeline, LiveControls(pipeline))


def test_q_quits_after_at_most_the_update_being_folded_in() -> None:
    began: list[int] = []  # the replay's clock stands until the view is up (the pilot waits for it to be idle)
    app = _app(clock=lambda: time.monotonic_ns() - began[0] if began else 0)
    folds: list[bool] = []  # one per update folded in once the replay runs: whether q had been pressed
    pressed = threading.Event()
    fold = app._apply

    def press() -> None:  # from another thread, as the terminal's driver sends keys
        pressed.set()
        app.post_message(events.Key("q", None))

    def slow_fold(update: Update) -> None:
        if began and time.monotonic_ns() - began[0] > GIVE_UP_S * 1e9:  # q never got through
            app.exit()
            return
        if began:
            folds.append(pressed.is_set())
            time.sleep(SLOW_FOLD_S)
            if len(folds) == 3:  # updates coming one after another, each folded in slowly
                threading.Timer(SLOW_FOLD_S / 4, press).start()
        fold(update)

    app._apply = slow_fold  # type: ignore[method-assign]

    async def main() -> None:
        async with app.run_test(size=(200, 40)):
            began.append(time.monotonic_ns())
            for _ in range(400):  # the pilot's pauses wait for an idle app: this one is never idle
                if not app.is_running:
                    break
                await asyncio.sleep(0.05)

    asyncio.run(main())
    assert pressed.is_set() and not app.is_running
    assert folds.count(True) <= 1, f"{folds.count(True)} updates folded in after q"


def test_q_is_a_letter_in_the_filter_and_closes_the_help_before_it_quits() -> None:
    app = _app(clock=lambda: 0)

    async def main() -> None:
        async with app.run_test(size=(200, 40)) as pilot:
            await pilot.press("slash", "q")
            assert isinstance(app.focused, Input) and app.focused.value == "q" and app.is_running
            await pilot.press("enter", "question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("q")
            assert not isinstance(app.screen, HelpScreen) and app.is_running
            await pilot.press("q")
            await pilot.pause(0.2)
            assert not app.is_running

    asyncio.run(main())
