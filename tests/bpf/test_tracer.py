"""Real probes on real tracepoints: exact counts of what a child process did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import LiveTracer, python_child
from tests.helpers import eventually, memory_cgroup

pytestmark = pytest.mark.bpf
CHILD_COMM = os.path.basename(sys.executable)[:15]

SOCKETS_THEN_CLOSES = """
import socket
socks = [socket.socket() for _ in range({n})]
for s in socks:
    s.close()
"""


def test_sockets_and_their_closes_are_counted_exactly(live_tracer: LiveTracer) -> None:
    run = live_tracer.run(python_child(SOCKETS_THEN_CLOSES.format(n=37)))
    sockets = run.of_kind("socket", errno="")
    assert len(sockets) == 37
    fds = {e["fd"] for e in sockets}
    assert len(fds) == 37 and all(e["ret"] == e["fd"] for e in sockets)
    first_socket = min(e["ts_ns"] for e in sockets)
    closes = [e for e in run.of_kind("close") if e["ts_ns"] > first_socket and e["fd"] in fds]
    assert len(closes) == 37 and all(e["ret"] == 0 and e["errno"] == "" for e in closes)
    assert run.total.counts["sockets"] == 37
    assert run.total.counts["socket_errors"] == 0
    assert run.total.counts["closes"] >= 37
    assert all(e["syscall"] == "socket" and e["comm"] == CHILD_COMM for e in sockets)


ACCEPT_CONNECT = """
import socket
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(64)
port = listener.getsockname()[1]
spare = socket.socket()
spare.bind(("127.0.0.1", 0))
refused_port = spare.getsockname()[1]
spare.close()
clients = []
for _ in range({k}):
    c = socket.socket()
    c.connect(("127.0.0.1", port))
    clients.append(c)
for _ in range({refused}):
    c = socket.socket()
    try:
        c.connect(("127.0.0.1", refused_port))
    except ConnectionRefusedError:
        pass
    c.close()
accepted = [listener.accept()[0] for _ in range({m})]
print(port, refused_port, *(c.getsockname()[1] for c in clients))
"""


def test_loopback_accepts_and_connects_are_counted_exactly(live_tracer: LiveTracer) -> None:
    run = live_tracer.run(python_child(ACCEPT_CONNECT.format(k=6, m=6, refused=3)))
    assert run.returncode == 0
    accepts = run.of_kind("accept")
    assert len(accepts) == 6
    assert {e["syscall"] for e in accepts} == {"accept4"}
    assert all(e["fd"] >= 0 and e["errno"] == "" for e in accepts)
    connects = run.of_kind("connect")
    assert len(connects) == 9
    assert len([e for e in connects if e["errno"] == ""]) == 6
    refused = [e for e in connects if e["errno"] == "ECONNREFUSED"]
    assert len(refused) == 3 and all(e["ret"] == -111 for e in refused)
    socket_fds = {e["fd"] for e in run.of_kind("socket")}
    assert all(e["fd"] in socket_fds for e in connects)
    counts = run.total.counts
    assert counts["accepts"] == 6 and counts["accept_errors"] == 0
    assert counts["connects"] == 9 and counts["connect_errors"] == 3
    assert counts["sockets"] == 2 + 6 + 3
    assert run.total.errors == {("connect", "ECONNREFUSED"): 3}
    port, refused_port, *client_ports = map(int, run.stdout.split())
    # each accepted connection carries its client: the address and port the clients bound
    assert sorted((e["family"], e["peer_addr"], e["peer_port"]) for e in accepts) == sorted(
        ("AF_INET", "127.0.0.1", p) for p in client_ports)
    ok = [e for e in connects if e["errno"] == ""]
    assert {(e["family"], e["peer_addr"], e["peer_port"]) for e in ok} == {("AF_INET", "127.0.0.1", port)}
    assert {(e["family"], e["peer_addr"], e["peer_port"]) for e in refused} == {
        ("AF_INET", "127.0.0.1", refused_port)}


PEERS = """
import os, socket, tempfile
v6 = socket.socket(socket.AF_INET6)
v6.bind(("::1", 0))
v6.listen(1)
client6 = socket.socket(socket.AF_INET6)
client6.connect(("::1", v6.getsockname()[1]))
path = os.path.join(tempfile.mkdtemp(), "s")
unix = socket.socket(socket.AF_UNIX)
unix.bind(path)
unix.listen(1)
client_unix = socket.socket(socket.AF_UNIX)
client_unix.connect(path)
abstract = socket.socket(socket.AF_UNIX)
abstract.bind(b"\\0fdtrace-test-%d" % os.getpid())
abstract.listen(1)
client_abstract = socket.socket(socket.AF_UNIX)
client_abstract.connect(b"\\0fdtrace-test-%d" % os.getpid())
print(v6.getsockname()[1])
"""


def test_connect_destinations_ipv6_and_unix(live_tracer: LiveTracer) -> None:
    run = live_tracer.run(python_child(PEERS))
    assert run.returncode == 0
    port = int(run.stdout)
    seen = sorted((e["family"], e["peer_addr"], e["peer_port"]) for e in run.of_kind("connect"))
    # a Unix destination has a path, not an address; the abstract one's sockaddr is 3+ bytes short
    assert seen == [("AF_INET6", "::1", port), ("AF_UNIX", None, None), ("AF_UNIX", None, None)]


EMFILE_WORK = """
import os, socket
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(8)
client = socket.socket()
client.connect(listener.getsockname())
opened = 0
while True:
    try:
        os.open("/dev/null", os.O_RDONLY)
        opened += 1
    except OSError:
        break
