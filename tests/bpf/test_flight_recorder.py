"""An always-on recording with a bounded ring: an EMFILE burst, then enough socket churn to turn
the ring over many times. The burst's window is kept apart from the ring, so every one of its
failures is still in the recording, which stays within --max-size plus --keep-incidents."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from fdtrace.analysis import load
from tests.conftest import needs_root
from tests.helpers import FDTRACE, started

pytestmark = [needs_root(), pytest.mark.bpf]

MAX_SIZE, KEEP_INCIDENTS = 400 * 1024, 300 * 1024
REFUSED = 47  # socket() calls refused with EMFILE by the burst

NAME = """
import ctypes
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"NAME"), 0, 0, 0)  # PR_SET_NAME: events of this test only
"""
TAG = os.getpid() % 100000  # names no other process on the host has
BURST = NAME.replace("NAME", f"burst-{TAG}") + f"""
import socket
held, refused = [], 0
while refused < {REFUSED}:
    try:
        held.append(socket.socket())
    except OSError as exc:
        assert exc.errno == 24, exc
        refused += 1
print(refused, flush=True)
"""

CHURN = NAME.replace("NAME", f"churn-{TAG}") + """
import os, socket, sys
calls = 0
while not os.path.exists(sys.argv[1]):  # until the test has seen the ring turn over
    for _ in range(200):
        socket.socket().close()
    calls += 200
print(calls, flush=True)
"""


def written_bytes(out: Path, seen: dict[str, int]) -> int:
    """The bytes of every part file seen so far (a file rotated out before it was seen is not
    counted: the figure only falls short of what was written)."""
    for path in out.glob("*/host=*/part-*.parquet"):
        try:
            seen.setdefault(str(path), path.stat().st_size)
        except FileNotFoundError:
            continue
    return sum(seen.values())


def flushes(out: Path, past: int) -> int:
    """Wait until the recording has written a flush numbered above ``past``; the newest number."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        numbers = [int(p.stem.split("-")[-1]) for p in (out / "clock").glob("host=*/part-*.parquet")]
        if numbers and max(numbers) > past:
            return max(numbers)
        time.sleep(0.05)
    raise AssertionError(f"no flush after {past} in 60 s")


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("ring") / "rec"
    # Only this test's two programs (--comm): other processes' failures on a busy host are not
    # incidents of this ring.
    recorder = started([FDTRACE, "record", "-o", str(out), "--max-size", str(MAX_SIZE), "--keep-incidents",
                        str(KEEP_INCIDENTS), "--keep-before", "1", "--keep-after", "0.5", "--interval", "0.2",
                        "--comm", f"burst-{TAG}", "--comm", f"churn-{TAG}"], "recording to")
    try:
        flushes(out, past=0)  # the recording's first round is written: the window has rows of every table before it
        burst = subprocess.run(["prlimit", "--nofile=32:32", sys.executable, "-c", BURST], capture_output=True,
                               text=True, timeout=60, check=True)
        time.sleep(1.0)  # past the burst's window (--keep-after 0.5): the churn is only the ring's
        # churn until the ring has turned over more than four times (on a busy machine that takes
        # longer than on an idle one: the count of bytes decides, not a time)
        stop = out.parent / "stop-churn"
        churning = subprocess.Popen([sys.executable, "-c", CHURN, str(stop)], stdout=subprocess.PIPE, text=True)
        seen: dict[str, int] = {}
        deadline = time.monotonic() + 180
        while written_bytes(out, seen) < 5 * (MAX_SIZE + KEEP_INCIDENTS) and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.touch()
        churn_calls, _ = churning.communicate(timeout=60)
        # two more flushes: the newest files (kept whatever their size) hold no churn
        flushes(out, past=flushes(out, past=0) + 1)
    finally:
        recorder.send_signal(signal.SIGINT)
        _, said = recorder.communicate(timeout=60)
    assert recorder.returncode == 0, said
    return {"out": out, "refused": int(burst.stdout), "churn": int(churn_calls)}


def test_every_failure_of_the_burst_outlives_the_ring_turning_over(ring: dict[str, object]) -> None:
    out = ring["out"]
    assert isinstance(out, Path)
    meta = json.loads(next((out / "meta").glob("host=*.json")).read_text())
    assert meta["bytes"] > 4 * (MAX_SIZE + KEEP_INCIDENTS)  # the ring turned over several times
    assert meta["rotated_out"]["rows"]["events"] > int(ring["churn"])  # most of the churn's 2 events a loop went
    rec = load(out)
    refused = rec.events[rec.events["errno"] == "EMFILE"]
    assert len(refused) == ring["refused"] == REFUSED
    assert refused["syscall"].unique().tolist() == ["socket"] and refused["pid"].nunique() == 1
    windows = meta["incident_windows"]
    assert [w["incidents"] for w in windows] == [{"EMFILE/ENFILE": REFUSED}]
    assert meta["incidents_dropped"] == {"windows": 0, "incidents": 0, "bytes": 0}
    first = refused["time"].min()
    assert pd.Timestamp(windows[0]["start"], tz="UTC") <= first <= pd.Timestamp(windows[0]["end"], tz="UTC")
    for table in (rec.system, rec.losses, rec.clock):  # every table's parts of the window were kept
        assert len(table) and table["ts_ns"].min() <= refused["ts_ns"].min()


def test_the_recording_stays_within_its_two_budgets(ring: dict[str, object]) -> None:
    out = ring["out"]
    assert isinstance(out, Path)
    parts = sum(p.stat().st_size for p in out.glob("*/host=*/part-*.parquet"))
    assert parts <= MAX_SIZE + KEEP_INCIDENTS


def test_info_lists_the_kept_window(ring: dict[str, object]) -> None:
    shown = subprocess.run([FDTRACE, "info", str(ring["out"])], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    [line] = [line for line in shown.stdout.splitlines() if "incident window" in line]
    assert f"EMFILE/ENFILE {REFUSED}" in line, shown.stdout


def test_the_report_lists_the_kept_window(ring: dict[str, object], tmp_path: Path) -> None:
    page = tmp_path / "report.md"
    made = subprocess.run([FDTRACE, "report", str(ring["out"]), "-o", str(page)], capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    [line] = [line for line in page.read_text().splitlines() if "incident window kept" in line]
    assert f"EMFILE/ENFILE {REFUSED}" in line
