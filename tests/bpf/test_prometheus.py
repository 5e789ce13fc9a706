"""`fdtrace export`: scrape /metrics while a child runs out of descriptors."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import python_child
from tests.helpers import FDTRACE

pytestmark = pytest.mark.bpf

CHILD = """
import os, socket, sys, time
sys.stdin.readline()
while True:
    try: os.open('/dev/null', os.O_RDONLY)
    except OSError: break
for _ in range(2):
    try: socket.socket()
    except OSError: pass
sys.stdin.read()  # at its limit until the test ends it
"""


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    # An empty label is an absent one (Prometheus's own rule): the unit and container of a process in none.
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_show_the_child_at_its_limit_and_its_errors() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    exporter = subprocess.Popen([FDTRACE, "export", "--listen", f"127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True)
    assert exporter.stderr is not None
    for line in exporter.stderr:
        if "serving metrics" in line:
            break
    child = subprocess.Popen(["prlimit", "--nofile=64:64", *python_child(CHILD)], stdin=subprocess.PIPE, text=True)
    try:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        deadline = time.monotonic() + 60
        metrics: dict = {}
        fd_class = (("class", "EMFILE/ENFILE"), ("harm", "0"), ("incident", "true"))
        ended = ("fdtrace_failures_total", (("class", "ended on request"), ("harm", "3"), ("incident", "false")))
        labels = (("comm", Path(sys.executable).name[:15]), ("pid", str(child.pid)))

        def errors_of(metrics: dict) -> dict[str, float]:
            return {dict(key)["syscall"]: value for (name, key) in metrics
                    if name == "fdtrace_failed_calls_total" and dict(key)["pid"] == str(child.pid)
                    for value in [metrics[(name, key)]]}

        # Every figure asserted below arrives by its own path: the samples (open and max fds), the
        # kernel's counters (failed calls, sockets), the decoded events a round after them (failures
        # by class; a CI run scraped in between). Wait until the last of them has arrived.
        while True:
            metrics = scrape(port)
            if (metrics.get(("process_open_fds", labels)) == 64 and metrics.get(("process_max_fds", labels)) == 64
                    and errors_of(metrics) == {"openat": 1.0, "socket": 2.0}
                    and metrics.get(("fdtrace_sockets_total", labels)) == 2.0
                    and metrics.get(("fdtrace_failures_total", fd_class), 0) >= 3 and ended in metrics):
                break
            if time.monotonic() > deadline:
                break  # the assertions below say which figure never came
            time.sleep(0.25)
        assert metrics[("process_open_fds", labels)] == 64
        assert metrics[("process_max_fds", labels)] == 64
        errors = errors_of(metrics)
        assert errors == {"openat": 1.0, "socket": 2.0}
        assert metrics[("fdtrace_sockets_total", labels)] == 2.0
        assert metrics[("node_filefd_maximum", ())] > 0 and metrics[("node_filefd_allocated", ())] > 0
        assert metrics[("fdtrace_events_lost_total", (("reason", "ringbuf_full"),))] == 0
        assert ("fdtrace_oom_kills_total", ()) in metrics
        # failures by class with their rank of harm (the host's others count too: at least the child's 3)
        assert metrics[("fdtrace_failures_total", fd_class)] >= 3
        assert ended in metrics
    finally:
        child.kill()
        child.wait()
        exporter.send_signal(signal.SIGTERM)
        exporter.communicate(timeout=30)
    assert exporter.returncode == 0
