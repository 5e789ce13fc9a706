"""Shared slots given by priority (issue 37, G and I): another user's programs cannot take every
Go uprobe or every HAProxy stats-socket slot. Before, 300 execs of a 16 KB C program with a fake
`.go.buildinfo` took all 256 Go slots (root's Go program then died of its thread limit unseen,
and nothing said slots ran out), and 20 fake haproxys answering on their own sockets held all 16
stats-socket slots (root's haproxy got no sample). Now root's and the system services' programs
come first, every other user has a cap, and what was refused is counted and said."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fdtrace.analysis import load
from fdtrace.kernel.loader import GO_USER_SLOTS
from tests.helpers import FDTRACE, build_go, started

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(os.geteuid() != 0 or shutil.which("gcc") is None,
                                                  reason="attaches BPF programs, plants processes as nobody")]

NOBODY_UID = 65534
#: The trial's fake Go programs: copies of one C program (distinct files) carrying Go 1.22's build
#: info and a function named runtime.gwrite, each a uprobe where it is watched.
FAKE_GO_COPIES = 300
FAKE_GO = r"""
#include <unistd.h>
__attribute__((section(".go.buildinfo"), used)) static const unsigned char buildinfo[64] = {
    0xff, ' ', 'G', 'o', ' ', 'b', 'u', 'i', 'l', 'd', 'i', 'n', 'f', ':', 8, 2,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    8, 'g', 'o', '1', '.', '2', '2', '.', '0'};
void gwrite(void) __asm__("runtime.gwrite");
__attribute__((noinline, used)) void gwrite(void) {}
int main(void) { char b; return read(0, &b, 1) < 0; }
"""
#: nobody's launcher: every fake program started, kept alive on a pipe until told.
LAUNCHER = """
import subprocess, sys
held = [subprocess.Popen([path], stdin=subprocess.PIPE) for path in sys.argv[1:]]
print("ready", flush=True)
sys.stdin.readline()
for p in held:
    p.kill()
    p.wait()
"""


@pytest.fixture(scope="module")
def planted() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="fdtrace-hostile-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


#: Root's Go program: once a byte comes on stdin (its uprobe is attached), goroutines pin threads in
#: blocking reads until the runtime's limit kills it, within a second.
ROOTS_GO = """package main

import (
	"os"
	"runtime/debug"
	"syscall"
	"time"
)

func main() {
	debug.SetMaxThreads(LIMIT)
	os.Stdin.Read(make([]byte, 1))
	for i := 0; i < 2*LIMIT; i++ {
		var fds [2]int
		if err := syscall.Pipe(fds[:]); err != nil {
			panic(err)
		}
		go func(fd int) { buf := make([]byte, 1); syscall.Read(fd, buf) }(fds[0])
	}
	time.Sleep(30 * time.Second)
}
"""


def perf_events(pid: int) -> int:
    """The perf events a process holds (each tracepoint and uprobe the recorder attached is one)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]"
        except OSError:
            continue
    return count


def wait_for(what: str, test: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_another_users_fake_go_programs_leave_roots_go_program_watched(planted: Path) -> None:
    source = planted / "fake_go.c"
    source.write_text(FAKE_GO)
    fake = planted / "fake_go"
    subprocess.run(["gcc", "-O1", "-o", str(fake), str(source)], check=True, capture_output=True, timeout=120)
    copies = []
    for index in range(FAKE_GO_COPIES):
        copy = planted / f"fake_go_{index}"
        shutil.copy(fake, copy)
        copies.append(str(copy))
    limit = 150
    roots = build_go(ROOTS_GO.replace("LIMIT", str(limit)), Path(tempfile.mkdtemp(prefix="fdtrace-go-")), "roots_go")
    out = planted / "rec"
    # rounds 60 s apart: only the execs bring uprobes (no round of samples between)
    recorder = started([FDTRACE, "record", "-o", str(out), "--interval", "60"], "recording to")
    launcher = subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER, *copies], user="nobody", group="nogroup",
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        base = perf_events(recorder.pid)
        assert launcher.stdout is not None and launcher.stdin is not None
        assert launcher.stdout.readline().strip() == "ready"
        wait_for("nobody's programs watched", lambda: perf_events(recorder.pid) >= base + GO_USER_SLOTS)
        program = subprocess.Popen([str(roots)], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_for("root's program watched", lambda: perf_events(recorder.pid) >= base + GO_USER_SLOTS + 1)
        assert perf_events(recorder.pid) == base + GO_USER_SLOTS + 1  # nobody's 300 took 32 slots, no more
        _, stderr = program.communicate(b"x", timeout=60)
        assert program.returncode == 2 and f"program exceeds {limit}-thread limit".encode() in stderr
    finally:
        recorder.send_signal(signal.SIGINT)
        _, said = recorder.communicate(timeout=60)
        if launcher.stdin is not None:
            launcher.stdin.close()
        launcher.wait(timeout=60)
    rec = load(out)
    pids = rec.events[(rec.events["comm"] == "roots_go") & (rec.events["kind"] == "process_exec")]["pid"]
    assert len(pids) == 1
    mine = rec.events[rec.events["pid"] == pids.iloc[0]]
    assert mine[mine["kind"] == "go_thread_limit"]["ret"].tolist() == [limit], said  # root's program seen at its limit
    refused = FAKE_GO_COPIES - GO_USER_SLOTS
    # one of the shortfalls the last line lists (others, of the host's own processes, may come before it)
    shortfalls = said.split("left unread: ", 1)[1].split("; ")
    assert (f"{refused} Go binaries not watched for its thread-limit message: no uprobe slot left for "
            f"its user (uid {NOBODY_UID} {refused}") in shortfalls, said
    taken = re.search(r"(\d+) of 256 slots taken", said)  # nobody's 32, root's one, any of the host's own
    assert taken is not None and int(taken.group(1)) >= GO_USER_SLOTS + 1, said


#: The trial's fake haproxys: each (a script, so its name is haproxy) names a stats socket of its
#: own in its configuration, answers `show info` there, and opens a socket every 0.2 s (events: it
#: is sampled each round, its configuration read).
FAKE_HAPROXYS = 20
FAKE_HAPROXY = """#!/usr/bin/python3 -S
import os, socket, sys, threading, time
path = open(sys.argv[2]).read().split("stats socket ", 1)[1].split()[0]
server = socket.socket(socket.AF_UNIX)
server.bind(path)
server.listen(8)
def serve():
    while True:
        conn, _ = server.accept()
        conn.recv(100)
        conn.sendall(f"Name: HAProxy\\nPid: {os.getpid()}\\nCurrConns: 7\\nMaxconn: 100\\nMaxsock: 223\\n".encode())
        conn.close()
threading.Thread(target=serve, daemon=True).start()
print("ready", flush=True)
while True:
    socket.socket().close()
    time.sleep(0.2)
"""


def recorded_haproxy(out: Path) -> list[dict[str, object]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, object]] = []
    for part in out.glob("haproxy/host=*/part-*.parquet"):
        try:
            rows += pq.read_table(part, columns=["socket", "error", "source", "curr_conns"]).to_pylist()
        except OSError:  # renamed into place while listed
            continue
    return rows


