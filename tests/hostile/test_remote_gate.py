"""rehearse's remote gate (issue 37, F): an address is on this host only when this network
namespace routes it to its own loopback, or when a namespace root named holds it and the route
there goes through no gateway. Before, any namespace of the host that held the address made it
local: `nobody` made one (unshare -Urn, no privilege needed) holding an address outside, and
rehearse's connections to it left the host while root's fdtrace took it for local.

Everything here runs inside namespaces the test makes: fdtrace in A (its loopback, and a veth to
B whose end is its default gateway), B named and holding 10.237.0.2, C `nobody`'s own (made with
unshare -Urn) holding 198.51.100.7 on its loopback. Whatever fdtrace decided, nothing it sends
leaves A and B."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.helpers import FDTRACE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes network namespaces: needs root")

NOBODY = pwd.getpwnam("nobody")
OUTSIDE = "198.51.100.7"
LISTEN = ("import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(8); "
          "print(s.getsockname()[1], flush=True); input()")
FIND = ("import sys; from fdtrace.rehearsal.target import find_target\n"
        "from fdtrace.errors import FdtraceError\n"
        "try:\n    t = find_target(sys.argv[1])\n    print('local', t.namespace, *t.listeners)\n"
        "except FdtraceError as e:\n    print('refused', e)\n")


@dataclass
class Net:
    a: str
    b: str
    listeners: dict[str, tuple[int, int]]  # where: (port, pid)


def _listen(argv: list[str], address: str, **user: object) -> subprocess.Popen[str]:
    return subprocess.Popen([*argv, sys.executable, "-I", "-c", LISTEN, address], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, **user)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    a, b = f"fdt37a{os.getpid()}", f"fdt37b{os.getpid()}"
    run = lambda *argv: subprocess.run(argv, check=True, capture_output=True)  # noqa: E731
    processes: list[subprocess.Popen[str]] = []
    run("ip", "netns", "add", a)
    run("ip", "netns", "add", b)
    try:
        run("ip", "link", "add", "veth37a", "netns", a, "type", "veth", "peer", "name", "veth37b", "netns", b)
        for ns, dev, address in ((a, "veth37a", "10.237.0.1/24"), (b, "veth37b", "10.237.0.2/24")):
            run("ip", "-n", ns, "link", "set", "lo", "up")
            run("ip", "-n", ns, "addr", "add", address, "dev", dev)
            run("ip", "-n", ns, "link", "set", dev, "up")
        # A's way out: into B, which forwards nothing
        run("ip", "-n", a, "route", "add", "default", "via", "10.237.0.2")
        listeners: dict[str, tuple[int, int]] = {}
        starts = {"a": (["ip", "netns", "exec", a], "127.0.0.1", {}),
                  "b": (["ip", "netns", "exec", b], "10.237.0.2", {}),
                  # nobody's own namespace: the address it gave itself, and a listener there
                  "c": (["unshare", "-Urn", "sh", "-c", f'ip addr add {OUTSIDE}/32 dev lo && ip link set lo up && '
                         'exec "$@"', "sh"], OUTSIDE,
                        {"user": NOBODY.pw_uid, "group": NOBODY.pw_gid, "extra_groups": []})}
        for where, (argv, address, user) in starts.items():
            process = _listen(argv, address, **user)
            processes.append(process)
            assert process.stdout is not None
            listeners[where] = (int(process.stdout.readline()), process.pid)
        yield Net(a, b, listeners)
    finally:
        for process in processes:
            process.kill()
            process.wait()
        for ns in (a, b):
            subprocess.run(["ip", "netns", "delete", ns], check=False)


def find_in_a(net: Net, target: str) -> str:
    found = subprocess.run(["ip", "netns", "exec", net.a, sys.executable, "-I", "-c", FIND, target],
                           capture_output=True, text=True, timeout=60)
    assert found.returncode == 0 and "Traceback" not in found.stderr, found.stderr
    return found.stdout.strip()


def tcp_opens(pid: int) -> int:
    """ActiveOpens of the TCP counters of the namespace ``pid`` is in (connections it began)."""
    with open(f"/proc/{pid}/net/snmp") as file:
        names, values = [line.split() for line in file if line.startswith("Tcp:")]
    return int(values[names.index("ActiveOpens")])


def test_an_address_of_another_users_namespace_is_not_local(net: Net) -> None:
    port, _ = net.listeners["c"]
    said = find_in_a(net, f"{OUTSIDE}:{port}")
    assert said.startswith(f"refused --target {OUTSIDE}:{port}: {OUTSIDE} is not on this host (its route goes out "
                           "through veth37a via a gateway, not this namespace's loopback; the network namespace "
                           "net:["), said
    assert said.endswith("holds it); give --allow-remote to rehearse a balancer elsewhere on purpose"), said


def test_rehearse_refuses_it_in_one_line_before_any_connection(net: Net) -> None:
    port, _ = net.listeners["c"]
    _, in_a = net.listeners["a"]
    before = tcp_opens(in_a)
    run = subprocess.run(["ip", "netns", "exec", net.a, FDTRACE, "rehearse", "--target", f"{OUTSIDE}:{port}",
                          "--ranks", "1", "--connections-per-rank", "2"], capture_output=True, text=True, timeout=60)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1 and lines[0].startswith("fdtrace: error: "), run.stderr
    assert "give --allow-remote" in lines[0]
    assert tcp_opens(in_a) == before  # no connection was tried from A


def test_its_own_loopback_is_local(net: Net) -> None:
    port, pid = net.listeners["a"]
    said = find_in_a(net, f"127.0.0.1:{port}").split()
    assert said[0] == "local" and said[2:] == [str(pid)]
    assert said[1] == os.readlink(f"/proc/{pid}/ns/net")


def test_a_namespace_root_named_reached_directly_is_local(net: Net) -> None:
    port, pid = net.listeners["b"]
    said = find_in_a(net, f"10.237.0.2:{port}").split()
    assert said == ["local", os.readlink(f"/proc/{pid}/ns/net"), str(pid)]
