"""One clock for two recorders whose clocks disagree by a known amount.

Recorder B runs in a time namespace whose CLOCK_MONOTONIC is 3 s ahead, so it takes its wall
offsets 3 s short: every time it records is 3 s early. Between two network namespaces joined by
a veth pair, processes connect both ways; both recorders see the TCP handshakes through
sock:inet_sock_set_state, and fdtrace estimates B's offset from A's from them: -3 s, within its
reported uncertainty, which stays under 1 ms."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdtrace.analysis import failures, load

from .test_record import FDTRACE, start_recorder

pytestmark = pytest.mark.bpf

SHIFT_S = 3
CONNECTIONS = 20

SERVE = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], 7100))
server.listen(64)
print("ready", flush=True)
for _ in range(int(sys.argv[2])):
    conn, _ = server.accept()
    conn.close()
"""

CONNECT = """
import socket, sys
for _ in range(int(sys.argv[2])):
    socket.create_connection((sys.argv[1], 7100), timeout=5).close()
"""


@pytest.fixture()
def two_namespaces() -> Iterator[tuple[list[str], list[str]]]:
    """Network namespaces a (10.231.0.1) and b (10.231.0.2), joined by a veth pair."""
    tag = uuid.uuid4().hex[:6]
    a, b = f"fdt-a-{tag}", f"fdt-b-{tag}"
    for name in (a, b):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "link", "add", f"va{tag}", "netns", a, "type", "veth", "peer", "name", f"vb{tag}",
                        "netns", b], check=True)
        for name, device, address in ((a, f"va{tag}", "10.231.0.1/24"), (b, f"vb{tag}", "10.231.0.2/24")):
            run = ["ip", "netns", "exec", name]
            subprocess.run([*run, "ip", "addr", "add", address, "dev", device], check=True)
            subprocess.run([*run, "ip", "link", "set", device, "up"], check=True)
            subprocess.run([*run, "ip", "link", "set", "lo", "up"], check=True)
        yield ["ip", "netns", "exec", a], ["ip", "netns", "exec", b]
    finally:
        for name in (a, b):
            subprocess.run(["ip", "netns", "delete", name], check=False)


def _exchange(inside: list[str], outside: list[str], address: str) -> None:
    """A server in one namespace, CONNECTIONS connections to it from the other."""
    server = subprocess.Popen([*inside, sys.executable, "-c", SERVE, address, str(CONNECTIONS)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        subprocess.run([*outside, sys.executable, "-c", CONNECT, address, str(CONNECTIONS)], check=True, timeout=30)
        server.wait(timeout=30)
    finally:
        server.kill()


def test_offset_of_a_shifted_clock(tmp_path: Path, two_namespaces: tuple[list[str], list[str]]) -> None:
    in_a, in_b = two_namespaces
    here, there = tmp_path / "a", tmp_path / "b"
    recorders = [
        start_recorder(here, "--interval", "0.5", "--comm", "none-such",
                       prefix=("unshare", "--uts", "sh", "-c", 'hostname clock-a && exec "$0" "$@"')),
        start_recorder(there, "--interval", "0.5", "--comm", "none-such",
                       prefix=("unshare", "--uts", "--time", "--monotonic", str(SHIFT_S), "--fork", "sh", "-c",
                               'hostname clock-b && exec "$0" "$@"')),
    ]
    try:
        _exchange(in_b, in_a, "10.231.0.2")  # a connects to b
        _exchange(in_a, in_b, "10.231.0.1")  # b connects to a
    finally:
        recorders[0].send_signal(signal.SIGINT)
        # unshare --fork waits for the recorder it forked, which is the one to stop
        children = Path(f"/proc/{recorders[1].pid}/task/{recorders[1].pid}/children").read_text().split()
        for child in children:
            os.kill(int(child), signal.SIGINT)
        for recorder in recorders:
            _, err = recorder.communicate(timeout=30)
            assert recorder.returncode == 0, err

    both = load([here, there])
    connections = both.connections
    for host in ("clock-a", "clock-b"):  # both see every handshake, each side once
        mine = connections[(connections["host"] == host) & (connections["local_port"] == 7100)]
        assert len(mine) == 2 * CONNECTIONS and set(mine["role"]) == {"server"}
    offsets = both.clock_offsets.set_index("host")
    b = offsets.loc["clock-b"]
    assert bool(offsets.loc["clock-a", "reference"]) and b["pairs"] == 4 * CONNECTIONS
    assert abs(b["offset_ns"] + SHIFT_S * 1e9) <= b["uncertainty_ns"] < 1_000_000
    # The same handshakes, on the corrected clock, at the same times on both hosts.
    servers = connections[connections["local_port"] == 7100].sort_values(["host", "time"])
    a_times = servers[servers["host"] == "clock-a"]["time"].astype("int64").to_numpy()
    b_times = servers[servers["host"] == "clock-b"]["time"].astype("int64").to_numpy()
    assert (abs(a_times - b_times) <= b["uncertainty_ns"] + 1_000_000).all()
    assert failures(both).empty
    shown = subprocess.run([FDTRACE, "info", str(here), str(there)], capture_output=True, text=True, check=True).stdout
    assert "clock: -3.000" in shown and f"{4 * CONNECTIONS} connection pairs" in shown
