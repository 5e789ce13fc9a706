"""fdtrace counts exactly the failures of the program it watches (issue 34): haproxy at 256
descriptors (maxconn 4096, `no strict-limits`) under a connection storm, recorded without a flag.
fdtrace's accept4 EMFILE count for haproxy equals the count haproxy logs for its frontend ("Proxy fe
reached process FD limit", one line per failed accept4).

With FDTRACE_HAPROXY_STATS=1 its configuration names a stats socket, which fdtrace finds and asks
every quarter second only while haproxy has room (``procfs.room``): a connection of fdtrace's
that haproxy accepts while full would fail an accept4 of the stats socket's listener, which haproxy
does not log, and the two counts would differ. That run is a measurement, not part of the suite: a
storm that begins between fdtrace's room check and haproxy's accept of its connection still costs
failed accept4s (docs/benchmarks.md has the figures). The repeated check: `for i in 1 2 3 4 5; do
FDTRACE_HAPROXY_STATS=1 FDTRACE_HAPROXY_STORMS=5 .venv/bin/python -m pytest -q
tests/bpf/test_haproxy_storm.py || break; done`."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from fdtrace.procfs.sampler import ProcSampler
from tests.bpf.test_haproxy import free_port
from tests.conftest import needs_root
from tests.helpers import FDTRACE, started, wait_recorded

pytestmark = [needs_root(), pytest.mark.bpf,
              pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")]

INTERVAL_S = 0.25
CLIENTS = 300  # haproxy proxies about 120 within 256 descriptors (2 each): the rest meet EMFILE
FULL_LOG = "Proxy fe reached process FD limit"


def hold_all(server: socket.socket, stop: threading.Event) -> None:
    """The backend: takes every connection and holds it."""
    server.settimeout(0.1)
    held = []
    while not stop.is_set():
        try:
            held.append(server.accept()[0])
        except OSError:
            continue
    for connection in held:
        connection.close()


def listen_backlog(port: int) -> int | None:
    """Connections waiting in the accept queue of the listener on 127.0.0.1:``port``."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":  # LISTEN
            return int(fields[4].split(":")[1], 16)
    return None


def stats_rows(rec: Any, stats: Path, since_ns: int) -> Any:
    """The recording's rows of ``stats`` taken since ``since_ns`` (CLOCK_MONOTONIC)."""
    rows = rec.haproxy
    if rows is None or not len(rows):
        return pd.DataFrame({"error": []})
    return rows[(rows["socket"] == str(stats)) & (rows["ts_ns"] >= since_ns)]