failures = {"openat": 1}
for _ in range(2):
    try: os.open("/dev/null", os.O_RDONLY)
    except OSError: failures["openat"] += 1
for _ in range(3):
    try: socket.socket()
    except OSError: failures["socket"] = failures.get("socket", 0) + 1
for _ in range(4):
    try: os.pipe()
    except OSError: failures["pipe2"] = failures.get("pipe2", 0) + 1
for _ in range(5):
    try: listener.accept()
    except OSError: failures["accept4"] = failures.get("accept4", 0) + 1
print(failures)
"""


def test_emfile_under_prlimit_is_counted_per_syscall(live_tracer: LiveTracer) -> None:
    run = live_tracer.run(["prlimit", "--nofile=64:64", *python_child(EMFILE_WORK)])
    assert run.returncode == 0
    assert run.stdout.strip() == "{'openat': 3, 'socket': 3, 'pipe2': 4, 'accept4': 5}"
    fd_errors = run.of_kind("fd_error")
    by_syscall: dict[str, int] = {}
    for e in fd_errors:
        assert e["errno"] == "EMFILE" and e["ret"] == -24
        by_syscall[e["syscall"]] = by_syscall.get(e["syscall"], 0) + 1
    assert by_syscall == {"openat": 3, "pipe2": 4}
    assert len(run.of_kind("socket", errno="EMFILE")) == 3
    assert len(run.of_kind("accept", errno="EMFILE", syscall="accept4")) == 5
    assert run.total.errors == {
        ("openat", "EMFILE"): 3, ("pipe2", "EMFILE"): 4, ("socket", "EMFILE"): 3, ("accept4", "EMFILE"): 5,
    }
    assert run.total.counts["other_fd_call_errors"] == 7
    assert run.total.counts["socket_errors"] == 3
    assert run.total.counts["accept_errors"] == 5


THREADS = """
import threading
threads = [threading.Thread(target=lambda: None) for _ in range({n})]
for t in threads: t.start()
for t in threads: t.join()
"""


def test_threads_started_and_exited_are_counted_exactly(live_tracer: LiveTracer) -> None:
    run = live_tracer.run(python_child(THREADS.format(n=7)))
    started = run.of_kind("thread_start")
    exited = run.of_kind("thread_exit")
    assert len(started) == 7 and len(exited) == 7
    # The last task of the group to exit makes the process_exit: often a thread that join()
    # already let go of, with the main thread's exit a thread_exit.
    [process_exit] = run.of_kind("process_exit")
    assert {e["tid"] for e in started} | {run.pid} == {e["tid"] for e in exited} | {process_exit["tid"]}
    assert all(e["creator_tid"] == run.pid and e["tid"] != run.pid for e in started)
    assert run.total.counts["threads_started"] == 7
    assert run.total.counts["threads_exited"] == 7


def test_process_start_exec_and_exit_code(live_tracer: LiveTracer) -> None:
    code = 'import os; os.execv("/bin/sh", ["sh", "-c", "exit 42"])'
    run = live_tracer.run(python_child(code))
    assert run.returncode == 42
    [start] = run.of_kind("process_start")
    assert start["ppid"] == os.getpid()
    execs = run.of_kind("process_exec")
    assert [e["comm"] for e in execs] == [CHILD_COMM, "sh"]
    [exit_event] = run.of_kind("process_exit")
    assert exit_event["exit_code"] == 42 and exit_event["signal"] is None
    assert exit_event["comm"] == "sh"
    assert start["start_ns"] is not None
    assert exit_event["start_ns"] == start["start_ns"]


def test_exit_group_of_threaded_process_keeps_its_code(live_tracer: LiveTracer) -> None:
    code = (
        "import os, threading, time\n"
        "for _ in range(3): threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "os._exit(5)\n"
    )
    run = live_tracer.run(python_child(code))
    [exit_event] = run.of_kind("process_exit")
    assert exit_event["exit_code"] == 5 and exit_event["signal"] is None
    assert len(run.of_kind("thread_exit")) == 3


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_process_killed_by_a_signal(live_tracer: LiveTracer, sig: signal.Signals) -> None:
    start_ns = time.monotonic_ns()
    proc = subprocess.Popen(["sleep", "30"])
    eventually(lambda: os.readlink(f"/proc/{proc.pid}/exe").endswith("/sleep"), "sleep exec'd")
    proc.send_signal(sig)
    proc.wait()
    run = live_tracer.collect(proc.pid, proc.returncode, start_ns)
    [exit_event] = run.of_kind("process_exit")
    assert exit_event["signal"] == sig.name and exit_event["exit_code"] is None


def test_oom_kill_in_a_memory_cgroup(live_tracer: LiveTracer) -> None:
    """The OOM kill of the child, with its sizes; a tracer of other processes (--pid) does not
    count it (a CI run's alert test saw another test's OOM kill fire FdtraceOomKill for --pid)."""
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.kernel.session import KernelSession

    hog = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n"
    bystander = subprocess.Popen(["sleep", "60"])
    others = KernelSession(TraceOptions(pids=(bystander.pid,)))
    others.start()  # attached when it returns
    try:
        with memory_cgroup(limit_bytes=96 << 20) as procs_file:
            argv = ["sh", "-c", f'echo $$ > {procs_file} && exec "$0" -S -c "$1"', sys.executable, hog]
            run = live_tracer.run(argv)
        # the host's tracer saw the victim's exit, after its oom_kill: the other ring has it too if it was kept
        kept = others.poll(final=True).events.to_pylist()
    finally:
        others.stop()
        bystander.kill()
        bystander.wait()
    assert [e for e in kept if e["kind"] == "oom_kill"] == []
    assert run.returncode == -signal.SIGKILL
    ooms = run.of_kind("oom_kill")
    assert len(ooms) == 1
    [oom] = ooms
    assert oom["pid"] == run.pid and oom["comm"] == CHILD_COMM
    assert 48 << 10 <= oom["anon_rss_kb"] <= 96 << 10
    assert oom["total_vm_kb"] >= oom["anon_rss_kb"]
    assert oom["oom_score_adj"] == 0
    [exit_event] = run.of_kind("process_exit")
    assert exit_event["signal"] == "SIGKILL"


def test_per_record_callback_path_gives_the_same_events() -> None:
    """The bcc callback path, used where the ring cannot be read in bulk (not x86-64)."""
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.kernel.session import KernelSession

    code = "import sys\nsys.stdin.readline()\n" + SOCKETS_THEN_CLOSES.format(n=11)
    child = subprocess.Popen(python_child(code), stdin=subprocess.PIPE, text=True)
    source = KernelSession(TraceOptions(pids=(child.pid,), bulk_read=False))
    source.start()
    try:
        assert source.tracer._ring is None
        child.communicate("go\n", timeout=30)
        events: list[dict] = []

        def exited() -> bool:  # its exit is read, and every event of it before
            events.extend(source.poll().events.to_pylist())
            return any(e["kind"] == "process_exit" and e["pid"] == child.pid for e in events)
        eventually(exited, "the child's exit read from the ring")
    finally:
        source.stop()
    sockets = [e for e in events if e["kind"] == "socket"]
    assert len(sockets) == 11
    fds = {e["fd"] for e in sockets}
    first = min(e["ts_ns"] for e in sockets)
    assert len([e for e in events if e["kind"] == "close" and e["fd"] in fds and e["ts_ns"] > first]) == 11
