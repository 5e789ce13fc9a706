"""The kernel's table of ended processes filling up (churn faster than fdtrace drains it) costs
only the ended processes' totals, and says so: a live process's counts and failures stay exact
(issue 34)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.conftest import python_child

pytestmark = pytest.mark.bpf

ROOM_FOR_ENDED = 8
CHILDREN = 64
SOCKETS = 37
REFUSED = 5

CHURN_THEN_FAIL = f"""
import os, resource, socket, sys
for _ in range({CHILDREN}):
    pid = os.fork()
    if pid == 0:
        socket.socket().close()
        os._exit(0)
    os.waitpid(pid, 0)
held = [socket.socket() for _ in range({SOCKETS})]
resource.setrlimit(resource.RLIMIT_NOFILE, (max(held, key=lambda s: s.fileno()).fileno() + 1, 4096))
for _ in range({REFUSED}):
    try:
        socket.socket()
    except OSError:
        pass
print("done", flush=True)
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def session() -> Iterator[object]:
    if os.geteuid() != 0:
        pytest.skip("attaching BPF programs needs root")
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.kernel.session import KernelSession

    source = KernelSession(TraceOptions(max_exited=ROOM_FOR_ENDED))
    source.start()
    yield source
    source.stop()


def test_a_full_table_of_ended_processes_costs_no_live_count(session: object) -> None:
    from fdtrace.kernel.session import KernelSession
    from fdtrace.tui.state import exact_counts

    assert isinstance(session, KernelSession)
    session.read_counters()  # what ended before this test is drained; from here nothing is, until the churn is over
    child = subprocess.Popen(python_child(CHURN_THEN_FAIL), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        deadline = time.monotonic() + 60
        while child.stdout.readline() != "done\n":  # the child says when its churn and failures are over
            assert time.monotonic() < deadline and child.poll() is None
        session.poll()
        losses = session.read_losses()
        store = session.read_counters()
        (live,) = [t for t in store.for_pid(child.pid) if t.exit_ts is None]
        assert live.counts["sockets"] == SOCKETS + REFUSED and live.counts["socket_errors"] == REFUSED
        assert live.errors == {("socket", "EMFILE"): REFUSED}
        assert losses["exited_full"] >= CHILDREN - ROOM_FOR_ENDED  # the host's own ends may add to it
        assert exact_counts(losses).startswith("counts exact but ended processes' totals")
    finally:
        child.kill()
        child.wait()
