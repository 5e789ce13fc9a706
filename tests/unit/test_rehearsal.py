"""`fdtrace rehearse` without the tracer: the shape's steps, the figures from bursts, the parsing
of /proc's sockets and addresses, and the ranks' connections against real loopback servers."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from fdtrace.errors import FdtraceError
from fdtrace.fits import theil_sen
from fdtrace.rehearsal.connections import CLOSED, CLOSED_IN_HOLD, REFUSED, RankConnections
from fdtrace.rehearsal.rank import ProcessRank, Rank, ThreadRank
from fdtrace.rehearsal.result import Burst, RehearsalResult, fds_per_connection, held_and_failed_at
from fdtrace.rehearsal.runner import Rehearsal, own_need, start_ranks, stop_ranks
from fdtrace.rehearsal.shape import Shape
from fdtrace.rehearsal.target import Target, listening_inodes, local_addresses, split_target
from fdtrace.rehearsal.watch import TargetFailure

# Shapes


def test_a_ramp_grows_evenly_to_the_whole_shape() -> None:
    shape = Shape(8, 100, ramp=10)
    assert shape.total == 800 and shape.levels() == [80 * step for step in range(1, 11)]
    assert Shape(3, 7, ramp=4).levels() == [6, 11, 16, 21]
    assert Shape(8, 100).levels() == [800]
    assert shape.split(80) == [10] * 8 and shape.split(13) == [2, 2, 2, 2, 2, 1, 1, 1]
    assert sum(Shape(3, 7).split(20)) == 20


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"ranks": 0, "per_rank": 5}, "--ranks and --connections-per-rank must be at least 1"),
    ({"ranks": 2, "per_rank": 5, "bursts": 0}, "--bursts and --ramp must be at least 1"),
    ({"ranks": 2, "per_rank": 5, "hold_s": -1}, "--hold must be 0 or more"),
    ({"ranks": 2, "per_rank": 5, "ramp": 11}, "--ramp 11 has more steps than the shape has connections (10)"),
])
def test_a_bad_shape_is_refused(kwargs: dict[str, int], says: str) -> None:
    with pytest.raises(FdtraceError, match=says.replace("(", r"\(").replace(")", r"\)")) as caught:
        Shape(**kwargs)
    assert caught.value.exit_code == 1


def test_own_descriptors_by_kind_of_rank() -> None:
    assert own_need(Shape(8, 100), tracing=True) == (64 + 4 * 8 + 256 + 800, 0)
    assert own_need(Shape(8, 100, processes=True), tracing=True) == (64 + 4 * 8 + 256, 100 + 32)
    assert own_need(Shape(8, 100), tracing=False) == (64 + 4 * 8 + 800, 0)


# Figures


def steps(*bursts: tuple[int, int, int, int, dict[str, int]]) -> list[Burst]:
    return [Burst(i, 1, level, answered, failures, fds_before=before, fds_held=held)
            for i, (level, answered, before, held, failures) in enumerate(bursts, 1)]


def test_the_slope_is_the_descriptors_per_connection() -> None:
    line = theil_sen([(0, 13), (80, 173), (0, 13), (121, 255)])
    assert line is not None and line.slope == pytest.approx(2.0, abs=0.01)
    assert theil_sen([(5, 1), (5, 3)]) is None
    ramp = steps((80, 80, 13, 173, {}), (160, 121, 13, 255, {"closed unanswered": 39}))
    assert fds_per_connection(ramp) == 2.0
    assert fds_per_connection(steps((80, 0, 13, 13, {"refused": 80}))) is None  # nothing held: no slope


def test_held_and_failed_at() -> None:
    ramp = steps((80, 80, 13, 173, {}), (160, 121, 13, 255, {"closed unanswered": 39}))
    held, failed_at, burst = held_and_failed_at(ramp)
    assert (held, failed_at, burst) == (121, 122, ramp[1])
    clean = steps((80, 80, 13, 173, {}), (160, 160, 13, 333, {}))
    assert held_and_failed_at(clean) == (160, None, None)
    # Only the tracer saw it fail (every connection answered): it failed at the whole step.
    quiet = steps((80, 80, 13, 173, {}), (160, 160, 13, 333, {}))
    quiet[1].target_failures = {"openat EMFILE": 1}
    assert held_and_failed_at(quiet) == (160, 160, quiet[1])


def result_of(bursts: list[Burst], **kwargs: object) -> RehearsalResult:
    target = Target("127.0.0.1:8080", "127.0.0.1", "127.0.0.1", 8080, socket.AF_INET, "net:[1]", (42,))
    return RehearsalResult(target, Shape(8, 100, ramp=10), 42, "haproxy", bursts, fd_soft_limit=256,
                           fd_hard_limit=256, **kwargs)  # type: ignore[arg-type]


def test_a_failed_rehearsal_says_where_and_how() -> None:
    ramp = steps((80, 80, 13, 173, {}), (160, 121, 13, 255, {"closed unanswered": 39}))
    ramp[1].target_failures = {"accept4 EMFILE": 3, "socket EMFILE": 36}
    ramp[1].first_target_failure = TargetFailure(5, 42, "accept", "accept4", "EMFILE")
    result = result_of(ramp, errors={("accept4", "EMFILE"): 3, ("socket", "EMFILE"): 36, ("connect", "ECONNRESET"): 1})
    assert (result.status, result.exit_code, result.held, result.failed_at) == ("failed", 2, 121, 122)
    assert result.needed_fds == 13 + 1600 and result.fds_per_connection == 2.0
    failure = result.failure
    assert failure is not None and (failure["errno"], failure["syscall"]) == ("EMFILE", "accept4")
    assert failure["calls"] == {"accept4 EMFILE": 3, "socket EMFILE": 36}
    assert failure["text"] == ("EMFILE on accept4 (3), socket (36): its descriptor table (256 soft limit) was full; "
                               "39 connections closed unanswered")
    text = result.as_text()
    assert "FAILED at 122 connections (held 121): EMFILE on accept4 (3), socket (36)" in text
    assert "needed for 800 connections (8 ranks): 1613 descriptors" in text
    assert "\n2     1      160          121       39      13 -> 255   accept4 EMFILE 3, socket EMFILE 36\n" in text
    data = result.as_dict()
    assert (data["held"], data["failed_at"], data["needed_fds"], data["projected"]) == (121, 122, 1613, None)


def test_a_held_or_stopped_rehearsal() -> None:
    clean = steps((400, 400, 13, 813, {}), (800, 800, 13, 1613, {}))
    held = result_of(clean, project_ranks=64)
    assert (held.status, held.exit_code, held.failure) == ("held", 0, None)
    assert held.as_dict()["projected"] == {"ranks": 64, "connections": 6400, "needed_fds": 12813}
    assert "HELD: 800 connections at once with no failure" in held.as_text()
    assert "needed for 6400 connections (64 ranks): 12813 descriptors" in held.as_text()
    stopped = result_of(clean[:1], stopped="stopped by SIGINT")
    assert (stopped.status, stopped.exit_code) == ("incomplete", 1)
    assert "INCOMPLETE: stopped by SIGINT (held 400 with no failure)" in stopped.as_text()


def test_names_are_shown_as_data() -> None:
    result = result_of(steps((80, 80, 13, 173, {})))
    result.comm = "ha\x1b]0;owned\x07"
    assert "\x1b" not in result.as_text() and "ha\\x1b]0;owned\\x07" in result.as_text()


# /proc's text


def test_listening_sockets_of_proc_net_tcp() -> None:
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    tcp = header + (
        "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0\n"
        "   1: 00000000:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1 0\n"
        "   2: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0\n"
        "   3: 0200007F:1F92 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 444 1 0\n")
    tcp6 = header + (
        "   0: 00000000000000000000000000000000:1F92 00000000000000000000000000000000:0000 0A 00000000:00000000 "
        "00:00000000 00000000     0        0 555 1 0\n"
        "   1: 00000000000000000000000001000000:1F93 00000000000000000000000000000000:0000 0A 00000000:00000000 "
        "00:00000000 00000000     0        0 666 1 0\n")
    assert listening_inodes(tcp, tcp6, "127.0.0.1", 8080) == {"111"}  # 333 is a connection, not a listener
    assert listening_inodes(tcp, tcp6, "127.0.0.1", 8081) == {"222"}  # 0.0.0.0
    assert listening_inodes(tcp, tcp6, "127.0.0.1", 8082) == {"555"}  # :: takes IPv4 too; 127.0.0.2 is another
    assert listening_inodes(tcp, tcp6, "::1", 8083) == {"666"}
    assert listening_inodes(tcp, tcp6, "::1", 8081) == set()  # an IPv4 wildcard is not IPv6's
    assert listening_inodes(tcp, tcp6, "127.0.0.1", 9999) == set()


def test_local_addresses_of_fib_trie() -> None:
    trie = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 192.0.2.0/24 2 0 2
        +-- 192.0.2.0/30 2 0 2
           |-- 192.0.2.0
              /24 link UNICAST
           |-- 192.0.2.2
              /32 host LOCAL
        |-- 192.0.2.255
           /32 link BROADCAST
"""
    assert local_addresses(trie) == {"192.0.2.2"}


