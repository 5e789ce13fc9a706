"""The incident host of issue 34, shared by tests/bpf/test_top_incident.py (short) and
bench/live_incident (long): `fdtrace top` in a real terminal (tmux) while two fork-and-exit loops
and a socket flood run, and programs that fail with EMFILE start one after another. Measures when
each failing program is on screen after its failure, top's RSS over time, and how long `q` takes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

FORK_LOOP = r"""
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {  /* fork a child that exits at once, reap it, forever */
    for (;;) {
        pid_t pid = fork();
        if (pid == 0) _exit(0);
        if (pid > 0) waitpid(pid, NULL, 0);
    }
}
"""
FLOOD = """
import socket
open('/proc/self/comm', 'w').write('sock-flood')
while True:
    socket.socket().close()
"""
FAILING = """
import os, sys, time
open('/proc/self/comm', 'w').write(sys.argv[1])
held = []
try:
    while True:
        held.append(os.open('/dev/null', os.O_RDONLY))
except OSError:
    pass
print(time.monotonic(), flush=True)  # when it failed with EMFILE
time.sleep(float(sys.argv[2]))
"""


@dataclass
class Figures:
    shown_after_s: dict[str, float | None] = field(default_factory=dict)  # failing program -> seconds until on screen
    rss_mb: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, top's RSS)
    quit_s: float | None = None
    processes_started: int = 0
    load_1m: list[float] = field(default_factory=list)  # the 1-minute load average as each program failed
    missed: dict[str, str] = field(default_factory=dict)  # failing program not shown -> the screen then


def build_fork_loop(folder: Path) -> Path:
    source = folder / "forkloop.c"
    source.write_text(FORK_LOOP)
    binary = folder / "fdt-forkloop"
    subprocess.run(["cc", "-O2", "-o", str(binary), str(source)], check=True, capture_output=True)
    return binary


def screen(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, RssAnon) of a process in MB; (0, 0) once it is gone."""
    figures = {"VmRSS:": 0.0, "RssAnon:": 0.0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = line.split(maxsplit=1)[0] if line else ""
            if key in figures:
                figures[key] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return figures["VmRSS:"], figures["RssAnon:"]


def rss_mb(pid: int) -> float:
    return memory_mb(pid)[0]


def has_ended(pid: int) -> bool:
    """Whether the process has exited: gone, or a zombie its parent has not reaped yet (tmux's
    server reaps its panes' processes up to a second or two late; a shell waits at once)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2][:1]
    except OSError:
        return True
    return state in ("Z", "X")


def processes_started() -> int:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("processes "):
            return int(line.split()[1])
    return 0


def start_top(fdtrace: str, session: str, folder: Path, size: tuple[int, int] = (220, 60)) -> int:
    """`fdtrace top` in a new tmux session of ``size``, once its screen is drawn; its pid."""
    pid_file = folder / "top.pid"
    command = f"echo $$ > {pid_file}; exec {fdtrace} top"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", str(size[0]), "-y", str(size[1]),
                    "bash", "-c", command], check=True)
    deadline = time.monotonic() + 180
    while "events/s" not in screen(session):  # attached and drawn
        assert time.monotonic() < deadline, f"top did not start: {screen(session)}"
        time.sleep(0.2)
    return int(pid_file.read_text())


@dataclass
class TopInTmux:
    """`fdtrace top` running in a tmux session (``top_in_tmux``), and the load started beside it."""

    session: str
    folder: Path
    pid: int = 0
    load: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_load(self, fork_loops: int, floods: int) -> None:
        """Start ``fork_loops`` fork-and-exit loops and ``floods`` socket floods, until the end."""
        fork_loop = build_fork_loop(self.folder) if fork_loops else None
        self.load += [subprocess.Popen([str(fork_loop)]) for _ in range(fork_loops)]
        self.load += [subprocess.Popen([sys.executable, "-S", "-c", FLOOD]) for _ in range(floods)]


@contextmanager
def top_in_tmux(fdtrace: str, name: str, size: tuple[int, int] = (220, 60)) -> Iterator[TopInTmux]:
    """`fdtrace top` in a tmux session named after ``name``, drawn; at the end the load is killed,
    the session closed and its folder removed."""
    top = TopInTmux(session=f"{name}-{os.getpid()}-{time.monotonic_ns()}",
                    folder=Path(tempfile.mkdtemp(prefix="fdtrace-incident-")))
    try:
        top.pid = start_top(fdtrace, top.session, top.folder, size)
        yield top
    finally:
        for proc in top.load:
            proc.kill()
            proc.wait()
        subprocess.run(["tmux", "kill-session", "-t", top.session], capture_output=True)
        shutil.rmtree(top.folder, ignore_errors=True)


def run(fdtrace: str, programs: int = 6, gap_s: float = 5.0, hold_s: float = 4.0, timeout_s: float = 2.0,
        size: tuple[int, int] = (220, 60), fork_loops: int = 2, floods: int = 1) -> Figures:
    """Start top in tmux, the load (``fork_loops`` fork-and-exit loops, ``floods`` socket floods),
    then ``programs`` failing programs ``gap_s`` apart; each is watched for ``timeout_s`` after its
    failure (a figure of None: not shown in that time)."""
    figures = Figures()
    with top_in_tmux(fdtrace, "fdt-incident", size) as top:
        started, begun = time.monotonic(), processes_started()
        top.start_load(fork_loops, floods)
        for index in range(programs):
            name = f"emfile-{index}"
            failing = subprocess.Popen(["prlimit", "--nofile=40:40", sys.executable, "-S", "-c", FAILING, name,
                                        str(hold_s)], stdout=subprocess.PIPE, text=True)
            assert failing.stdout is not None
            failed_at = float(failing.stdout.readline())
            shown, text = None, ""
            while time.monotonic() - failed_at < timeout_s:
                text = screen(top.session)
                if name in text:
                    shown = time.monotonic() - failed_at
                    break
                time.sleep(0.05)
            figures.shown_after_s[name] = shown
            if shown is None:
                figures.missed[name] = text
            figures.load_1m.append(os.getloadavg()[0])
            figures.rss_mb.append((time.monotonic() - started, rss_mb(top.pid)))
            failing.wait(timeout=hold_s + 30)
            while time.monotonic() - failed_at < gap_s:
                time.sleep(0.2)
        figures.processes_started = processes_started() - begun
        figures.rss_mb.append((time.monotonic() - started, rss_mb(top.pid)))
        asked = time.monotonic()
        subprocess.run(["tmux", "send-keys", "-t", top.session, "q"], check=True)
        while not has_ended(top.pid) and time.monotonic() - asked < 30:
            time.sleep(0.02)
        figures.quit_s = time.monotonic() - asked
    return figures
