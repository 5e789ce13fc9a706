"""Task names chosen to attack root's terminal: an OSC title change and a screen clear, and a
newline that would split a row and an HTML tag for the Markdown report. Two real processes take
those names (prctl), open sockets and run out of descriptors under prlimit while `trace` writes
to a real pseudo-terminal and `record` records them; then every command that shows names is run
over what was seen: each shows the names as visible escapes, one row per process, and writes no
control character of theirs."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import needs_root
from tests.helpers import FDTRACE, drain, replay_app, replay_to_end

pytestmark = [needs_root(), pytest.mark.bpf]

TITLE_AND_CLEAR = "\x1b]0;PWNED\x07\x1b[2J"  # 14 bytes: a task name holds 15
NEWLINE_AND_TAG = "\n<svg onload=1>"
NAMES = (TITLE_AND_CLEAR, NEWLINE_AND_TAG)
SOCKETS = 5

CHILD = r"""
import ctypes, socket, sys
name = sys.argv[1].encode()
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
print("ready", flush=True)
sys.stdin.readline()
held = [socket.socket() for _ in range(SOCKETS)]
try:
    while True:
        held.append(socket.socket())
except OSError as exc:
    assert exc.errno == 24, exc
""".replace("SOCKETS", str(SOCKETS))


def visible(name: str) -> str:
    """How fdtrace must show a name."""
    from fdtrace.display import shown

    return shown(name)


def no_control_of_theirs(text: str) -> None:
    """None of the names' control characters reached the output."""
    for char in ("\x1b", "\x07"):
        assert char not in text, repr(text[max(0, text.find(char) - 80):text.find(char) + 80])


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two hostile-named children traced on a pseudo-terminal and recorded at once."""
    out = tmp_path_factory.mktemp("names") / "rec"
    children = [subprocess.Popen(["prlimit", "--nofile=32:32", sys.executable, "-c", CHILD, name],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for name in NAMES]
    for child in children:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    pid_args = [arg for child in children for arg in ("--pid", str(child.pid))]
    threads = subprocess.run([FDTRACE, "threads", "--pid", str(children[0].pid)], capture_output=True, text=True,
                             timeout=60)
    doctor = subprocess.run([FDTRACE, "doctor", *pid_args], capture_output=True, text=True, timeout=60)
    recorder = subprocess.Popen([FDTRACE, "record", "-o", str(out), *pid_args], stderr=subprocess.PIPE, text=True)
    leader, follower = pty.openpty()
    tracer = subprocess.Popen([FDTRACE, "trace", *pid_args], stdout=follower, stderr=subprocess.PIPE, text=True)
    os.close(follower)
    leaks = subprocess.Popen([FDTRACE, "leaks", "--pid", str(children[0].pid), "--duration", "60"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for process in (recorder, tracer, leaks):
            assert process.stderr is not None
            ready = "tracing pid" if process is leaks else "probes attached"
            for line in process.stderr:
                if ready in line:
                    break
            else:
                raise AssertionError(f"{process.args} ended before its probes were attached")
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            assert child.wait(timeout=60) == 0
        screen = b""
        deadline = time.monotonic() + 30
        while screen.count(b" process_exit ") < len(children) and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.5)[0]:
                screen += os.read(leader, 65536)
        for process in (tracer, recorder):
            process.send_signal(signal.SIGINT)
        for process in (tracer, recorder):
            assert process.wait(timeout=60) == 0, process.stderr.read() if process.stderr else ""
        screen += drain(leader)
        said, leaks_err = leaks.communicate(timeout=60)  # it ends with the process it traced
    finally:
        os.close(leader)
        for process in (*children, tracer, recorder, leaks):
            if process.poll() is None:
                process.kill()
                process.wait()
    yield {"trace": screen.decode(), "recording": out, "pids": [c.pid for c in children],
           "threads": threads, "doctor": doctor, "leaks": (leaks.returncode, said, leaks_err)}


def test_trace_on_a_terminal_shows_the_names_as_escapes(seen: dict[str, Any]) -> None:
    screen = seen["trace"]
    no_control_of_theirs(screen)
    for pid, name in zip(seen["pids"], NAMES, strict=True):
        lines = [line for line in screen.splitlines() if f" {pid} " in line]
        sockets = [line for line in lines if " socket " in line]
        assert len(sockets) >= SOCKETS + 1, lines  # the sockets, then the one refused with EMFILE
        assert all(visible(name)[:16] in line for line in sockets), sockets[0]
        assert sum("EMFILE" in line for line in sockets) == 1


def test_threads_and_doctor_show_the_names_as_escapes(seen: dict[str, Any]) -> None:
    threads = seen["threads"]
    assert threads.returncode == 0, threads.stderr
    no_control_of_theirs(threads.stdout)
    assert f"({visible(TITLE_AND_CLEAR)})" in threads.stdout.splitlines()[0]
    doctor = seen["doctor"]
    no_control_of_theirs(doctor.stdout + doctor.stderr)
    assert visible(TITLE_AND_CLEAR) in doctor.stdout and visible(NEWLINE_AND_TAG) in doctor.stdout


def test_leaks_shows_the_name_as_escapes(seen: dict[str, Any]) -> None:
    returncode, said, errors = seen["leaks"]
    assert returncode == 0, errors
    no_control_of_theirs(said + errors)
    assert visible(TITLE_AND_CLEAR) in said + errors


def test_info_shows_one_line_per_failing_process(seen: dict[str, Any]) -> None:
    info = subprocess.run([FDTRACE, "info", str(seen["recording"])], capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    no_control_of_theirs(info.stdout)
    failing = [line for line in info.stdout.splitlines() if "calls failed (EMFILE socket 1)" in line]
    assert len(failing) == 2, info.stdout  # one line each: the newline of a name split none
    for pid, name in zip(seen["pids"], NAMES, strict=True):
        assert sum(line.startswith(f"  {visible(name)} [{pid}]: ") for line in failing) == 1, failing


def test_the_markdown_report_holds_no_tag_and_no_control(seen: dict[str, Any], tmp_path: Path) -> None:
    from fdtrace.display import markdown_shown

    report = tmp_path / "report.md"
    done = subprocess.run([FDTRACE, "report", str(seen["recording"]), "-o", str(report)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = report.read_text()
    no_control_of_theirs(text)
    assert not re.search(r"(?<!\\)<svg", text)  # only as the escaped text \<svg, which Markdown shows as is
    assert markdown_shown(NEWLINE_AND_TAG) in text and markdown_shown(TITLE_AND_CLEAR) in text
    html = tmp_path / "report.html"
    assert subprocess.run([FDTRACE, "report", str(seen["recording"]), "-o", str(html)], capture_output=True,
                          timeout=300).returncode == 0
    page = html.read_text()
    assert "<svg onload" not in page
    no_control_of_theirs(page)  # escapes made visible and HTML-escaped (issue 37 O)


def test_the_live_view_over_the_recording_shows_the_names_as_escapes(seen: dict[str, Any]) -> None:
    from textual.widgets import DataTable

    from fdtrace.sources.replay import ReplaySource

    clock = [0]
    feed = ReplaySource(seen["recording"], clock=lambda: clock[0])
    app = replay_app(feed)

    async def scenario() -> str:
        async with app.run_test(size=(200, 40)) as pilot:
            await replay_to_end(pilot, feed, clock)
            table = app.query_one("#processes", DataTable)
            comms = {int(table.get_row_at(i)[0]): str(table.get_row_at(i)[1]) for i in range(table.row_count)}
            for pid, name in zip(seen["pids"], NAMES, strict=True):
                assert comms[pid] == visible(name)[:len(comms[pid])] and comms[pid], comms
            return app.export_screenshot()

    screenshot = asyncio.run(scenario())
    no_control_of_theirs(screenshot)
    assert "x1b]0;PWNED" in screenshot and "\\n&lt;svg&#160;onload" in screenshot
