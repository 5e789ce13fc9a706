"""Test helpers that touch the system: memory and pids cgroups (v1 and v2); and the view built
as `fdtrace top` and `fdtrace replay` build it."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The fdtrace command of this environment.
FDTRACE = str(Path(sys.executable).with_name("fdtrace"))


def build_go(source_text: str, work: Path, name: str, cgo: bool = False) -> Path:
    """A Go program built from ``source_text`` in ``work`` (its own module cache there, no module
    mode), as ``work/name``; ``cgo``: with cgo enabled (the C library's resolver)."""
    source = work / f"{name}.go"
    source.write_text(source_text)
    binary = work / name
    env = {**os.environ, "GOCACHE": str(work / "cache"), "GOPATH": str(work / "gopath"), "HOME": str(work),
           "GO111MODULE": "off", "GOFLAGS": "", **({"CGO_ENABLED": "1"} if cgo else {})}
    subprocess.run(["go", "build", "-o", str(binary), str(source)], check=True, env=env, cwd=work,
                   capture_output=True, timeout=300)
    return binary


def _remove(group: Path) -> None:
    """Remove a cgroup once its last task has gone (exits take a moment to be reaped)."""
    for _ in range(50):
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def _memory_parent() -> tuple[Path, str]:
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return CGROUP_ROOT, "v2"
    if (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists():
        return CGROUP_ROOT / "memory", "v1"
    raise RuntimeError("no memory cgroup controller (v1 or v2) is mounted")


@contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A fresh memory cgroup with a hard limit and no swap; yields its cgroup.procs path."""
    parent, version = _memory_parent()
    group = parent / f"fdtrace-test-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        if version == "v2":
            (group / "memory.max").write_text(str(limit_bytes))
            swap = group / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
        else:
            (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
            swappiness = group / "memory.swappiness"
            if swappiness.exists():
                swappiness.write_text("0")
        yield group / "cgroup.procs"
    finally:
        _remove(group)


def _pids_parent() -> Path:
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if controllers.exists() and "pids" in controllers.read_text().split():
        subtree = CGROUP_ROOT / "cgroup.subtree_control"
        if "pids" not in subtree.read_text().split():
            subtree.write_text("+pids")
        return CGROUP_ROOT
    if (CGROUP_ROOT / "pids" / "cgroup.procs").exists():
        return CGROUP_ROOT / "pids"
    raise RuntimeError("no pids cgroup controller (v1 or v2) is mounted")


@contextmanager
def pids_cgroup(limit: int) -> Iterator[Path]:
    """A fresh cgroup whose pids.max is ``limit``; yields its cgroup.procs path."""
    group = _pids_parent() / f"fdtrace-test-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        (group / "pids.max").write_text(str(limit))
        yield group / "cgroup.procs"
    finally:
        _remove(group)


def started(argv: list[str], says: str) -> subprocess.Popen[str]:
    """A fdtrace command started, once its stderr says ``says`` (its probes are attached)."""
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        if says in line:
            break
    return process


def eventually(condition: Callable[[], T], what: str, timeout: float = 60, every: float = 0.1) -> T:
    """What ``condition()`` returns once it is true, asked every ``every`` s; fails naming ``what``
    after ``timeout`` s. The wait for a readiness signal (a figure reaching its value, a line, a
    file) that replaces a fixed sleep before counting: a busy machine takes longer, not fails."""
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(every)


def wait_recorded(out: Path, ready: Callable[[Any], bool], what: str, timeout: float = 60) -> Any:
    """The live recording ``out`` (its recorder still writing), once ``ready(recording)``: what a
    test counts has reached the disk, and not merely the kernel. A read that meets a part file
    being written is asked again."""
    from fdtrace.analysis import load
    from fdtrace.errors import FdtraceError

    def read() -> Any:
        try:
            recording = load(out)
        except (FdtraceError, OSError):
            return None
        return recording if ready(recording) else None

    return eventually(read, what, timeout, every=0.25)


async def shown(pilot: Any, ready: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Let a Textual app under test run until ``ready()`` (``timeout`` s at most: a loaded host
    draws late, not never); fails naming ``what``."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await pilot.pause(0.05)


class Lines:
    """The lines of a child's output stream, read by a thread as they come (``lines``), so a test
    can wait for one without blocking past a deadline; ``rest()`` joins the reader at end of file."""

    def __init__(self, stream: Any) -> None:
        import threading

        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True, name="tests.Lines")
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line)

    def until(self, done: Callable[[list[str]], bool], what: str, timeout: float = 60) -> list[str]:
        """The lines so far, once ``done(lines)``."""
        eventually(lambda: done(list(self.lines)), what, timeout, every=0.05)
        return list(self.lines)

    def rest(self, timeout: float = 60) -> str:
        """Every line, once the stream is at its end (the child has exited or closed it)."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream did not end"
        return "".join(self.lines)


def exit_recorded(out: Path, pid: int, timeout: float = 60) -> Any:
    """The live recording ``out`` once the exit of ``pid`` is on disk, and so every event of
    ``pid`` before it (a recorder stopped then has nothing of it left to write)."""
    def exited(rec: Any) -> bool:
        return bool(((rec.events["pid"] == pid) & (rec.events["kind"] == "process_exit")).any())
    return wait_recorded(out, exited, f"the exit of {pid} recorded", timeout)


def replay_app(feed: Any, keep_exited_s: float = 300.0) -> Any:
    """The view over a started ReplaySource, its pipeline and controls built as `fdtrace replay`
    builds them."""
    from fdtrace.pipeline import Pipeline
    from fdtrace.sources.replay import ReplayControls
    from fdtrace.tui.app import make_app

    pipeline = Pipeline(feed, source_started=True)
    return make_app(pipeline, ReplayControls(pipeline, feed), keep_exited_s=keep_exited_s)


async def until(pilot: Any, ready: Callable[[], bool], what: str = "the view", timeout_s: float = 30.0) -> None:
    """Let the view run until ``ready`` (``timeout_s`` at most: a loaded host draws late, not
    never), checking every 20 ms; an AssertionError names ``what`` if it never is."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} was not ready within {timeout_s:.0f} s")
        await pilot.pause(0.02)


async def settle(pilot: Any) -> None:
    """Wait until the view shows a poll of its source made after this call: two updates handed
    over since (the first may come from a poll already under way), all folded in, and no backlog
    left at the source. A replay's clock moved or a seek made before the call is then on screen,
    however busy the machine."""
    sink = pilot.app.view_sink
    start = sink.received
    await until(pilot, lambda: sink.received >= start + 2 and sink.settled, "a poll of the source after the call")


def live_app(source: Any, record_dir: Path | None = None) -> Any:
    """The view over a started LiveSource, its pipeline and controls (R records to
    ``record_dir``) built as `fdtrace top` builds them."""
    from fdtrace.pipeline import Pipeline
    from fdtrace.sinks.recorder import LiveControls
    from fdtrace.tui.app import make_app

    pipeline = Pipeline(source, source_started=True)
    return make_app(pipeline, LiveControls(pipeline, record_dir))


async def replay_to_end(pilot: Any, feed: Any, clock: list[int], step_ns: int = 250_000_000,
                        steps: int = 400) -> None:
    """Move a replay's clock (``clock[0]``, the ns its ReplaySource reads) until the recording is
    played, then one rate window more, letting the view draw between steps."""
    for _ in range(steps):
        if feed.player.finished:
            break
        clock[0] += step_ns
        await pilot.pause(0.02)
    clock[0] += 3_000_000_000
    await settle(pilot)


def replayed_detail(recording: Path, pid: int) -> str:
    """The live view's detail of ``pid`` once a replay of ``recording`` is played to its end, its
    whitespace folded (the words as one line)."""
    import asyncio

    from textual.widgets import Static

    from fdtrace.sources.replay import ReplaySource
    from fdtrace.tui.screens import ProcessScreen

    clock = [0]
    feed = ReplaySource(recording, clock=lambda: clock[0])
    app = replay_app(feed)

    async def detail() -> str:
        async with app.run_test(size=(200, 60)) as pilot:
            await replay_to_end(pilot, feed, clock)
            app.push_screen(ProcessScreen(pid))
            await pilot.pause(0.5)
            return str(app.screen.query_one("#detail", Static).render())

    return " ".join(asyncio.run(detail()).split())


def drain(leader: int, quiet_s: float = 0.2) -> bytes:
    """What is left to read on a pseudo-terminal's leader side, until it stays quiet for
    ``quiet_s`` or its other side is closed."""
    import select

    taken = b""
    while select.select([leader], [], [], quiet_s)[0]:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        taken += chunk
    return taken


def ctypes_layout(kind: Any) -> Any:
    """A ctypes type as its size, alignment and members' names, offsets and layouts."""
    members = [(name, getattr(kind, name).offset, ctypes_layout(rest[0]))
               for name, *rest in getattr(kind, "_fields_", [])]
    length = getattr(kind, "_length_", None)
    element = ctypes_layout(kind._type_) if length is not None else None
    return ctypes.sizeof(kind), ctypes.alignment(kind), members, length, element
