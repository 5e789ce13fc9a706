"""`info`, `report` and `replay` over a flight recorder (`record --rotate 1 --max-size 2M`) that a
socket flood keeps flushing, merging and rotating out (issue 39). Each reads one published state
of the recording (its manifest, read under the readers' lock): every run succeeds with nothing
skipped, sees exactly the events the recorder had written less those its ring had rotated out
by then, and never an older state than the run before."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdtrace.analysis.engines.dataset import open_dataset
from fdtrace.analysis.report import build, to_markdown
from fdtrace.analysis.summary import summary
from fdtrace.recording.manifest import Manifest
from fdtrace.sources.replay import ReplaySource
from tests.conftest import needs_root
from tests.helpers import FDTRACE, started

pytestmark = [needs_root(), pytest.mark.bpf]

#: Runs of each reader: this many, or as many as fit in BUDGET_S (at least MIN_RUNS) on a machine
#: too busy for them.
RUNS, MIN_RUNS, BUDGET_S = 10, 3, 15.0
#: The flood stops by itself after this long, whatever becomes of the test (which stops it first).
FLOOD_S = 600
TAG = os.getpid() % 100000
FLOOD = f"""
import ctypes, socket, sys, time
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"flood-{TAG}"), 0, 0, 0)
end = time.monotonic() + {FLOOD_S}
while time.monotonic() < end:
    for _ in range(500):
        socket.socket().close()
"""


def _manifest(out: Path) -> Manifest | None:
    try:
        return Manifest.decode(json.loads(next((out / "meta").glob(".host=*.parts.json")).read_text()))
    except (StopIteration, OSError, ValueError):
        return None


def _wait(out: Path, ready: object, what: str, timeout: float = 60) -> Manifest:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        manifest = _manifest(out)
        if manifest is not None and ready(manifest):  # type: ignore[operator]
            return manifest
        time.sleep(0.05)
    raise AssertionError(f"the recorder did not {what} in {timeout} s")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A recorder writing a 2 MB ring of a socket flood, merging every second; yields its
    directory while both run, then stops them and checks what the recorder left on disk."""
    out = tmp_path_factory.mktemp("live") / "rec"
    recorder = started([FDTRACE, "record", "-o", str(out), "--rotate", "1", "--max-size", "2M", "--interval", "0.25",
                        "--comm", f"flood-{TAG}"], "recording to")
    flood = subprocess.Popen([sys.executable, "-c", FLOOD])
    try:
        # a merge published: every reader below races the next ones, and the ring turning over
        _wait(out, lambda m: any(part.count("-") == 2 for part in m.parts.get("events", [])), "merge")
        yield out
    finally:
        flood.kill()
        flood.wait()
        recorder.send_signal(signal.SIGINT)
        _, said = recorder.communicate(timeout=120)
    assert recorder.returncode == 0, said
    manifest = _manifest(out)
    assert manifest is not None and not any(manifest.retired.values())
    assert manifest.counts["rotated_out"]["rows"]["events"] > 0  # the ring turned over while read
    for table in manifest.parts:  # every part merged or rotated out is gone; what is left is listed
        on_disk = sorted(p.name for p in (out / table).glob("host=*/part-*.parquet"))
        assert on_disk == sorted(manifest.parts[table]), table


def _runs() -> Iterator[int]:
    deadline = time.monotonic() + BUDGET_S
    for run in range(RUNS):
        if run >= MIN_RUNS and time.monotonic() > deadline:
            return
        yield run


def _turnover(meta: dict[str, dict[str, object]]) -> tuple[int, int]:
    [host] = meta.values()
    rows, rotated = host["rows"], host["rotated_out"]
    assert isinstance(rows, dict) and isinstance(rotated, dict)
    return int(rows["events"]), int(rotated["rows"]["events"])


def test_info_runs_over_the_live_ring(live: Path) -> None:
    """`info --engine duckdb`: events shown = written - rotated out, at the state read."""
    seen = []
    for _ in _runs():
        with open_dataset(live, "duckdb") as recording:
            text = summary(recording)
            written, rotated = _turnover(recording.meta)
            assert recording.skipped == [] and recording.notes == []
        shown = int(text.split("\nevents: ", 1)[1].split("\n", 1)[0])
        said = re.search(r"rotated out \(--max-size\): \d+ oldest files, (?:[a-z_]+ \d+, )*?events (\d+)", text)
        assert int(said[1]) == rotated if said is not None else rotated == 0, text
        assert shown == written - rotated
        seen.append(written)
    assert seen == sorted(seen) and seen[-1] > seen[0]


def test_report_runs_over_the_live_ring(live: Path) -> None:
    seen = []
    for _ in _runs():
        with open_dataset(live, "duckdb") as recording:
            page = to_markdown(build(recording))
            written, rotated = _turnover(recording.meta)
            assert recording.skipped == []
        shown = int(page.split("- **events**: ", 1)[1].split("\n", 1)[0].replace(",", ""))
        assert shown == written - rotated
        seen.append(written)
    assert seen == sorted(seen) and seen[-1] > seen[0]


def test_replay_runs_over_the_live_ring(live: Path) -> None:
    """Replay (as `fdtrace replay` builds its source) reads every table of one state: never an
    older one than the run before (its newest event never goes back)."""
    newest = []
    for _ in _runs():
        source = ReplaySource(live)
        assert source.skipped == []
        assert source.player.events.num_rows > 0
        newest.append(source.player.end_ns)
    assert newest == sorted(newest) and newest[-1] > newest[0]
