"""fdtrace's own stats connection must not add to haproxy's failures (issue 25): a haproxy at its
FD limit fails each accept4 of it with EMFILE. A stats socket whose haproxy is at its limit is
not connected to, and one that does not answer is tried again less and less often. Over a real
Unix socket that accepts and never answers (what a haproxy at its limit looks like from outside)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from fdtrace.integrations.haproxy import MAX_BACKOFF_S, HaproxySampler, HaproxyWatch
from fdtrace.procfs import ProcFS
from fdtrace.tui.state import IncidentState


class Silent:
    """A stats socket that takes connections and never answers; it counts them."""

    def __init__(self, path: Path) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(64)
        self.connections = 0
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop taking connections and close those taken (no descriptor is left to the GC)."""
        self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(timeout=5)
        for connection in self.held:
            connection.close()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.held.append(connection)
            self.connections += 1


@pytest.fixture
def silent(tmp_path: Path) -> Iterator[tuple[Silent, str]]:
    path = tmp_path / "stats.sock"
    server = Silent(path)
    yield server, str(path)
    server.close()


def test_a_socket_that_does_not_answer_is_tried_again_less_and_less_often(silent: tuple[Silent, str]) -> None:
    server, path = silent
    now = [0.0]
    sampler = HaproxySampler([path], interval_s=1.0, timeout=0.05, clock=lambda: now[0])
    rows = []
    for second in range(200):
        now[0] = float(second)
        rows += sampler.sample_now()
    # tried at 0, 2, 6, 14, 30, 62, then every 60 s: 8 tries in 200 s, not 200
    assert len(rows) == server.connections == 8
    assert "fdtrace tries again in 2 s" in str(rows[0]["error"]) and "timed out" in str(rows[0]["error"])
    assert f"tries again in {MAX_BACKOFF_S:.0f} s" in str(rows[-1]["error"])


def test_the_socket_of_a_haproxy_at_its_fd_limit_is_not_connected_to(silent: tuple[Silent, str]) -> None:
    server, path = silent
    sampler = HaproxySampler([], interval_s=1.0, timeout=0.05)
    sampler.add(path, 4242)  # a stats socket its configuration names
    watch = HaproxyWatch(ProcFS(), sampler)
    at_limit = SimpleNamespace(pid=4242, start_ns=1, comm="haproxy", uid=os.getuid(), open_fds=256,
                               fd_soft_limit=256)
    watch.look([at_limit])
    rows = sampler.sample_now() + sampler.sample_now()
    assert server.connections == 0 and len(rows) == 2
    assert rows[0]["error"] == ("not asked while haproxy [4242] is at its FD limit (256 of 256): a connection of "
                                "fdtrace's would fail its accept4 with EMFILE, counted among haproxy's failures")
    # the view says why it was not asked (not that it does not answer)
    state = IncidentState()
    state.apply_haproxy(rows[:1], 1)
    assert state.log[-1].text.startswith(f"stats socket {path} not asked while haproxy [4242] is at its FD limit")
    watch.look([SimpleNamespace(**{**vars(at_limit), "open_fds": 100})])  # below its limit again: asked
    sampler.sample_now()
    assert server.connections == 1


def test_stats_socket_slots_go_to_root_and_system_services_first_then_per_user() -> None:
    """Issue 37 I: the slots of found sockets by priority, the refused counted once each."""
    from fdtrace.integrations.haproxy import FOUND_PER_USER, MAX_SOCKETS

    sampler = HaproxySampler(["/run/asked.sock"])
    taken = [sampler.add(f"/home/mallory/s{i}.sock", 100 + i, 1001) for i in range(20)]
    assert taken == [True] * FOUND_PER_USER + [False] * (20 - FOUND_PER_USER)
    assert sampler.add("/home/mallory/s19.sock", 119, 1001) is False  # asked again: counted once
    others = [sampler.add(f"/home/u{uid}/s.sock", uid, uid) for uid in range(1002, 1020)]
    assert sum(others) == MAX_SOCKETS - 1 - FOUND_PER_USER and len(sampler.sockets) == MAX_SOCKETS
    # full: root's haproxy and a system service's take the slot of the user holding the most
    assert sampler.add("/run/haproxy/admin.sock", 1, 0) and sampler.add("/run/svc.sock", 2, 999)
    assert len(sampler.sockets) == MAX_SOCKETS and "/run/asked.sock" in sampler.sockets
    assert sum(p.startswith("/home/mallory/") for p in sampler.sockets) == FOUND_PER_USER - 2
    assert sampler.refused[1001] == 20 - FOUND_PER_USER + 2
    assert sum(sampler.refused.values()) == 20 - FOUND_PER_USER + 2 + 18 - (MAX_SOCKETS - 1 - FOUND_PER_USER)
    said = sampler.shortfalls()
    assert len(said) == 1 and said[0].startswith(f"{sum(sampler.refused.values())} HAProxy stats sockets of "
                                                 "configurations not sampled: no slot left for its user (uid 1001 18")
