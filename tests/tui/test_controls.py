"""The seam between the view and its source: the keys that depend on the source act through the
controls the command hands the view (a recording double here), and the live view's controls
show no replay keys and record with R."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from textual.widgets import Static

from fdtrace.pipeline import Notice, Pipeline, Position, SourceInfo, Update
from fdtrace.schema import arrow_schema
from fdtrace.sinks.recorder import LiveControls
from fdtrace.tui.app import make_app
from tests.helpers import until

REPLAY_KEYS = {"space", "plus", "minus", "n", "N", "left_square_bracket", "right_square_bracket"}
START_NS = 1_700_000_000 * 10**9


class IdleSource:
    """A started source with nothing to say: only the controls change what the view shows."""

    def __init__(self, live: bool) -> None:
        self.info = SourceInfo(host="test", live=live)

    def start(self) -> None:
        pass

    def poll(self) -> Update:
        return Update(now_ns=time.time_ns(), events=arrow_schema().empty_table())

    def finish(self) -> Update:
        return self.poll()

    def stop(self) -> None:
        pass


class RecordingControls:
    """Controls that play back nothing and write down every call the view makes."""

    playback = True
    running = False
    skipped: Sequence[str] = ("part-0.parquet",)

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def status(self) -> str:
        return "the double's status"

    def position(self) -> Position:
        return Position(START_NS, START_NS + 60 * 10**9, START_NS + 30 * 10**9, [START_NS + 45 * 10**9])

    def toggle_recording(self) -> Notice:
        self.calls.append("toggle_recording")
        return Notice("the double records nothing")

    def toggle_pause(self) -> None:
        self.calls.append("toggle_pause")

    def faster(self) -> None:
        self.calls.append("faster")

    def slower(self) -> None:
        self.calls.append("slower")

    def seek_by(self, seconds: float) -> None:
        self.calls.append(("seek_by", seconds))

    def next_problem(self) -> bool:
        self.calls.append("next_problem")
        return False

    def previous_problem(self) -> bool:
        self.calls.append("previous_problem")
        return True

    def next_failed_call(self) -> bool:
        self.calls.append("next_failed_call")
        return True

    def previous_failed_call(self) -> bool:
        self.calls.append("previous_failed_call")
        return True


def header(app: Any) -> str:
    return str(app.query_one("#system", Static).render())


def shown_keys(app: Any) -> set[str]:
    return {key for key, active in app.active_bindings.items() if active.binding.show and active.enabled}


def test_the_replay_keys_act_through_the_controls() -> None:
    controls = RecordingControls()
    app = make_app(Pipeline(IdleSource(live=False), source_started=True), controls)
    notes: list[str] = []

    async def scenario() -> None:
        async with app.run_test(size=(170, 34)) as pilot:
            app.notify = lambda text, **_: notes.append(text)  # type: ignore[method-assign]
            await until(pilot, lambda: "the double's status" in header(app))
            assert REPLAY_KEYS <= shown_keys(app)
            assert app.sub_title.startswith("replay: space play/pause")
            await pilot.press("space", "plus", "minus", "n", "N", "greater_than_sign", "less_than_sign",
                              "left_square_bracket", "right_square_bracket", "left_curly_bracket",
                              "right_curly_bracket", "R")
            bar = app.query_one("#position", Static)
            assert bar.display and "▲" in str(bar.render()) and "●" in str(bar.render())

    asyncio.run(scenario())
    assert controls.calls == ["toggle_pause", "faster", "slower", "next_problem", "previous_problem",
                              "next_failed_call", "previous_failed_call", ("seek_by", -10), ("seek_by", 10),
                              ("seek_by", -60), ("seek_by", 60), "toggle_recording"]
    # only the failed jump is told; and what the controls said of R
    assert notes == ["no incident (EMFILE, ENFILE, OOM kill, Go thread limit or crash) after this point",
                     "the double records nothing"]


def test_the_live_view_shows_no_replay_keys_and_records_with_r(tmp_path: Path) -> None:
    pipeline = Pipeline(IdleSource(live=True), source_started=True)
    app = make_app(pipeline, LiveControls(pipeline, tmp_path / "rec"))

    async def scenario() -> None:
        async with app.run_test(size=(170, 34)) as pilot:
            await until(pilot, lambda: "live" in header(app))
            assert not REPLAY_KEYS & shown_keys(app)
            assert not app.query_one("#position", Static).display and not app.sub_title
            await pilot.press("space", "n")  # not bound live: nothing happens, nothing fails
            await pilot.press("R")
            assert app.status().startswith(f"live, recording to {tmp_path / 'rec'}")
            await pilot.press("R")
            assert app.status() == "live"

    asyncio.run(scenario())
    assert (tmp_path / "rec").is_dir()