def test_fdtrace_counts_exactly_the_accept4_failures_haproxy_logs(tmp_path: Path) -> None:
    storms = int(os.environ.get("FDTRACE_HAPROXY_STORMS", "1"))
    with_stats = os.environ.get("FDTRACE_HAPROXY_STATS") == "1"
    backend = socket.socket()
    backend.bind(("127.0.0.1", 0))
    backend.listen(4096)
    stop = threading.Event()
    server = threading.Thread(target=hold_all, args=(backend, stop), daemon=True)
    server.start()
    port, stats, log = free_port(), tmp_path / "stats.sock", tmp_path / "haproxy.log"
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        # one thread: haproxy gives up a log line when another thread holds the log's descriptor
        # for 200 tries (fd_write_frag_line "prefers to fail on collision than to block"), which a
        # loaded host makes happen, and its log is this test's ground truth
        "global\n    maxconn 4096\n    ulimit-n 256\n    no strict-limits\n    nbthread 1\n"
        + (f"    stats socket {stats} mode 600\n" if with_stats else "") +
        "    log stdout format raw local0\n"
        "defaults\n    mode tcp\n    log global\n    timeout connect 2s\n    timeout client 5s\n"
        "    timeout server 5s\n"
        f"frontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n"
        f"backend be\n    server s1 127.0.0.1:{backend.getsockname()[1]}\n")
    with open(log, "w") as logged:  # a regular file: haproxy's log writes never fail (none dropped)
        haproxy = subprocess.Popen(["prlimit", "--nofile=256:256", "haproxy", "-db", "-f", str(config)],
                                   stdout=logged, stderr=subprocess.STDOUT)
    samples = ProcSampler()
    recorder = None
    try:
        deadline = time.monotonic() + 30
        while (not stats.exists()) if with_stats else listen_backlog(port) is None:  # haproxy listens
            assert haproxy.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        idle = samples.open_fds(haproxy.pid) or 0
        out = tmp_path / "rec"
        recorder = started([FDTRACE, "record", "-o", str(out), "--pid", str(haproxy.pid), "--interval",
                            str(INTERVAL_S)], "recording to")  # no --haproxy-socket: found in its configuration
        for _ in range(storms):
            clients = []
            for _ in range(CLIENTS):
                client = socket.socket()
                client.settimeout(2)
                try:
                    client.connect(("127.0.0.1", port))
                except OSError:
                    client.close()
                    continue
                clients.append(client)
            deadline = time.monotonic() + 30
            while FULL_LOG not in log.read_text():  # the storm has reached haproxy's limit
                assert time.monotonic() < deadline, "haproxy never reached its FD limit"
                time.sleep(0.05)
            held_from = time.monotonic_ns()
            time.sleep(6 * INTERVAL_S)  # the storm lasts six of the sampler's turns (a length, not a wait)
            if with_stats:  # the sampler has held back while haproxy was full (its row is on disk)
                wait_recorded(out, lambda rec, since=held_from: bool(stats_rows(rec, stats, since)["error"].notna()
                                                                       .any()),
                              "a stats question held back during the storm, recorded")
            for client in clients:
                client.close()
            deadline = time.monotonic() + 120  # a haproxy at its limit can hold on for its timeouts
            settled: list[int | None] = []
            while len(settled) < 5 or len(set(settled[-5:])) > 1 or (settled[-1] or 0) > idle + 16 \
                    or listen_backlog(port) != 0:  # the storm is over: its descriptors back near idle, and staying
                assert time.monotonic() < deadline, \
                    f"haproxy did not settle: fds {settled[-5:]} (idle {idle}), backlog {listen_backlog(port)}"
                settled.append(samples.open_fds(haproxy.pid))  # the same for half a second
                time.sleep(0.1)
            if with_stats:  # quiet: the sampler asks again, and is answered (its row is on disk)
                quiet_from = time.monotonic_ns()
                wait_recorded(out, lambda rec, since=quiet_from: bool(stats_rows(rec, stats, since)["error"].isna()
                                                                        .any()),
                              "a stats question answered after the storm, recorded")
        recorder.send_signal(signal.SIGINT)
        _, errors = recorder.communicate(timeout=120)
        assert recorder.returncode == 0, errors
    finally:
        if recorder is not None and recorder.poll() is None:
            recorder.kill()
            recorder.wait()
        haproxy.terminate()
        haproxy.wait(timeout=10)
        stop.set()
        backend.close()
    logged_failures = log.read_text().count(FULL_LOG)
    from fdtrace.analysis import load

    recording = load(out)
    counters = recording.counters[recording.counters["pid"] == haproxy.pid].sort_values("ts_ns")
    errors = {(e["syscall"], e["errno"]): e["count"] for e in counters.iloc[-1]["errors"]}
    assert logged_failures > 0
    assert errors.get(("accept4", "EMFILE"), 0) == logged_failures, (errors, logged_failures)
    if not with_stats:
        return
    # the stats socket was asked while haproxy had room, and held back while it had not
    rows = recording.haproxy[(recording.haproxy["socket"] == str(stats))]
    assert (rows["error"].isna() & (rows["haproxy_pid"] == haproxy.pid)).sum() >= storms
    held = rows["error"].dropna()
    assert held.str.startswith(f"not asked while haproxy [{haproxy.pid}] has ").sum() >= storms, list(held)
