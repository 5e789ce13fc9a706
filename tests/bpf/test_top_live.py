"""`fdtrace top`'s app over the live kernel, headless: a child that hits EMFILE shows up, and the
R key records it."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable, RichLog

from fdtrace.analysis import load
from fdtrace.kernel.loader import TraceOptions
from fdtrace.sources.live import LiveOptions, LiveSource
from tests.conftest import python_child
from tests.helpers import live_app, shown, until

pytestmark = pytest.mark.bpf

CHILD = """
import os, socket, time
open('/proc/self/comm', 'w').write('top-emfile')
held = []
while True:
    try: held.append(os.open('/dev/null', os.O_RDONLY))
    except OSError: break
for _ in range(3):
    try: socket.socket()
    except OSError: pass
time.sleep(120)  # at its limit until the test kills it
"""


async def until_at_its_limit(app: Any, pilot: Any, pid: int) -> None:
    """Wait (60 s at most) until the view shows the child's 4 failures and its 48 open FDs."""
    def at_its_limit() -> bool:
        view = app.state.processes.get(pid)
        return view is not None and view.fd_exhaustion_errors == 4 and view.open_fds == 48

    await until(pilot, at_its_limit, f"pid {pid} at its limit in the view", timeout_s=60)


async def press_r_until_recording(app: Any, pilot: Any, recording: bool) -> None:
    """Press R until the status says the view records (or no longer does): under load the feed may
    hold its lock past R's wait, and R then says "press R again" and changes nothing."""
    for _ in range(20):
        await pilot.press("R")
        try:
            await shown(pilot, lambda: ("recording to" in app.status()) == recording, "R taken", timeout=3)
            return
        except AssertionError:
            continue
    raise AssertionError(f"R never {'started' if recording else 'stopped'} the recording: {app.status()}")


def cell(app: Any, pid: int, column: str) -> str:
    """The processes table's ``column`` of ``pid`` ("" while it has no row of it)."""
    table = app.query_one("#processes", DataTable)
    try:
        return str(table.get_cell(str(pid), column))
    except Exception:  # noqa: BLE001 - no such row yet (Textual's RowDoesNotExist / CellDoesNotExist)
        return ""


def test_live_top_shows_a_child_hitting_emfile_and_records_it(tmp_path: Path) -> None:
    source = LiveSource(LiveOptions(trace=TraceOptions(), top_processes=5, live_phases=True, keep_exited=0))
    source.start()
    app = live_app(source, record_dir=tmp_path / "rec")

    child_pid: list[int] = []

    async def scenario() -> None:
        async with app.run_test(size=(180, 40)) as pilot:
            await press_r_until_recording(app, pilot, True)  # start recording
            assert "recording to" in app.status()
            child = subprocess.Popen(["prlimit", "--nofile=48:48", *python_child(CHILD)])
            child_pid.append(child.pid)
            try:
                await until_at_its_limit(app, pilot, child.pid)
                view = app.state.processes[child.pid]
                assert view.fd_exhaustion_errors == 4  # openat once, socket three times
                assert view.errors == {("openat", "EMFILE"): 1, ("socket", "EMFILE"): 3}
                assert (view.open_fds, view.fd_soft_limit) == (48, 48)

                def logged() -> list[str]:
                    return [line.text for line in app.query_one("#log", RichLog).lines]
                # the next rate window writes the log lines; the table is drawn with them
                await shown(pilot, lambda: any(f"top-emfile[{child.pid}] socket failed with EMFILE" in line
                                               for line in logged())
                            and any(f"top-emfile[{child.pid}] openat failed" in line for line in logged())
                            and cell(app, child.pid, "emfile").split()[:1] == ["4"]
                            and cell(app, child.pid, "use") == "100%", "the child's failures in the log and the table")
                table = app.query_one("#processes", DataTable)
                # the count, then its rate while the failures are still in the rate window ("4 3.7/s")
                assert str(table.get_cell(str(child.pid), "emfile")).split()[0] == "4"
                assert str(table.get_cell(str(child.pid), "use")) == "100%"
                lines = logged()
                assert any(f"top-emfile[{child.pid}] socket failed with EMFILE x3" in line for line in lines)
                assert any(f"top-emfile[{child.pid}] openat failed with EMFILE" in line for line in lines)
                await press_r_until_recording(app, pilot, False)  # stop recording
                await shown(pilot, lambda: app.status() == "live", "the status says live")
                assert app.status() == "live"
            finally:
                child.kill()
                child.wait()

    asyncio.run(scenario())
    rec = load(tmp_path / "rec")
    [meta] = rec.meta.values()
    assert meta["complete"] is True
    mine = rec.events[rec.events["pid"] == child_pid[0]]
    assert (mine["errno"] == "EMFILE").sum() == 4
    assert rec.samples[rec.samples["pid"] == child_pid[0]]["open_fds"].max() == 48


def test_top_comm_shows_only_that_program() -> None:
    source = LiveSource(LiveOptions(trace=TraceOptions(), top_processes=30, keep_exited=0, comms=("top-emfile",),
                                    samples_of_comms_only=True))
    source.start()
    app = live_app(source)

    async def scenario() -> None:
        async with app.run_test(size=(180, 40)) as pilot:
            child = subprocess.Popen(["prlimit", "--nofile=48:48", *python_child(CHILD)])
            try:
                await until_at_its_limit(app, pilot, child.pid)
                table = app.query_one("#processes", DataTable)
                await shown(pilot, lambda: table.row_count > 0, "the table drawn")
                assert app.state.processes[child.pid].fd_exhaustion_errors == 4
                assert {view.comm for view in app.state.processes.values()} == {"top-emfile"}
                table = app.query_one("#processes", DataTable)
                assert table.row_count == 1
            finally:
                child.kill()
                child.wait()

    asyncio.run(scenario())


def test_a_new_emfile_brings_the_round_forward_ahead_of_the_events() -> None:
    """failures_first (top): rounds 30 s apart, yet within a second of the child's first EMFILE a
    poll hands out a round with no events, ahead of the ring's: the child sampled (at its limit)
    and the counters' exact count of its failed openat."""
    source = LiveSource(LiveOptions(trace=TraceOptions(), top_processes=0, keep_exited=0, interval_s=30.0,
                                    failures_first=True))
    source.start()
    try:
        source.poll()  # the round at start; the next timed one is 30 s away
        child = subprocess.Popen(["prlimit", "--nofile=48:48", *python_child(CHILD)])
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                update = source.poll()
                if update.rounds:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("no round within 10 s of the child's failure")
            assert update.events.num_rows == 0
            [sample] = [s for s in update.rounds[0].samples if s.pid == child.pid]
            assert (sample.open_fds, sample.fd_soft_limit) == (48, 48)
            assert update.counters is not None
            [totals] = [t for t in update.counters.live.values() if t.pid == child.pid]
            assert totals.errors[("openat", "EMFILE")] == 1
        finally:
            child.kill()
            child.wait()
    finally:
        source.stop()
