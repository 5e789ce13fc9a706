"""`fdtrace rehearse` against Debian's haproxy 2.6 in front of an echo backend, all on loopback:
one set-up (an echo backend, haproxy under a 256-descriptor limit and haproxy under 4096, both
with maxconn 4096) shared by the module's tests."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fdtrace.errors import FdtraceError
from tests.helpers import FDTRACE

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed"),
              pytest.mark.skipif(os.geteuid() != 0, reason="tracing needs root")]

#: An echo server: every connection gets back what it sends; "ready" once it listens.
ECHO = """
import selectors, socket, sys
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(4096)
listener.setblocking(False)
selector = selectors.DefaultSelector()
selector.register(listener, selectors.EVENT_READ)
print(listener.getsockname()[1], flush=True)
while True:
    for key, _ in selector.select():
        if key.fileobj is listener:
            try:
                client, _ = listener.accept()
            except BlockingIOError:
                continue
            client.setblocking(False)
            selector.register(client, selectors.EVENT_READ)
            continue
        try:
            data = key.fileobj.recv(4096)
        except OSError:
            data = b""
        if data:
            key.fileobj.send(data)
        else:
            selector.unregister(key.fileobj)
            key.fileobj.close()
"""


@dataclass
class Balancer:
    """One haproxy of the set-up."""

    process: subprocess.Popen[bytes]
    port: int
    config: Path
    limit: int
    stats: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def open_fds(self) -> int:
        """Its descriptors once no stats session is open (a `show info` of the readiness check or
        of a tracer's round is closed by haproxy a moment after the client hangs up)."""
        deadline = time.monotonic() + 30
        while stats_sessions(self.stats) and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(os.listdir(f"/proc/{self.pid}/fd"))


def stats_sessions(path: Path) -> int:
    """The connected sessions of the stats socket at ``path`` (/proc/net/unix, state 03; haproxy
    binds ``PATH.PID.tmp`` and renames it, and the kernel keeps the bound name)."""
    count = 0
    with open("/proc/net/unix") as table:
        next(table)
        for line in table:
            fields = line.split()
            count += len(fields) == 8 and fields[5] == "03" and fields[7].startswith(str(path))
    return count


@dataclass
class Setup:
    small: Balancer  # under prlimit --nofile=256:256
    large: Balancer  # under prlimit --nofile=4096:4096
    capped: Balancer  # maxconn 50 under 4096
    backend: int  # the echo server's port


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answers(socket_path: Path) -> bool:
    """Whether haproxy's stats socket answers `show info` (haproxy is serving)."""
    from fdtrace.integrations.haproxy import show_info

    try:
        return "Maxconn" in show_info(str(socket_path))
    except OSError:
        return False


def haproxy(folder: Path, name: str, limit: int, backend: int, maxconn: int = 4096) -> Balancer:
    port, stats = free_port(), folder / f"{name}.sock"
    config = folder / f"{name}.cfg"
    config.write_text(
        f"global\n    maxconn {maxconn}\n    ulimit-n {limit}\n    no strict-limits\n"
        f"    stats socket {stats} mode 600\n"
        "defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 60s\n    timeout server 60s\n"
        f"frontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n"
        f"backend be\n    server echo 127.0.0.1:{backend}\n")
    process = subprocess.Popen(["prlimit", f"--nofile={limit}:{limit}", "haproxy", "-db", "-f", str(config)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not answers(stats):
        assert process.poll() is None, f"haproxy {name} exited with {process.returncode}"
        assert time.monotonic() < deadline, f"haproxy {name} did not start"
        time.sleep(0.05)
    return Balancer(process, port, config, limit, stats)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    folder = tmp_path_factory.mktemp("rehearse")
    echo = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
    assert echo.stdout is not None
    backend = int(echo.stdout.readline())
    started: list[Balancer] = []
    try:
        started.append(haproxy(folder, "small", 256, backend))
        started.append(haproxy(folder, "large", 4096, backend))
        started.append(haproxy(folder, "capped", 4096, backend, maxconn=50))
        yield Setup(*started, backend)
    finally:
        for balancer in started:
            balancer.process.terminate()
            balancer.process.wait(timeout=10)
        echo.terminate()
        echo.wait(timeout=10)


def rehearse(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FDTRACE, "rehearse", *args], capture_output=True, text=True, timeout=timeout)


def haproxy_threads(pid: int) -> int:
    """The threads haproxy runs without nbthread: one per CPU it may run on."""
    return len(os.sched_getaffinity(pid))


def maxsock(maxconn: int, threads: int) -> int:
    """HAProxy 2.6's Maxsock for this set-up's configuration, term by term: 10 reserved, a bind and
    a stats socket, the stats CLI's 10, 2 per connection, 3 per thread."""
    return 10 + 2 + 10 + 2 * maxconn + 3 * threads


def starts_under_strict_limits(folder: Path, maxconn: int, limit: int, backend: int) -> dict[str, str]:
    """haproxy 2.6 with ``maxconn`` and ``ulimit-n limit`` under ``strict-limits``, started under a
    hard limit of ``limit``: its `show info` once it serves, or {} when it refused to start."""
    from fdtrace.integrations.haproxy import show_info

    stats = folder / f"strict-{maxconn}-{limit}.sock"
    config = folder / f"strict-{maxconn}-{limit}.cfg"
    config.write_text(
        f"global\n    maxconn {maxconn}\n    ulimit-n {limit}\n    strict-limits\n    stats socket {stats} mode 600\n"
        "defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 60s\n    timeout server 60s\n"
        f"frontend fe\n    bind 127.0.0.1:{free_port()}\n    default_backend be\n"
        f"backend be\n    server echo 127.0.0.1:{backend}\n")
    process = subprocess.Popen(["prlimit", f"--nofile={limit}:{limit}", "haproxy", "-db", "-f", str(config)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not answers(stats):
            if process.poll() is not None:
                assert process.stderr is not None
                said = process.stderr.read()
                assert b"Cannot raise FD limit" in said or b"too low for maxconn" in said, said
                return {}
            assert time.monotonic() < deadline, "haproxy did not start"
            time.sleep(0.05)
        return show_info(str(stats))
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_haproxy_under_256_descriptors_fails_where_its_table_is_full(setup: Setup, tmp_path: Path) -> None:
    small = setup.small
    idle = small.open_fds()  # the listener, the stats socket, epoll, logs... (13 with this config)
    out = tmp_path / "rec"
    run = rehearse("--target", f"127.0.0.1:{small.port}", "--ranks", "8", "--connections-per-rank", "100",
                   "--ramp", "10", "--hold", "0.2", "--project-ranks", "64", "--json", "-o", str(out))
    assert run.returncode == 2, run.stderr
    assert "probes attached" in run.stderr and "Traceback" not in run.stderr
    result = json.loads(run.stdout)
    assert (result["pid"], result["comm"], result["status"]) == (small.pid, "haproxy", "failed")
    assert result["idle_fds"] == idle and (result["fd_soft_limit"], result["fd_hard_limit"]) == (256, 256)
    # Each proxied connection takes 2 descriptors (the client's and the backend's): the table of
    # 256 is full after (256 - idle) / 2 of them.
    assert abs(result["failed_at"] - (256 - idle) / 2) <= 2, result["failed_at"]
    assert result["held"] == result["failed_at"] - 1
    assert abs(result["fds_per_connection"] - 2) <= 0.1
    failure = result["failure"]
    assert failure["errno"] == "EMFILE" and failure["syscall"] in ("accept4", "socket"), failure
    assert set(failure["calls"]) <= {"accept4 EMFILE", "socket EMFILE"} and failure["calls"]
    assert failure["judged_by"] is None  # descriptors ran out: not its connection limit
    # The ramp stopped at the first step that failed: 80 held, then 160 asked.
    steps = result["bursts"]
    assert [b["connections"] for b in steps] == [80, 160]
    assert steps[0]["answered"] == 80 and not steps[0]["failures"] and not steps[0]["target_failures"]
    assert steps[1]["answered"] == result["held"] and sum(steps[1]["failures"].values()) == 160 - result["held"]
    assert steps[0]["target_fds_held"] == idle + 2 * 80
    needed = result["needed_fds"]
    assert needed >= 1600 and needed == idle + math.ceil(result["fds_per_connection"] * 800 - 1e-9)
    projected = result["projected"]["needed_fds"]
    assert projected == idle + math.ceil(result["fds_per_connection"] * 6400 - 1e-9)
    # The advice for 64 ranks x 100 connections: maxconn 7680 (6400 with the margin) and the FD
    # limit HAProxy demands for it (its Maxsock) with the margin, set where haproxy sets it.
    threads = haproxy_threads(small.pid)
    demanded = maxsock(7680, threads)
    limit = math.ceil(max(demanded, projected) * 1.2)
    advice = {c["name"]: c for c in result["advice"]}
    soft = advice["RLIMIT_NOFILE soft"]
    assert soft["status"] == "FAIL" and soft["recommended"] == f">= {limit}", soft
    assert f"set ulimit-n {limit} in the global section of {small.config}" in soft["change"]
    assert f"HAProxy's Maxsock {demanded} for maxconn 7680" in soft["change"]
    assert f"6400 connections at 2.00 descriptors each and {idle} held idle" in soft["change"]
    pair = advice["haproxy maxconn vs the rehearsed shape"]
    assert (pair["status"], pair["recommended"]) == ("FAIL", "maxconn >= 7680")  # 4096 hold fewer than 6400
    assert f"set maxconn 7680 in the global section of {small.config}, and ulimit-n {limit} with it" in pair["change"]
    # The pair starts haproxy 2.6 under strict-limits and that hard limit; what rehearse used to
    # advise (the measured need with the margin, 15376 here) is refused by it.
    info = starts_under_strict_limits(tmp_path, 7680, limit, setup.backend)
    assert (info["Maxconn"], info["Maxsock"], info["Ulimit-n"]) == ("7680", str(demanded), str(limit)), info
    old = math.ceil(projected * 1.2)
    assert old < demanded and starts_under_strict_limits(tmp_path, 7680, old, setup.backend) == {}
    # The recording saw the same failures as the exact counters, and the table full.
    from fdtrace.analysis import load

    recording = load(out)
    events = recording.events
    emfile = events[(events["pid"] == small.pid) & (events["errno"] == "EMFILE")]
    by_call = emfile["syscall"].astype(str).value_counts().to_dict()
    assert {f"{call} EMFILE": n for call, n in by_call.items()} == failure["calls"]
    samples = recording.samples[recording.samples["pid"] == small.pid]
    assert set(samples["fd_soft_limit"]) == {256} and samples["open_fds"].min() == idle
    # each burst asks the tracer for a round while its connections are held: the recording has
    # the first step's peak exactly, and the failing step's table full
    assert (samples["open_fds"] == idle + 2 * 80).any(), sorted(samples["open_fds"])
    assert samples["open_fds"].max() >= 2 * result["held"] + idle - 1
    # haproxy gave its descriptors back once the connections closed.
    assert small.open_fds() == idle


def test_haproxy_under_4096_holds_the_shape(setup: Setup) -> None:
    large = setup.large
    idle = large.open_fds()
    run = rehearse("--target", f"127.0.0.1:{large.port}", "--comm", "haproxy", "--processes", "--ranks", "8",
                   "--connections-per-rank", "100", "--ramp", "10", "--hold", "0.2", "--project-ranks", "64", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    # --comm haproxy: of the two of that name, the one that listens there
    assert (result["pid"], result["status"], result["held"], result["failed_at"]) == (large.pid, "held", 800, None)
    assert result["failure"] is None and result["failed_calls"] == {}
    steps = result["bursts"]
    assert [b["connections"] for b in steps] == [80 * step for step in range(1, 11)]
    assert all(b["answered"] == b["connections"] and not b["failures"] for b in steps)
    assert [b["target_fds_held"] for b in steps] == [idle + 2 * b["connections"] for b in steps]
    assert result["fds_per_connection"] == 2.0
    assert result["needed_fds"] == idle + 1600
    assert result["projected"] == {"ranks": 64, "connections": 6400, "needed_fds": idle + 12800}
    # The recommendation is for the projected ranks: maxconn 7680 and the FD limit HAProxy
    # demands for it (more than the 12800 + idle measured), with the margin.
    advice = {c["name"]: c for c in result["advice"]}
    recommended = math.ceil(maxsock(7680, haproxy_threads(large.pid)) * 1.2)
    assert advice["RLIMIT_NOFILE soft"]["status"] == "FAIL"
    assert advice["RLIMIT_NOFILE soft"]["recommended"] == f">= {recommended}"
    assert advice["haproxy maxconn vs the rehearsed shape"]["recommended"] == "maxconn >= 7680"


def test_a_maxconn_that_holds_fewer_judges_the_failure(setup: Setup) -> None:
    """haproxy at its maxconn takes no more connections (the kernel queues them, unanswered): no
    descriptor ran out, and the failure is judged by its maxconn, named with the FD limit HAProxy
    demands for the maxconn advised."""
    capped = setup.capped
    run = rehearse("--target", f"127.0.0.1:{capped.port}", "--ranks", "4", "--connections-per-rank", "25",
                   "--ramp", "4", "--hold", "0.2", "--timeout", "1", "--json")
    assert run.returncode == 2, run.stderr
    result = json.loads(run.stdout)
    assert (result["pid"], result["held"], result["failed_at"]) == (capped.pid, 50, 51), result["bursts"]
    failure = result["failure"]
    assert failure["errno"] is None and result["failed_calls"] == {}
    assert failure["judged_by"] == ("no descriptor ran out: its own connection limit did (maxconn 50 for 100 "
                                    "connections at once)")
    advice = {c["name"]: c for c in result["advice"]}
    pair = advice["haproxy maxconn vs the rehearsed shape"]
    assert (pair["status"], pair["recommended"]) == ("FAIL", "maxconn >= 120")
    # 4096 descriptors already hold what HAProxy demands for maxconn 120: no FD change
    demanded = maxsock(120, haproxy_threads(capped.pid))
    assert pair["change"] == (f"set maxconn 120 in the global section of {capped.config}, within its FD limit 4096 "
                              f"(HAProxy demands {demanded} for it)")
    assert advice["RLIMIT_NOFILE soft"]["recommended"] == ""


def one_line_error(run: subprocess.CompletedProcess[str], says: str) -> None:
    assert run.returncode == 1, (run.returncode, run.stdout, run.stderr)
    assert run.stdout == "" and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and run.stderr.startswith("fdtrace: error: ")
    assert says in run.stderr, run.stderr


@pytest.fixture
def loopback_namespace() -> Iterator[list[str]]:
    """A network namespace with only a loopback (nothing sent there leaves the machine)."""
    name = f"fdtrh{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield ["ip", "netns", "exec", name]
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def test_bad_targets_are_one_line(setup: Setup, loopback_namespace: list[str]) -> None:
    shape = ["--ranks", "2", "--connections-per-rank", "5"]
    with socket.socket() as bound:  # a port that is taken but not listening: nothing answers there
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        one_line_error(rehearse("--target", f"127.0.0.1:{port}", *shape), f"nothing listens on 127.0.0.1 port {port}")
    in_namespace = [*loopback_namespace, FDTRACE, "rehearse"]
    unresolved = subprocess.run([*in_namespace, "--target", "no-such-host.invalid:80", *shape],
                                capture_output=True, text=True, timeout=60)
    one_line_error(unresolved, "no-such-host.invalid does not resolve")
    one_line_error(rehearse("--target", "198.51.100.7:80", *shape),
                   "198.51.100.7 is not on this host (")
    unreachable = subprocess.run([*in_namespace, "--target", "198.51.100.7:80", "--allow-remote", *shape],
                                 capture_output=True, text=True, timeout=60)
    one_line_error(unreachable, "--target 198.51.100.7:80: Network is unreachable")
    one_line_error(rehearse("--target", "localhost", *shape), "give HOST:PORT")
    one_line_error(rehearse("--target", f"127.0.0.1:{setup.small.port}", "--comm", "no-such-name", *shape),
                   "--comm no-such-name: no process of that name")
    one_line_error(rehearse("--target", f"127.0.0.1:{setup.small.port}", "--comm", "haproxy", "--pid", "1", *shape),
                   "give --comm or --pid, not both")
    one_line_error(rehearse("--target", f"127.0.0.1:{setup.small.port}", "--ranks", "8", "--connections-per-rank",
                            "100", "--max-connections", "500"), "more than --max-connections 500")


def test_its_own_descriptors_first(setup: Setup) -> None:
    """A hard limit the shape cannot fit in (root here cannot raise it) is one line that says
    what would fit, before anything is compiled."""
    target = ["--target", f"127.0.0.1:{setup.large.port}", "--ranks", "8", "--connections-per-rank", "100"]
    low = subprocess.run(["prlimit", "--nofile=400:400", FDTRACE, "rehearse", *target], capture_output=True,
                         text=True, timeout=60)
    one_line_error(low, "the shape needs 1152 descriptors in fdtrace (800 connections, 8 ranks, and tracing) but its "
                        "hard RLIMIT_NOFILE is 400 and cannot be raised")
    assert "run it under prlimit --nofile=1152:1152, or give --processes" in low.stderr
    lower = subprocess.run(["prlimit", "--nofile=300:300", FDTRACE, "rehearse", *target], capture_output=True,
                           text=True, timeout=60)
    one_line_error(lower, "run it under prlimit --nofile=1152:1152")
    assert "--processes" not in lower.stderr  # 352 per process would not fit either


def test_a_target_another_network_namespace_holds_is_not_local(loopback_namespace: list[str]) -> None:
    """An address that another network namespace holds, while this namespace routes it out of
    the machine, is not on this host (issue 37, F: any user can make a namespace holding any
    address): it needs --allow-remote. (tests/hostile/test_remote_gate.py has the namespaces
    that are local.)"""
    from fdtrace.rehearsal.target import find_target

    address = "10.254.71.2"
    subprocess.run([*loopback_namespace, "ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    code = (f"import socket; s = socket.socket(); s.bind(({address!r}, 0)); s.listen(8); "
            "print(s.getsockname()[1], flush=True); input()")
    listener = subprocess.Popen([*loopback_namespace, sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.readline())
        with pytest.raises(FdtraceError, match=f"{address} is not on this host .*; give --allow-remote"):
            find_target(f"{address}:{port}")
    finally:
        listener.kill()
        listener.wait()


def test_no_route_to_the_target_is_not_the_targets_failure(loopback_namespace: list[str]) -> None:
    """Connections this host cannot route anywhere stop the rehearsal with one line (exit
    status 1), not as a failure of the target (2). In a namespace with only a loopback, so
    nothing leaves the machine."""
    code = ("import socket\n"
            "from fdtrace.rehearsal.runner import Rehearsal, start_ranks, stop_ranks\n"
            "from fdtrace.rehearsal.shape import Shape\n"
            "from fdtrace.rehearsal.target import Target\n"
            "target = Target('198.51.100.7:80', '198.51.100.7', '198.51.100.7', 80, socket.AF_INET, None)\n"
            "shape = Shape(2, 3, hold_s=0)\n"
            "ranks = start_ranks(shape, target)\n"
            "rehearsal = Rehearsal(shape, ranks, None, None, max_rate=100, duration_s=30)\n"
            "rehearsal.run()\n"
            "stop_ranks(ranks)\n"
            "print(rehearsal.error.exit_code, rehearsal.error, rehearsal.bursts)\n")
    run = subprocess.run([*loopback_namespace, sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == ("1 this host has no route to the target (6 connections ENETUNREACH): the rehearsal "
                                  "stopped at step 1 (6 connections) []"), run.stderr