@pytest.mark.parametrize("text", ["localhost", "host:0", "host:65536", ":80", "host:http", "[::1]"])
def test_a_target_is_host_and_port(text: str) -> None:
    with pytest.raises(FdtraceError, match="give HOST:PORT"):
        split_target(text)


def test_ipv6_targets() -> None:
    assert split_target("[::1]:8080") == ("::1", 8080) and split_target("balancer:443") == ("balancer", 443)


# Real connections on loopback


@contextmanager
def server(answer: int | None) -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback server in a thread: echoes the first ``answer`` connections (all when None)
    and closes the others once it has their bytes (unanswered, and with nothing unread: a FIN,
    not a reset); yields its port and the connections it keeps."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    kept: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            if answer is not None and len(kept) >= answer:
                threading.Thread(target=refuse, args=(client,), daemon=True).start()
                continue
            kept.append(client)
            threading.Thread(target=echo, args=(client,), daemon=True).start()

    def refuse(client: socket.socket) -> None:
        with client:
            client.recv(4096)

    def echo(client: socket.socket) -> None:
        try:
            while data := client.recv(4096):
                client.sendall(data)
        except OSError:
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], kept
    finally:
        stop.set()
        thread.join()
        for client in kept:
            client.close()
        listener.close()


def loopback_target(port: int) -> Target:
    """A target on loopback (not traced: the tests here run no tracer)."""
    return Target(f"127.0.0.1:{port}", "127.0.0.1", "127.0.0.1", port, socket.AF_INET, "net:[1]")


