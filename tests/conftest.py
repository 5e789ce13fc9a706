"""Shared fixtures: a live tracer for the tests that attach real BPF programs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fdtrace.schema.records import ProcessTotals


def needs_root() -> pytest.MarkDecorator:
    return pytest.mark.skipif(os.geteuid() != 0, reason="attaching BPF programs needs root")


@dataclass
class ChildRun:
    """What one child process did, as the tracer saw it."""

    pid: int
    returncode: int
    events: list[dict[str, Any]]
    totals: list[ProcessTotals]
    stdout: str = ""

    def of_kind(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind and all(e[k] == v for k, v in match.items())]

    @property
    def total(self) -> ProcessTotals:
        assert len(self.totals) == 1, self.totals
        return self.totals[0]


@dataclass
class LiveTracer:
    """A KernelSession polled by a background thread that keeps every event."""

    source: Any
    events: list[dict[str, Any]] = field(default_factory=list)
    losses: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: bool = False

    def loop(self) -> None:
        while not self.stopping:
            with self.lock:
                batch = self.source.poll()
                self.losses = batch.losses
                if len(batch):
                    self.events.extend(batch.events.to_pylist())
            time.sleep(0.01)

    def run(self, argv: list[str], timeout: float = 60, **popen: Any) -> ChildRun:
        """Run a child to its end and return what was traced of it."""
        start_ns = time.monotonic_ns()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, **popen)
        stdout, _ = proc.communicate(timeout=timeout)
        return self.collect(proc.pid, proc.returncode, start_ns, stdout)

    def collect(self, pid: int, returncode: int, start_ns: int, stdout: str = "") -> ChildRun:
        # 60 s: the tracer watches the whole host, and a busy one (a flood of another test beside
        # it) kept its poll thread decoding for seconds: a run beside other suites saw none in 10 s
        deadline = time.monotonic() + 60
        while True:
            with self.lock:
                mine = [e for e in self.events if e["pid"] == pid and e["ts_ns"] >= start_ns]
            if any(e["kind"] == "process_exit" for e in mine):
                break
            assert time.monotonic() < deadline, f"no process_exit event for pid {pid}"
            time.sleep(0.02)
        with self.lock:
            store = self.source.read_counters()
        totals = [t for t in store.for_pid(pid) if t.first_ts >= start_ns]
        return ChildRun(pid, returncode, mine, totals, stdout)


@pytest.fixture(scope="module")
def live_tracer() -> Iterator[LiveTracer]:
    """A tracer of the whole host for one test module: it keeps every event it sees, so it must
    not outlive the tests that read them (session-wide, it grew the suite's own memory by the
    events of everything the host did after, and the memory bounds of later tests measured that)."""
    if os.geteuid() != 0:
        pytest.skip("attaching BPF programs needs root")
    from fdtrace.kernel.session import KernelSession

    source = KernelSession()
    source.start()
    tracer = LiveTracer(source)
    thread = threading.Thread(target=tracer.loop, daemon=True)
    thread.start()
    yield tracer
    tracer.stopping = True
    thread.join()
    source.stop()


def python_child(code: str) -> list[str]:
    """argv of a Python child running ``code`` (no site imports: nothing but what it says)."""
    return [sys.executable, "-S", "-c", code]


#: The checkout: some tests run its fdtrace as another user (nobody, through setpriv).
CHECKOUT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _checkout_reachable_by_other_users() -> Iterator[None]:
    """The tests that run fdtrace as nobody (its refusal without privileges, the service with only
    its capabilities) need the checkout's folders traversable by other users. A clone made in
    `mktemp -d` (mode 0700, as CI makes it) is not: each folder on the way that lacks the others'
    search bit gets it (search only: nothing becomes listable or readable that was not) for the
    session, and its mode back afterwards."""
    changed = []
    if os.geteuid() == 0:
        for folder in [*reversed(CHECKOUT.parents), CHECKOUT]:
            mode = stat.S_IMODE(folder.stat().st_mode)
            if not mode & stat.S_IXOTH:
                os.chmod(folder, mode | stat.S_IXOTH)
                changed.append((folder, mode))
    yield
    for folder, mode in reversed(changed):
        os.chmod(folder, mode)


#: Where the suite writes what a test module left running (set FDTRACE_LEFTOVERS to a path).
LEFTOVERS = os.environ.get("FDTRACE_LEFTOVERS")
#: Set in the suite's environment, so every process it starts (and theirs) carries it: an orphan
#: of the suite's is told apart from the host's other processes by it.
SUITE_MARK = "FDTRACE_TEST_SUITE"
if LEFTOVERS:
    os.environ[SUITE_MARK] = str(os.getpid())


@pytest.fixture(scope="module", autouse=True)
def _leftover_children(request: pytest.FixtureRequest) -> Iterator[None]:
    """With FDTRACE_LEFTOVERS set: after each module, the processes and threads the suite still has
    that it did not have before the module (a test that does not stop what it started tips later
    tests on a busy machine). It only reports; it changes nothing."""
    if not LEFTOVERS:
        yield
        return
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    threads_before = {t.name for t in threading.enumerate()}
    alive_before = set(psutil.pids())  # not create_time: the boot time it adds is whole seconds
    yield
    lines = []
    for child in me.children(recursive=True):
        if child.pid not in before:
            try:
                lines.append(f"  process {child.pid}: {' '.join(child.cmdline())[:200]}")
            except psutil.Error:
                continue
    # and what outlived its parent (a daemon, an orphaned grandchild): started during the module,
    # alive still, no child of the suite's
    mine = {p.pid for p in me.children(recursive=True)}
    for process in psutil.process_iter(["pid", "cmdline", "ppid"]):
        info = process.info
        if info["pid"] not in alive_before and info["pid"] not in mine:
            try:
                if process.environ().get(SUITE_MARK) != str(me.pid):
                    continue  # the host's, or another suite's
            except psutil.Error:
                continue  # gone, or a zombie: nothing left running
            lines.append(f"  orphan {info['pid']} (parent {info['ppid']}): {' '.join(info['cmdline'] or [])[:200]}")
    lines += [f"  thread {t.name}" for t in threading.enumerate() if t.name not in threads_before]
    if lines:
        with open(LEFTOVERS, "a") as out:
            out.write(f"{request.module.__name__}\n" + "\n".join(lines) + "\n")
