"""A stats socket that answers a byte every 0.9 s (or streams forever) must neither stop the
recording from being written nor SIGTERM from ending it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fdtrace.analysis import load

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(os.geteuid() != 0, reason="attaches BPF programs: needs root")]
FDTRACE = str(Path(sys.executable).with_name("fdtrace"))


def trickling_socket(path: Path, stop: threading.Event) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.2)

    def serve() -> None:
        with server:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except OSError:
                    continue
                threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    def trickle(conn: socket.socket) -> None:
        with conn:
            while not stop.is_set():
                try:
                    conn.sendall(b"C")
                except OSError:
                    return
                time.sleep(0.9)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_a_trickling_stats_socket_delays_neither_writing_nor_stopping(tmp_path: Path) -> None:
    path = tmp_path / "slow.sock"
    stop = threading.Event()
    server = trickling_socket(path, stop)
    out = tmp_path / "rec"
    recorder = subprocess.Popen([FDTRACE, "record", "-o", str(out), "--interval", "0.5", "--haproxy-socket", str(path)],
                                stderr=subprocess.PIPE, text=True)
    try:
        assert recorder.stderr is not None
        for line in recorder.stderr:
            if "recording to" in line:
                break
        time.sleep(3)
        written = len(list((out / "system").rglob("part-*.parquet")))
        assert written >= 4  # a round every 0.5 s, whatever the socket does
        asked = time.monotonic()
        recorder.send_signal(signal.SIGTERM)
        recorder.wait(timeout=10)
        assert time.monotonic() - asked < 2.0
        assert recorder.returncode == 0
    finally:
        if recorder.poll() is None:
            recorder.kill()
        stop.set()
        server.join(timeout=5)
    rows = load(out).haproxy
    assert len(rows) >= 1 and rows["error"].notna().all() and rows["curr_conns"].isna().all()