def now_ns() -> int:
    return time.monotonic_ns()


def test_a_rank_holds_what_is_answered_and_names_what_is_not() -> None:
    with server(answer=30) as (port, kept):
        rank = RankConnections(socket.AF_INET, ("127.0.0.1", port))
        outcome = rank.open(50, now_ns(), 10.0, b"hello\n", reply=True)
        assert outcome["answered"] == 30 and outcome["failures"] == {CLOSED: 20} and outcome["own"] is None
        assert len(rank.held) == 30
        for dropped in kept[:2]:  # the target drops two while they are held
            dropped.shutdown(socket.SHUT_RDWR)
        readable: list[socket.socket] = []
        deadline = now_ns() + 5_000_000_000
        while len(readable) < 2 and now_ns() < deadline:  # until both ends have seen it
            readable = select.select(rank.held, [], [], 0.1)[0]
        assert rank.check() == {CLOSED_IN_HOLD: 2} and len(rank.held) == 28
        assert rank.close() == 28 and rank.held == []


def test_a_rank_against_nothing_is_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        rank = RankConnections(socket.AF_INET, ("127.0.0.1", taken.getsockname()[1]))
        outcome = rank.open(5, now_ns(), 5.0, b"x", reply=True)
    assert outcome["answered"] == 0 and outcome["failures"] == {REFUSED: 5}


