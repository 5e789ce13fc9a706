"""`fdtrace rehearse` against Debian's nginx 1.22 (the stream module, a TCP proxy) in front of an
echo backend, on loopback, without --pid: the worker that accepts is traced (not the master,
which holds the listening socket too), a failure without EMFILE is judged by nginx's own
worker_connections, and a descriptor limit is never advised lower. One set-up: an nginx with
worker_connections 64 under a 20000-descriptor limit, one with 4096 under 256."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bpf.test_rehearse import ECHO, free_port, rehearse

NGINX = "/usr/sbin/nginx"
STREAM_MODULE = Path("/usr/lib/nginx/modules/ngx_stream_module.so")

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(shutil.which("nginx") is None and not Path(NGINX).exists(),
                                                  reason="nginx is not installed (scripts/setup.sh)"),
              pytest.mark.skipif(not STREAM_MODULE.exists(), reason="libnginx-mod-stream is not installed"),
              pytest.mark.skipif(os.geteuid() != 0, reason="tracing needs root")]


@dataclass
class Proxy:
    master: subprocess.Popen[bytes]
    workers: list[int]
    port: int
    config: Path
    limit: int

    @property
    def worker(self) -> int:
        return self.workers[0]

    def open_fds(self) -> int:
        return sum(len(os.listdir(f"/proc/{worker}/fd")) for worker in self.workers)


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def nginx(folder: Path, name: str, worker_connections: int, limit: int, backend: int, workers: int = 1) -> Proxy:
    port = free_port()
    config = folder / f"{name}.conf"
    config.write_text(
        f"load_module {STREAM_MODULE};\ndaemon off;\nworker_processes {workers};\npid {folder}/{name}.pid;\n"
        f"error_log {folder}/{name}.log notice;\n"
        f"events {{ worker_connections {worker_connections}; }}\n"
        f"stream {{ server {{ listen 127.0.0.1:{port}; proxy_pass 127.0.0.1:{backend}; }} }}\n")
    master = subprocess.Popen(["prlimit", f"--nofile={limit}:{limit}", NGINX, "-c", str(config), "-p", str(folder),
                               "-e", str(folder / f"{name}.log")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    from fdtrace.rehearsal.target import find_target

    while True:  # ready: the master and its workers hold the listening socket
        assert master.poll() is None, f"nginx {name} exited with {master.returncode}"
        assert time.monotonic() < deadline, f"nginx {name} did not start"
        try:
            held = find_target(f"127.0.0.1:{port}").listeners
        except Exception:
            held = ()
        started = sorted(children(master.pid))
        if len(held) == workers + 1 and len(started) == workers and set(started) <= set(held):
            return Proxy(master, started, port, config, limit)
        time.sleep(0.05)


@dataclass
class Setup:
    tight: Proxy  # worker_connections 64 under 20000 descriptors
    few: Proxy  # worker_connections 4096 under 256 descriptors
    two: Proxy  # worker_connections 64, two workers


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    folder = tmp_path_factory.mktemp("rehearse-nginx")
    echo = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
    assert echo.stdout is not None
    backend = int(echo.stdout.readline())
    started: list[Proxy] = []
    try:
        started.append(nginx(folder, "tight", 64, 20000, backend))
        started.append(nginx(folder, "few", 4096, 256, backend))
        started.append(nginx(folder, "two", 64, 20000, backend, workers=2))
        yield Setup(*started)
    finally:
        for proxy in started:
            proxy.master.terminate()
            proxy.master.wait(timeout=10)
        echo.terminate()
        echo.wait(timeout=10)


def test_worker_connections_not_the_descriptor_limit(setup: Setup) -> None:
    tight = setup.tight
    run = rehearse("--target", f"127.0.0.1:{tight.port}", "--ranks", "4", "--connections-per-rank", "25",
                   "--ramp", "10", "--hold", "0.2", "--json")
    assert run.returncode == 2, run.stderr
    result = json.loads(run.stdout)
    # no --pid: of the master and its worker, both holding the socket, the worker is traced
    assert (result["pid"], result["comm"], result["status"]) == (tight.worker, "nginx", "failed")
    # 64 slots, one the listener's, two per proxied connection: 31 held, the 32nd reset
    assert result["held"] == 31 and result["failed_at"] == 32, (result["held"], result["failed_at"])
    failure = result["failure"]
    assert failure["errno"] is None and result["failed_calls"] == {}, failure
    assert failure["judged_by"] is not None and "worker_connections 64 hold 31" in failure["judged_by"]
    advice = {c["name"]: c for c in result["advice"]}
    slots = advice["nginx worker_connections vs the rehearsed shape"]
    wanted = math.ceil((2 * 100 + 1) * 1.2)  # the shape's 100 connections, 2 slots each, and the listener
    assert (slots["status"], slots["recommended"]) == ("FAIL", f"worker_connections >= {wanted}"), slots
    assert f"set worker_connections {wanted}; in the events block of {tight.config}" in slots["change"]
    # the descriptor limit holds the need: never advised lower than 20000
    soft = advice["RLIMIT_NOFILE soft"]
    assert soft["status"] == "OK" and soft["recommended"] == "" and "--nofile" not in soft["change"], soft
    assert "worker_connections are not enough" in (tight.config.parent / "tight.log").read_text()


def test_its_descriptor_limit_when_that_is_what_ran_out(setup: Setup) -> None:
    few = setup.few
    idle = few.open_fds()
    run = rehearse("--target", f"127.0.0.1:{few.port}", "--ranks", "8", "--connections-per-rank", "100",
                   "--ramp", "10", "--hold", "0.2", "--json")
    assert run.returncode == 2, run.stderr
    result = json.loads(run.stdout)
    assert (result["pid"], result["status"], result["idle_fds"]) == (few.worker, "failed", idle)
    assert (result["fd_soft_limit"], result["fd_hard_limit"]) == (256, 256)
    assert abs(result["failed_at"] - (256 - idle) / 2) <= 2, result["failed_at"]
    assert result["failure"]["errno"] == "EMFILE" and result["failure"]["judged_by"] is None
    needed = result["needed_fds"]
    assert needed == idle + math.ceil(result["fds_per_connection"] * 800 - 1e-9)
    advice = {c["name"]: c for c in result["advice"]}
    soft = advice["RLIMIT_NOFILE soft"]
    raised = math.ceil(needed * 1.2)
    assert (soft["status"], soft["recommended"]) == ("FAIL", f">= {raised}"), soft
    assert raised > 256 and f"set worker_rlimit_nofile {raised}; in the main context of {few.config}" in soft["change"]
    assert advice["nginx worker_connections vs the rehearsed shape"]["status"] == "OK"  # 4096 hold 800


def test_two_workers_are_measured_as_one(setup: Setup) -> None:
    """Two workers accept on the port: both are traced, the first standing for them, with their
    descriptors summed (either may accept every connection)."""
    two = setup.two
    idle = two.open_fds()
    run = rehearse("--target", f"127.0.0.1:{two.port}", "--ranks", "4", "--connections-per-rank", "25",
                   "--ramp", "10", "--hold", "0.2", "--json")
    assert run.returncode == 2, run.stderr
    assert f"tracing pid {two.worker} (nginx) and 1 more worker, their descriptors summed" in run.stderr
    result = json.loads(run.stdout)
    assert (result["pid"], result["idle_fds"]) == (two.worker, idle)
    # 31 each at most: the connections fail once the worker that took them is full
    assert 32 <= result["failed_at"] <= 63 and result["failure"]["errno"] is None
    steps = result["bursts"]
    assert steps[0]["target_fds_held"] == idle + 2 * steps[0]["answered"]
    advice = {c["name"]: c for c in result["advice"]}
    slots = advice["nginx worker_connections vs the rehearsed shape"]
    assert (slots["status"], slots["recommended"]) == ("FAIL", f"worker_connections >= {math.ceil(201 * 1.2)}")
    assert advice["RLIMIT_NOFILE soft"]["recommended"] == ""


def test_the_master_is_never_advised_a_lower_limit(setup: Setup) -> None:
    """--pid of the master, which accepts nothing: it takes no descriptor per connection, and its
    20000 are never advised lower (the issue saw --nofile=11:256 advised)."""
    tight = setup.tight
    run = rehearse("--target", f"127.0.0.1:{tight.port}", "--pid", str(tight.master.pid), "--ranks", "2",
                   "--connections-per-rank", "10", "--hold", "0.2", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert (result["pid"], result["fds_per_connection"], result["fd_soft_limit"]) == (tight.master.pid, 0.0, 20000)
    soft = {c["name"]: c for c in result["advice"]}["RLIMIT_NOFILE soft"]
    assert (soft["status"], soft["recommended"], soft["change"]) == ("OK", "", ""), soft
    assert "--nofile" not in run.stdout
