"""`replay` in a real terminal (tmux) jumps from incident to incident (issue 35): three programs'
EMFILE storms, recorded by the real recorder; three presses of `n` reach each program's first
failure in turn, each named on the position line with its count, and the bar marks three
incidents, not their calls."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fdtrace.analysis import load
from tests.conftest import needs_root
from tests.helpers import FDTRACE, started

pytestmark = [needs_root(), pytest.mark.bpf,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]

TAG = os.getpid() % 100000
PROGRAMS = {f"alpha-{TAG}": 5, f"bravo-{TAG}": 7, f"charlie-{TAG}": 9}  # each one's EMFILE count
STORM = """
import ctypes, socket, sys
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(sys.argv[1].encode()), 0, 0, 0)
held, refused = [], 0
while refused < int(sys.argv[2]):
    try:
        held.append(socket.socket())
    except OSError as exc:
        assert exc.errno == 24, exc
        refused += 1
print(refused, flush=True)
"""


SESSION = f"fdtrace-replay-{TAG}"
TMUX = ["tmux", "-L", SESSION, "-f", "/dev/null"]  # a server of its own, sized as asked


def screen(session: str) -> str:
    return subprocess.run([*TMUX, "capture-pane", "-p", "-t", session], capture_output=True, text=True,
                          check=True).stdout


def wait_for(session: str, *texts: str, timeout: float = 60) -> str:
    """The screen once it shows every one of ``texts`` at once."""
    deadline = time.monotonic() + timeout
    while True:
        shown = screen(session)
        if all(text in shown for text in texts):
            return shown
        assert time.monotonic() < deadline, f"{texts!r} never shown together:\n{shown}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("storms") / "rec"
    recorder = started([FDTRACE, "record", "-o", str(out), "--interval", "0.2",
                        *(arg for comm in PROGRAMS for arg in ("--comm", comm))], "recording to")
    try:
        for name, count in PROGRAMS.items():
            done = subprocess.run(["prlimit", "--nofile=24:24", sys.executable, "-c", STORM, name, str(count)],
                                  capture_output=True, text=True, timeout=60, check=True)
            assert int(done.stdout) == count
    finally:
        recorder.send_signal(signal.SIGINT)
        _, said = recorder.communicate(timeout=60)
    assert recorder.returncode == 0, said
    return out


def test_three_presses_of_n_reach_each_programs_first_failure_in_turn(recording: Path) -> None:
    events = load(recording).events
    failed = events[events["errno"] == "EMFILE"]
    assert failed.groupby("comm", observed=True).size().to_dict() == PROGRAMS
    firsts = failed.groupby("comm", observed=True)["time"].min()
    session = SESSION
    subprocess.run([*TMUX, "new-session", "-d", "-s", session, "-x", "200", "-y", "50",
                    f"env -u COLUMNS -u LINES {FDTRACE} replay {recording}"], check=True)  # the pane's size
    try:
        wait_for(session, "replay 1x")
        subprocess.run([*TMUX, "send-keys", "-t", session, "space"], check=True)  # paused: the clock stays put
        wait_for(session, "replay paused")
        subprocess.run([*TMUX, "send-keys", "-t", session, "{"], check=True)  # back to the start
        wait_for(session, f"replay paused, {events['time'].min().strftime('%H:%M:%S')} UTC")
        for number, (name, count) in enumerate(PROGRAMS.items(), start=1):
            subprocess.run([*TMUX, "send-keys", "-t", session, "n"], check=True)
            # The header names the incident as soon as n is pressed; the log is rebuilt up to it
            # by the updates that follow, drawn as they are folded in: both, before counting.
            shown = wait_for(session, f"incident {number} of 3: {name} socket EMFILE ×{count}",
                             f" {name}[", timeout=30)
            at = firsts[name].strftime("%H:%M:%S")
            assert f"{at} UTC │ incident {number} of 3" in shown
            # the view is rebuilt up to that failure: the log has its program's, not the later ones'
            log = [line for line in shown.splitlines() if "socket failed with EMFILE" in line]
            assert any(f" {name}[" in line for line in log), shown
            assert not any(f" {later}[" in line for line in log for later in list(PROGRAMS)[number:]), shown
        [bar] = [line for line in shown.splitlines() if "│ incident 3 of 3" in line]
        assert 1 <= bar.count("▲") <= 3  # incidents marked, not their 21 calls (close ones share a cell)
    finally:
        subprocess.run([*TMUX, "kill-server"], check=False)


def test_the_view_draws_on_the_terminal_when_stderr_is_redirected(recording: Path, tmp_path: Path) -> None:
    """`replay 2>file` on a terminal still draws (on stdout's terminal), and what it says at the
    end still goes to the file; with no terminal at all, one line says why."""
    import pty
    import select

    leader, follower = pty.openpty()
    errors = (tmp_path / "err.txt").open("w")
    view = subprocess.Popen([FDTRACE, "replay", str(recording)], stdin=follower, stdout=follower, stderr=errors,
                            env={**os.environ, "TERM": "xterm-256color"})
    os.close(follower)
    screen = b""
    try:
        deadline = time.monotonic() + 60
        while b"file-nr" not in screen and time.monotonic() < deadline:  # the header of its first screen
            if select.select([leader], [], [], 0.5)[0]:
                screen += os.read(leader, 65536)
        assert b"file-nr" in screen
        os.write(leader, b"q")
        deadline = time.monotonic() + 60
        while view.poll() is None and time.monotonic() < deadline:  # read what it draws meanwhile: a full
            if select.select([leader], [], [], 0.2)[0]:                # terminal would hold it back
                try:
                    os.read(leader, 65536)
                except OSError:  # it closed the terminal
                    break
        assert view.wait(timeout=10) == 0
    finally:
        os.close(leader)
        errors.close()
        if view.poll() is None:
            view.kill()
            view.wait()
    alone = subprocess.run([FDTRACE, "replay", str(recording)], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=60, start_new_session=True)  # no controlling terminal
    assert alone.returncode != 0 and len(alone.stderr.splitlines()) == 1, alone.stderr
    assert alone.stderr.startswith("fdtrace: error: the view draws on a terminal, and there is none")