def test_a_rank_out_of_its_own_descriptors_says_so() -> None:
    code = ("import resource, socket, time\n"
            "from fdtrace.rehearsal.connections import RankConnections\n"
            "listener = socket.socket(); listener.bind(('127.0.0.1', 0)); listener.listen(64)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))\n"
            "rank = RankConnections(socket.AF_INET, listener.getsockname())\n"
            "print(rank.open(100, time.monotonic_ns(), 5.0, b'', reply=False)['own'])\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert run.stdout.strip() == "fdtrace's own descriptors ran out (EMFILE)", run.stderr


@pytest.mark.parametrize("processes", [False, True])
def test_ranks_as_threads_or_processes_run_the_same_bursts(processes: bool) -> None:
    with server(answer=None) as (port, _):
        target = loopback_target(port)
        shape = Shape(4, 25, ramp=2, hold_s=0.05, processes=processes)
        ranks = start_ranks(shape, target)
        try:
            kinds = {type(rank) for rank in ranks}
            assert kinds == ({ProcessRank} if processes else {ThreadRank})
            if processes:
                assert all(rank.pid not in (None, os.getpid()) for rank in ranks)
            rehearsal = Rehearsal(shape, ranks, None, None, max_rate=10_000, duration_s=60)
            rehearsal.run()
        finally:
            stop_ranks(ranks)
    assert rehearsal.error is None and rehearsal.stopped is None
    assert [(b.level, b.answered, b.failures) for b in rehearsal.bursts] == [(50, 50, {}), (100, 100, {})]


def test_a_rehearsal_stops_at_the_first_step_that_fails() -> None:
    with server(answer=60) as (port, _):
        target = loopback_target(port)
        shape = Shape(4, 25, ramp=4, hold_s=0.0)
        ranks: list[Rank] = start_ranks(shape, target)
        try:
            rehearsal = Rehearsal(shape, ranks, None, None, max_rate=10_000, duration_s=60)
            rehearsal.run()
        finally:
            stop_ranks(ranks)
    # Steps of 25, 50, 75 and 100: the server answers 60 connections in all, then closes the
    # others at once (what it answered in the first steps was closed again, but it counts all).
    assert [(b.level, b.answered) for b in rehearsal.bursts] == [(25, 25), (50, 35)]
    assert rehearsal.bursts[1].failures == {CLOSED: 15}
    result = RehearsalResult(target, shape, None, None, rehearsal.bursts)
    assert (result.held, result.failed_at, result.status, result.fds_per_connection) == (35, 36, "failed", None)


# What the tracer sees of the target


def test_the_watch_keeps_the_targets_exhaustion_and_end() -> None:
    import pyarrow as pa

    from fdtrace.pipeline import Update
    from fdtrace.rehearsal.watch import TargetWatch
    from fdtrace.schema import arrow_schema

    def event(ts: int, pid: int, kind: str, syscall: str = "", errno: str = "", **more: object) -> dict[str, object]:
        return {"ts_ns": ts, "time": ts, "host": "h", "pid": pid, "tid": pid, "comm": "haproxy", "kind": kind,
                "syscall": syscall, "errno": errno, **more}

    rows = [event(10, 42, "accept", "accept4", "EMFILE"), event(11, 42, "socket", "socket"),  # a success
            event(12, 42, "connect", "connect", "ECONNREFUSED"),  # a failed call, not exhaustion
            event(13, 7, "socket", "socket", "EMFILE"),  # another process
            event(14, 42, "fd_error", "openat", "ENFILE"), event(15, 42, "process_exit", signal="SIGKILL")]
    watch = TargetWatch((42,))
    watch.write(Update(now_ns=0, events=pa.Table.from_pylist(rows, schema=arrow_schema())))
    assert [f.label for f in watch.failures_since(0)] == ["accept4 EMFILE", "openat ENFILE", "exited (SIGKILL)"]
    assert [f.label for f in watch.failures_since(14)] == ["openat ENFILE", "exited (SIGKILL)"]
    assert watch.failed_since(15) and not watch.failed_since(16)
    assert watch.wait_past(0, 1.0)
    later = time.monotonic_ns()
    watch.close()
    assert not watch.wait_past(later, 60.0)  # closed: no update will come, it does not wait


def play(port: int, shape: Shape, max_rate: float = 10_000, duration_s: float | None = 60,
         cancel_when: tuple[list[socket.socket], int] | None = None) -> Rehearsal:
    """A rehearsal of ``shape`` against a loopback server, not traced; with ``cancel_when``
    (the server's connections, a count), cancelled once the server holds that many."""
    ranks = start_ranks(shape, loopback_target(port))
    rehearsal = Rehearsal(shape, ranks, None, None, max_rate=max_rate, duration_s=duration_s)
    try:
        worker = threading.Thread(target=rehearsal.run)
        worker.start()
        if cancel_when is not None:
            kept, count = cancel_when
            while len(kept) < count and worker.is_alive():
                time.sleep(0.01)
            rehearsal.cancel("stopped by the test")
        worker.join()
    finally:
        stop_ranks(ranks)
    return rehearsal


def test_the_rate_and_the_duration_bound_a_rehearsal() -> None:
    with server(answer=None) as (port, _):
        began = time.monotonic()
        paced = play(port, Shape(2, 25, bursts=3, hold_s=0.0), max_rate=500)
        elapsed = time.monotonic() - began
        # 50 connections a burst at 500 a second: the third burst starts 0.2 s after the first
        assert [b.answered for b in paced.bursts] == [50, 50, 50] and elapsed >= 0.2
        bounded = play(port, Shape(2, 25, bursts=3, hold_s=0.3), duration_s=0.1)
    assert [b.answered for b in bounded.bursts] == [50] and bounded.stopped == "--duration 0.1 s reached"
    assert RehearsalResult(loopback_target(port), Shape(2, 25), None, None, bounded.bursts,
                           stopped=bounded.stopped).exit_code == 1


def test_a_cancelled_rehearsal_leaves_out_the_burst_it_stopped() -> None:
    with server(answer=None) as (port, kept):
        began = time.monotonic()
        cancelled = play(port, Shape(2, 25, bursts=2, hold_s=30.0), cancel_when=(kept, 50))
        elapsed = time.monotonic() - began
    assert cancelled.stopped == "stopped by the test" and cancelled.bursts == [] and cancelled.error is None
    assert elapsed < 30  # the hold was cut short
    assert cancelled.notes == ["the burst under way when it was stopped (step 1, 50 connections) is left out"]
