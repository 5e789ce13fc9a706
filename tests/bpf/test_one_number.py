"""One right number in one place: the HAProxy incident (haproxy 2.6, maxconn 4096, nbthread 2, 256
descriptors set by ``ulimit-n`` in its configuration, a storm of clients) recorded without any
flag. What to set RLIMIT_NOFILE to is the same number in live doctor, doctor --from, info, the
report (HTML and Markdown) and the live view's process detail (replaying the recording), it is
never below what haproxy demands of itself (its Maxsock, 8220), and each names the same place:
ulimit-n in that configuration file, where the limit in force was set."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fdtrace.display import markdown_shown
from fdtrace.policy import with_margin
from tests.bpf.test_haproxy import free_port
from tests.conftest import needs_root
from tests.helpers import FDTRACE, replayed_detail, started

pytestmark = [needs_root(), pytest.mark.bpf]

# as haproxy 2.6 counts it: connections, 2 threads, a bind and a stats socket, the stats CLI's 10, 10 reserved
MAXSOCK = 2 * 4096 + 3 * 2 + 2 + 10 + 10
CLIENTS = 300


def echo(server: socket.socket, stop: threading.Event) -> None:
    server.settimeout(0.2)
    held = []
    while not stop.is_set():
        try:
            connection, _ = server.accept()
        except OSError:
            continue
        held.append(connection)
    for connection in held:
        connection.close()


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("one-number")
    backend = socket.socket()
    backend.bind(("127.0.0.1", 0))
    backend.listen(1024)
    stop = threading.Event()
    server = threading.Thread(target=echo, args=(backend, stop), daemon=True)
    server.start()
    port, stats = free_port(), folder / "stats.sock"
    config = folder / "haproxy.cfg"
    config.write_text(
        f"global\n    maxconn 4096\n    nbthread 2\n    ulimit-n 256\n    no strict-limits\n"
        f"    stats socket {stats} mode 600\n"
        "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 20s\n    timeout server 20s\n"
        f"frontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n"
        f"backend be\n    server s1 127.0.0.1:{backend.getsockname()[1]}\n")
    haproxy = subprocess.Popen(["prlimit", "--nofile=256:256", "haproxy", "-db", "-f", str(config)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not stats.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    out = folder / "rec"
    recorder = started([FDTRACE, "record", "-o", str(out), "--interval", "0.5"], "recording to")  # no flag
    clients = []
    try:
        for _ in range(CLIENTS):  # more than 256 descriptors hold: accept4 fails with EMFILE
            client = socket.socket()
            client.settimeout(2)
            try:
                client.connect(("127.0.0.1", port))
                client.sendall(b"x")
            except OSError:
                client.close()
                continue
            clients.append(client)
        deadline = time.monotonic() + 30  # until the recorder has the failures and a round after them
        while time.monotonic() < deadline and not list(out.glob("haproxy/host=*/part-*.parquet")):
            time.sleep(0.1)
        live = subprocess.run([FDTRACE, "doctor", "--pid", str(haproxy.pid), "--json"], capture_output=True,
                              text=True, timeout=120)
    finally:
        for client in clients:
            client.close()
        recorder.send_signal(signal.SIGINT)
        recorder.communicate(timeout=60)
    try:
        yield {"out": out, "pid": haproxy.pid, "live": live, "config": config}
    finally:
        haproxy.terminate()
        haproxy.wait(timeout=10)
        stop.set()
        server.join(timeout=10)
        backend.close()


def fd_check(checks: list[dict[str, Any]], pid: int) -> dict[str, Any]:
    [soft] = [c for c in checks if c["scope"].startswith(f"pid {pid}") and c["name"] == "RLIMIT_NOFILE soft"]
    return soft


def test_the_same_number_and_place_everywhere_and_never_below_haproxy_s_own_demand(incident: dict[str, Any],
                                                                                   tmp_path: Path) -> None:
    out, pid = incident["out"], incident["pid"]
    number = with_margin(MAXSOCK)
    place = f"set ulimit-n {number} in the global section of {incident['config']}"
    live = fd_check(json.loads(incident["live"].stdout)["checks"], pid)
    assert live["recommended"] == f">= {number}" and place in live["change"], live
    recorded = subprocess.run([FDTRACE, "doctor", "--pid", str(pid), "--from", str(out), "--json"],
                              capture_output=True, text=True, timeout=120)
    from_recording = fd_check(json.loads(recorded.stdout)["checks"], pid)
    assert from_recording["recommended"] == f">= {number}" and place in from_recording["change"], from_recording
    info = subprocess.run([FDTRACE, "info", str(out)], capture_output=True, text=True, timeout=120).stdout
    [said] = [line for line in info.splitlines() if f"RLIMIT_NOFILE of haproxy [{pid}]" in line]
    assert f"set it to {number} ({place}" in said and f"HAProxy's Maxsock {MAXSOCK}" in said, said
    assert "ulimit -n" not in said and "LimitNOFILE=" not in said  # not the generic places
    report = tmp_path / "report.html"
    assert subprocess.run([FDTRACE, "report", str(out), "-o", str(report)], capture_output=True,
                          timeout=300).returncode == 0
    assert f"RLIMIT_NOFILE of haproxy [{pid}]" in report.read_text() and f"set it to {number} " in report.read_text()
    markdown = tmp_path / "report.md"
    assert subprocess.run([FDTRACE, "report", str(out), "-o", str(markdown)], capture_output=True,
                          timeout=300).returncode == 0
    named = markdown_shown(f"RLIMIT_NOFILE of haproxy [{pid}]")
    [line] = [line for line in markdown.read_text().splitlines() if named in line]
    assert markdown_shown(f"set it to {number} ({place}") in line, line
    text = replayed_detail(out, pid)
    assert f"what to change: RLIMIT_NOFILE soft limit {number} (needed {MAXSOCK}: HAProxy's Maxsock {MAXSOCK}" \
        in text, text
    assert " ".join(place.split()) in text, text
