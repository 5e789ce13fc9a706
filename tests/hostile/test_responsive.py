"""A stats socket that answers a byte every 0.9 s (or streams forever) must neither stop the
recording from being written nor SIGTERM from ending it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from fdtrace.analysis import load
from tests.helpers import FDTRACE

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(os.geteuid() != 0, reason="attaches BPF programs: needs root")]


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
        # a round every 0.5 s, whatever the socket does: a read that waited for the socket's end
        # would never end (it trickles for ever), so four parts written at all is the proof; the
        # deadline is only for a host too busy to take four rounds in 30 s
        deadline = time.monotonic() + 30
        while len(list((out / "system").rglob("part-*.parquet"))) < 4:
            assert time.monotonic() < deadline and recorder.poll() is None
            time.sleep(0.1)
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
    rows = rows[rows["socket"] == str(path)]  # the host's own haproxies are found and asked too
    assert len(rows) >= 1 and rows["error"].notna().all() and rows["curr_conns"].isna().all()
    assert rows["error"].str.match("(timed out|answered too slowly);").all()  # each ask given up at its deadline


def test_top_quits_at_once_with_a_fifo_planted_as_a_phase_state(tmp_path: Path) -> None:
    """The live view reads the phase state files of `fdtrace run` jobs; a FIFO another user put
    there must not hang it, nor keep `q` from quitting."""
    import asyncio

    from fdtrace.integrations.phases.live import RUN_DIR_PREFIX, LivePhases
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.sources.live import LiveOptions, LiveSource
    from tests.helpers import live_app

    run = tmp_path / f"{RUN_DIR_PREFIX}planted"
    run.mkdir()
    os.mkfifo(run / "state-1.bin")
    source = LiveSource(LiveOptions(trace=TraceOptions(errors_only=True), top_processes=5, keep_exited=0),
                        phases=LivePhases(tmp_path))
    source.start()
    app = live_app(source)
    took: list[float] = []

    async def scenario() -> None:
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.pause(1.5)  # several polls of the phase files
            asked = time.monotonic()
            await pilot.press("q")
            await pilot.pause(0.1)
            took.append(time.monotonic() - asked)

    started = time.monotonic()
    asyncio.run(scenario())
    # a FIFO's open blocks for ever: any bound tells a hang apart, one loose enough for a busy host
    assert took and took[0] < 10.0
    assert time.monotonic() - started < 30
    assert app.state.phases == {}
