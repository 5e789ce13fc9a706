"""Python frames of blocked threads, read from real CPython processes: `threads` and the
recorder's census name the Python function and line the threads wait in."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdtrace.analysis import load, threads
from fdtrace.procfs.python_frames import PythonStackReader
from tests.helpers import FDTRACE

THREADS = 20
HOLDER = """import os, sys, threading


def hold_pipe(fd):
    os.read(fd, 1)  # blocked here


pipes = [os.pipe() for _ in range({threads})]
for reader, _writer in pipes:
    threading.Thread(target=hold_pipe, args=(reader,), daemon=True).start()
print(" ".join(str(t.native_id) for t in threading.enumerate() if t is not threading.main_thread()), flush=True)
sys.stdin.read(1)
"""
#: Debian's 3.11 (what fdtrace runs on) and the other interpreters this kind of machine carries.
INTERPRETERS = {"3.11": "/usr/bin/python3.11", "3.12": "/root/.pyenv/versions/3.12.1/bin/python3.12",
                "3.13": "/root/.pyenv/versions/3.13.0/bin/python3.13",
                "3.10": "/root/.pyenv/versions/3.10.13/bin/python3.10"}


def interpreter(version: str) -> str:
    path = INTERPRETERS[version]
    if not Path(path).exists():
        pytest.skip(f"no Python {version} at {path} on this machine")
    return path


def blocked_line() -> int:
    return next(n for n, text in enumerate(HOLDER.splitlines(), 1) if "# blocked here" in text)


@pytest.fixture
def holder(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[str]]:
    """A Python program with THREADS threads blocked in os.read of pipes in hold_pipe, once they
    are all there (each thread's /proc syscall file says read)."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER.format(threads=THREADS))
    program = subprocess.Popen([interpreter(request.param), str(script)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert program.stdout is not None
        tids = program.stdout.readline().split()
        assert len(tids) == THREADS
        deadline = time.monotonic() + 30
        while not all(_in_read(program.pid, int(tid)) for tid in tids):
            assert time.monotonic() < deadline, "the threads never blocked in read()"
            time.sleep(0.05)
        yield program
    finally:
        program.kill()
        program.wait()


def _in_read(pid: int, tid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[0] == "0"  # x86-64 read
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("holder", ["3.11", "3.12", "3.13"], indirect=True)
def test_threads_names_the_python_function_and_line_each_blocked_thread_waits_in(
        holder: subprocess.Popen[str]) -> None:
    result = subprocess.run([FDTRACE, "threads", "--pid", str(holder.pid), "--json"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    site = f"hold_pipe (holder.py:{blocked_line()})"
    assert {"syscall": "read", "fd_kind": "pipe", "site": site, "threads": THREADS} in out["census"]
    assert out["python"]["frames_unread"] is None
    said = subprocess.run([FDTRACE, "threads", "--pid", str(holder.pid)], capture_output=True, text=True, timeout=60)
    assert f"{THREADS} threads blocked in read() on pipes at {site}" in said.stdout


@pytest.mark.parametrize("holder", ["3.11", "3.12", "3.13"], indirect=True)
def test_each_thread_has_its_whole_python_stack(holder: subprocess.Popen[str]) -> None:
    stacks = PythonStackReader().stacks(holder.pid)
    assert stacks is not None and stacks.unread is None
    held = [frames for frames in stacks.stacks.values() if frames and frames[0].function == "hold_pipe"]
    assert len(held) == THREADS
    for frames in held:
        # the thread's own function, then threading's run, _bootstrap_inner, _bootstrap
        assert [f.function for f in frames] == ["hold_pipe", "Thread.run", "Thread._bootstrap_inner",
                                                "Thread._bootstrap"]
        assert frames[0].line == blocked_line() and frames[0].file.endswith("holder.py")
        run = frames[1]
        assert run.line is not None and "self._target(" in Path(run.file).read_text().splitlines()[run.line - 1]


@pytest.mark.parametrize("holder", ["3.10"], indirect=True)
def test_a_python_whose_frames_fdtrace_cannot_read_is_said_so(holder: subprocess.Popen[str]) -> None:
    said = subprocess.run([FDTRACE, "threads", "--pid", str(holder.pid)], capture_output=True, text=True, timeout=60)
    assert said.returncode == 0, said.stderr
    assert "(Python 3.10: frames not read (fdtrace reads 3.11, 3.12 and 3.13): the sites above are the " \
           "interpreter's C code)" in said.stdout
    assert f"{THREADS + 1} threads blocked in read() on pipes" in said.stdout  # counted all the same


@pytest.mark.parametrize("holder", ["3.11"], indirect=True)
def test_the_recorders_census_holds_the_python_sites(holder: subprocess.Popen[str], tmp_path: Path) -> None:
    out = tmp_path / "rec"
    recorder = subprocess.Popen([FDTRACE, "record", "-o", str(out), "--pid", str(holder.pid), "--interval", "0.5"],
                                stderr=subprocess.PIPE, text=True)
    site = f"hold_pipe (holder.py:{blocked_line()})"
    try:
        assert recorder.stderr is not None
        for line in recorder.stderr:
            if "recording to" in line:
                break
        deadline = time.monotonic() + 60
        while True:
            try:
                census = threads(load(out), pid=holder.pid)
            except Exception:  # a part renamed into place while listed: read again
                census = None
            if census is not None and len(census) and (census["site"] == site).any():
                break
            assert time.monotonic() < deadline, "no census with the Python site in 60 s"
            time.sleep(0.2)
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.communicate(timeout=60)
    census = threads(load(out), pid=holder.pid)
    held = census[census["site"] == site]
    assert set(held["threads"]) == {THREADS} and set(held["syscall"]) == {"read"} and set(held["fd_kind"]) == {"pipe"}
