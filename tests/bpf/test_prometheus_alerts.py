"""A real Prometheus (Debian's) scrapes `fdtrace export` with fdtrace's shipped rules while a real
process runs out of descriptors: the EMFILE alert fires, then the FD-use alert after its 30 s,
both naming the process; the quiet processes raise none."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import python_child
from tests.helpers import FDTRACE

pytestmark = [pytest.mark.bpf,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is missing")]
RULES = Path(str(resources.files("fdtrace") / "data" / "fdtrace-alerts.yml"))

# Opens descriptors up to its limit, then keeps failing once a second (socket() and open()).
CHILD = """
import os, socket, sys, time
sys.stdin.readline()
held = []
while True:
    try: held.append(os.open('/dev/null', os.O_RDONLY))
    except OSError: break
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try: socket.socket()
    except OSError: pass
    time.sleep(1)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def alerts(port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=5) as answer:
        found: list[dict[str, Any]] = json.loads(answer.read())["data"]["alerts"]
    return found


def test_prometheus_fires_fdtraces_alerts_for_a_process_out_of_descriptors(tmp_path: Path) -> None:
    child = subprocess.Popen(["prlimit", "--nofile=64:64", *python_child(CHILD)], stdin=subprocess.PIPE, text=True)
    exporter_port, prometheus_port = free_port(), free_port()
    exporter = subprocess.Popen([FDTRACE, "export", "--listen", f"127.0.0.1:{exporter_port}", "--pid", str(child.pid)],
                                stderr=subprocess.PIPE, text=True)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n"
        f"  - {{job_name: fdtrace, static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]}}\n")
    prometheus = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert exporter.stderr is not None
        for line in exporter.stderr:
            if "serving metrics" in line:
                break
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        started = time.monotonic()
        firing: dict[str, dict[str, Any]] = {}
        expected = {"FdtraceFdExhausted", "FdtraceFdUsageHigh"}
        while time.monotonic() - started < 120 and not expected <= set(firing):
            time.sleep(1)
            try:
                current = alerts(prometheus_port)
            except OSError:
                continue  # not up yet
            for alert in current:
                if alert["state"] == "firing":
                    firing.setdefault(alert["labels"]["alertname"], alert)
        assert set(firing) == expected, firing  # no other (an OOM kill elsewhere is not the --pid's)
        for alert in firing.values():
            assert alert["labels"]["pid"] == str(child.pid)
            assert alert["labels"]["instance"] == f"127.0.0.1:{exporter_port}"
        exhausted = firing["FdtraceFdExhausted"]
        assert exhausted["labels"]["errno"] == "EMFILE"
        assert exhausted["labels"]["syscall"] in ("openat", "socket")
        assert firing["FdtraceFdUsageHigh"]["annotations"]["summary"].endswith("has 100% of its FD soft limit open")
    finally:
        for process in (prometheus, exporter):
            process.send_signal(signal.SIGINT)
        for process in (prometheus, exporter):
            try:
                process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
        child.kill()
        child.wait()
