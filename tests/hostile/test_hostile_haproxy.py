"""A process named haproxy that another user starts decides what root's `fdtrace doctor` reads:
its -f files and the stats sockets they name. Nothing it names may hang doctor, exhaust its
memory or make it print a traceback; every problem is a finding."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import FDTRACE, eventually

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts processes as another user: needs root")

NOBODY = pwd.getpwnam("nobody")


def fake_haproxy(folder: Path, config: str) -> subprocess.Popen[bytes]:
    """A process of nobody's whose name is haproxy and whose command line says -f CONFIG."""
    script = folder / "haproxy"
    script.write_text("#!/bin/sh\nsleep 60\n")
    script.chmod(0o755)
    return subprocess.Popen([str(script), "-f", config], user=NOBODY.pw_uid, group=NOBODY.pw_gid,
                            start_new_session=True)


def doctor(pid: int) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run([FDTRACE, "doctor", "--pid", str(pid), "--json"], capture_output=True, text=True,
                            timeout=30)
    return result, time.monotonic() - started


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder nobody can reach (pytest's own tmp_path is under a folder of root's only)."""
    path = Path(tempfile.mkdtemp(prefix="fdtrace-hostile-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def check(folder: Path, config: str, finding: str) -> None:
    proc = fake_haproxy(folder, config)
    try:
        # the kernel runs the script through /bin/sh, under the script's name (once it has exec'd)
        eventually(lambda: Path(f"/proc/{proc.pid}/comm").read_text().strip() == "haproxy", "the script exec'd", 30)
        assert Path(f"/proc/{proc.pid}/comm").read_text().strip() == "haproxy"
        result, took = doctor(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert "Traceback" not in result.stderr and result.returncode in (1, 2), result.stderr
    assert took < 10
    assert finding in result.stdout, result.stdout
    assert "not-shown" not in result.stdout


def test_a_config_of_dev_zero_is_not_read_to_the_end(folder: Path) -> None:
    check(folder, "/dev/zero", "not a regular file")


def test_a_fifo_config_does_not_hang_doctor(folder: Path) -> None:
    fifo = folder / "cfg"
    os.mkfifo(fifo)
    os.chown(fifo, NOBODY.pw_uid, -1)
    check(folder, str(fifo), "not a regular file")


def test_a_value_that_is_not_a_number_is_a_finding(folder: Path) -> None:
    config = folder / "haproxy.cfg"
    config.write_text("global\n    maxconn abc-not-shown\n")
    check(folder, str(config), "maxconn is not a number")  # its value is never shown


def test_a_stats_socket_that_streams_forever_is_cut_off(folder: Path) -> None:
    path = folder / "stats.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chown(path, NOBODY.pw_uid, -1)
    server.listen(4)
    stop = threading.Event()

    def stream() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                try:
                    while not stop.is_set():
                        conn.sendall(b"CurrConns: 1\n" * 4096)
                except OSError:
                    pass

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    config = folder / "haproxy.cfg"
    config.write_text(f"global\n    maxconn 100\n    stats socket {path}\n")
    try:
        check(folder, str(config), "answered more than")
    finally:
        stop.set()
        streamer.join(timeout=5)
        server.close()


def test_a_socket_of_another_user_is_not_asked(folder: Path) -> None:
    path = folder / "root.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))  # root's
    server.listen(1)
    config = folder / "haproxy.cfg"
    config.write_text(f"global\n    maxconn 100\n    stats socket {path}\n")
    try:
        check(folder, str(config), "not to the process's user: not asked")
    finally:
        server.close()