def test_another_users_fake_haproxys_leave_roots_haproxy_sampled(planted: Path) -> None:
    from fdtrace.integrations.haproxy import FOUND_PER_USER, MAX_SOCKETS

    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is not installed")
    script = planted / "haproxy"
    script.write_text(FAKE_HAPROXY)
    script.chmod(0o755)
    sockets = planted / "sockets"
    sockets.mkdir()
    os.chown(sockets, NOBODY_UID, -1)
    fakes = []
    for index in range(FAKE_HAPROXYS):
        config = planted / f"fake{index}.cfg"
        config.write_text(f"global\n    stats socket {sockets}/s{index}.sock\n")
        fakes.append(subprocess.Popen([str(script), "-f", str(config)], user="nobody", group="nogroup",
                                      stdout=subprocess.PIPE, text=True))
    root = Path(tempfile.mkdtemp(prefix="fdtrace-root-"))
    stats = root / "stats.sock"
    config = root / "haproxy.cfg"
    config.write_text(f"global\n    maxconn 100\n    stats socket {stats} mode 600\n"
                      "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 10s\n"
                      "    timeout server 10s\n")
    out = planted / "haproxy-rec"
    recorder = started([FDTRACE, "record", "-o", str(out), "--interval", "0.5"], "recording to")
    haproxy = None
    try:
        for fake in fakes:
            assert fake.stdout is not None and fake.stdout.readline().strip() == "ready"
        wait_for("nobody's sockets sampled", lambda: len({r["socket"] for r in recorded_haproxy(out)
                                                          if r["source"] == "found"}) >= FOUND_PER_USER)
        haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)
        wait_for("root's haproxy started", stats.exists, 30)
        # root asks it once itself: an accept4 of haproxy's, so a round samples it with its socket made
        # (a round that sampled it as it started may have read its configuration before the socket was)
        with socket.socket(socket.AF_UNIX) as ask:
            ask.connect(str(stats))
            ask.sendall(b"show info\n")
            assert b"Pid:" in ask.recv(65536)
        wait_for("root's haproxy sampled", lambda: any(r["socket"] == str(stats) and r["error"] is None
                                                       and r["source"] == "found" for r in recorded_haproxy(out)))
    finally:
        recorder.send_signal(signal.SIGINT)
        _, said = recorder.communicate(timeout=60)
        for process in [*fakes, *([haproxy] if haproxy is not None else [])]:
            process.kill()
            process.wait()
        shutil.rmtree(root, ignore_errors=True)
    found = {r["socket"] for r in recorded_haproxy(out) if r["source"] == "found"}
    assert str(stats) in found
    assert len({f for f in found if f.startswith(f"{sockets}/")}) == FOUND_PER_USER  # nobody's: 4 of its 20
    refused = FAKE_HAPROXYS - FOUND_PER_USER
    shortfalls = said.split("left unread: ", 1)[1].split("; ")  # the host's own may come first
    assert (f"{refused} HAProxy stats sockets of configurations not sampled: no slot left for its user "
            f"(uid {NOBODY_UID} {refused}") in shortfalls, said
    assert f"{MAX_SOCKETS} slots, {FOUND_PER_USER} at most per user" in said, said
