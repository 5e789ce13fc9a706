"""Threads held by DNS lookups are named as such: a Go program's cgo lookups blocked in the C
library's resolver, and Python threads waiting on UDP sockets to a name server. The name server
never answers; it is a socket on the loopback of a network namespace the test makes (with its own
/etc/resolv.conf bound over the host's in a mount namespace of its own)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fdtrace.schema.site_names import DNS_LOOKUP_SITE
from tests.helpers import FDTRACE, build_go

LOOKUPS = 20
PROGRAM = """package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
)

func resolve(name string) {
	net.LookupHost(name)
}

func main() {
	n, _ := strconv.Atoi(os.Args[1])
	server, err := net.ListenPacket("udp", "127.0.0.1:53") // a name server that never answers
	if err != nil {
		panic(err)
	}
	defer server.Close()
	for i := 0; i < n; i++ {
		go resolve(fmt.Sprintf("host%d.example.invalid", i))
	}
	fmt.Println("resolving")
	buf := make([]byte, 1)
	os.Stdin.Read(buf)
}
"""
WAITERS = 5
PYTHON_PROGRAM = """import socket, sys, threading


def wait_answer(sock):
    sock.recv(512)  # waiting here


sockets = []
for _ in range({waiters}):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect(("127.0.0.1", 53))  # a UDP connect sends nothing
    sockets.append(sock)
    threading.Thread(target=wait_answer, args=(sock,), daemon=True).start()
print("waiting", flush=True)
sys.stdin.read(1)
"""


def census_until(pid: int, done: Callable[[list[dict[str, Any]]], bool]) -> dict[str, Any]:
    """`threads --pid --json` until ``done(census)`` holds (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        result = subprocess.run([FDTRACE, "threads", "--pid", str(pid), "--json"], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        if done(out["census"]) or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def test_a_go_programs_cgo_lookups_are_named_with_the_pure_go_resolver_advice(tmp_path: Path) -> None:
    binary = build_go(PROGRAM, tmp_path, "dns", cgo=True)
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:30 attempts:1\n")
    script = (f"ip link set lo up && mount --bind {resolv} /etc/resolv.conf && "
              f"GODEBUG=netdns=cgo exec {binary} {LOOKUPS}")
    program = subprocess.Popen(["unshare", "--net", "--mount", "sh", "-c", script], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert program.stdout is not None and program.stdout.readline().strip() == "resolving"
        pid = program.pid  # sh exec'd the program

        def in_dns(census: list[dict[str, Any]]) -> bool:
            return sum(s["threads"] for s in census if s["site"] == DNS_LOOKUP_SITE) >= LOOKUPS

        out = census_until(pid, in_dns)
        assert {"syscall": "poll", "fd_kind": None, "site": DNS_LOOKUP_SITE, "threads": LOOKUPS} in out["census"]
        said = subprocess.run([FDTRACE, "threads", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        assert f"{LOOKUPS} threads blocked in poll() at the C library's DNS lookup (getaddrinfo)" in said.stdout
        assert f"{LOOKUPS} threads wait on DNS: cgo DNS lookups hold a thread each" in said.stdout
        assert "GODEBUG=netdns=go" in said.stdout
    finally:
        program.kill()
        program.wait()


def test_python_threads_waiting_on_a_name_servers_udp_socket_are_named(tmp_path: Path) -> None:
    script = tmp_path / "waiter.py"
    script.write_text(PYTHON_PROGRAM.format(waiters=WAITERS))
    line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if "# waiting here" in text)
    program = subprocess.Popen(["/usr/bin/python3.11", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    try:
        assert program.stdout is not None and program.stdout.readline().strip() == "waiting"
        site = f"wait_answer (waiter.py:{line})"

        def waiting(census: list[dict[str, Any]]) -> bool:
            return any(s["site"] == site and s["threads"] == WAITERS for s in census)

        out = census_until(program.pid, waiting)
        assert {"syscall": "recvfrom", "fd_kind": "dns", "site": site, "threads": WAITERS} in out["census"]
        said = subprocess.run([FDTRACE, "threads", "--pid", str(program.pid)], capture_output=True, text=True,
                              timeout=60)
        assert (f"{WAITERS} threads blocked in recvfrom() on UDP sockets to name servers (port 53) at {site}"
                in said.stdout)
        assert "threads wait on DNS" not in said.stdout  # the advice is Go's resolver: not for Python
    finally:
        program.kill()
        program.wait()
