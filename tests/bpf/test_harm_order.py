"""One order of harm (issue 35): a shell closed by SIGHUP, a `yes | head` pipeline (SIGPIPE) and a
program stopped with SIGTERM end before a real EMFILE storm; info's first failure line and the
report's headline name the storm, and the ends on request are listed apart, never as failures."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import needs_root
from tests.helpers import FDTRACE, started

pytestmark = [needs_root(), pytest.mark.bpf]

TAG = os.getpid() % 100000
REFUSED = 120  # socket() calls of the storm refused with EMFILE
STORM = f"""
import ctypes, socket
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"storm-{TAG}"), 0, 0, 0)
held, refused = [], 0
while refused < {REFUSED}:
    try:
        held.append(socket.socket())
    except OSError as exc:
        assert exc.errno == 24, exc
        refused += 1
print(refused, flush=True)
"""


def program(work: Path, source: str, name: str) -> str:
    """A copy of a system program under a name of this test's (its events' comm)."""
    copy = work / f"{name}-{TAG}"
    shutil.copy(shutil.which(source) or source, copy)
    return str(copy)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    work = tmp_path_factory.mktemp("harm")
    out = work / "rec"
    shell, yes, head, sleeper = (program(work, "bash", "hup"), program(work, "yes", "yes"),
                                 program(work, "head", "head"), program(work, "sleep", "term"))
    comms = [f"{name}-{TAG}" for name in ("hup", "yes", "head", "term", "storm")]
    recorder = started([FDTRACE, "record", "-o", str(out), "--interval", "0.2",
                        *(arg for comm in comms for arg in ("--comm", comm))], "recording to")
    try:
        closed = subprocess.Popen([shell, "-c", "read line"], stdin=subprocess.PIPE)  # a terminal's shell
        stopped = subprocess.Popen([sleeper, "1000"])  # a service
        pipeline = subprocess.run(f"{yes} | {head} -n 1", shell=True, capture_output=True, text=True, timeout=60)
        assert pipeline.stdout == "y\n"
        closed.send_signal(signal.SIGHUP)
        stopped.send_signal(signal.SIGTERM)
        assert closed.wait(timeout=30) == -signal.SIGHUP and stopped.wait(timeout=30) == -signal.SIGTERM
        storm = subprocess.run(["prlimit", "--nofile=32:32", sys.executable, "-c", STORM], capture_output=True,
                               text=True, timeout=60, check=True)
    finally:
        recorder.send_signal(signal.SIGINT)
        _, said = recorder.communicate(timeout=60)
    assert recorder.returncode == 0, said
    return {"out": out, "refused": int(storm.stdout), "work": work}


def test_info_names_the_emfile_storm_first_and_the_ends_on_request_apart(recorded: dict[str, object]) -> None:
    shown = subprocess.run([FDTRACE, "info", str(recorded["out"])], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "what went wrong:", shown.stdout
    assert lines[1].startswith(f"  storm-{TAG} [") and f"{REFUSED} calls failed (EMFILE socket {REFUSED})" in lines[1]
    [apart] = [line for line in lines if line.startswith("ended on request")]
    assert apart.startswith("ended on request, not failures: SIGHUP 1, SIGPIPE 1, SIGTERM 1"), apart
    assert not any(f"hup-{TAG}" in line or f"term-{TAG}" in line for line in lines[1:lines.index(apart)])


def test_the_reports_headline_names_the_emfile_storm(recorded: dict[str, object]) -> None:
    page = Path(str(recorded["work"])) / "report.md"
    made = subprocess.run([FDTRACE, "report", str(recorded["out"]), "-o", str(page)], capture_output=True,
                          text=True, timeout=180)
    assert made.returncode == 0, made.stderr
    [headline] = [line for line in page.read_text().splitlines() if line.startswith("Worst failure:")]
    assert headline.startswith(f"Worst failure: storm-{TAG} \\[") and f"socket EMFILE ×{REFUSED}," in headline
    assert "The first to fail" not in headline  # the ends on request are no incidents
