"""`fdtrace top --prometheus`: a real Prometheus (Debian's) scrapes two `fdtrace export`s labelled
as two hosts, one watching a process that runs out of descriptors, one a quiet process; the fleet
view ranks the failing host first, opens its processes, and marks a host whose exporter stops."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.widgets import DataTable

from fdtrace.sources.prometheus_fleet import PrometheusFleet
from fdtrace.tui.fleet import FleetApp, HostScreen
from tests.bpf.test_prometheus_alerts import CHILD, free_port
from tests.conftest import python_child
from tests.helpers import FDTRACE, started

pytestmark = [pytest.mark.bpf,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is missing")]
QUIET = "import sys, time\nsys.stdin.readline()\ntime.sleep(120)\n"


def exporter(port: int, pid: int) -> subprocess.Popen[str]:
    return started([FDTRACE, "export", "--listen", f"127.0.0.1:{port}", "--pid", str(pid)], "serving metrics")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, dict[str, int], dict[str, subprocess.Popen[str]]]]:
    failing = subprocess.Popen(["prlimit", "--nofile=64:64", *python_child(CHILD)], stdin=subprocess.PIPE, text=True)
    quiet = subprocess.Popen(python_child(QUIET), stdin=subprocess.PIPE, text=True)
    ports = {"alpha": free_port(), "beta": free_port()}
    exporters = {"alpha": exporter(ports["alpha"], failing.pid), "beta": exporter(ports["beta"], quiet.pid)}
    prometheus_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: fdtrace\n"
        "    static_configs:\n"
        f"      - {{targets: ['127.0.0.1:{ports['alpha']}'], labels: {{host: alpha}}}}\n"
        f"      - {{targets: ['127.0.0.1:{ports['beta']}'], labels: {{host: beta}}}}\n")
    prometheus = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for child in (failing, quiet):
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        yield f"http://127.0.0.1:{prometheus_port}", {"alpha": failing.pid, "beta": quiet.pid}, exporters
    finally:
        for process in (prometheus, *exporters.values(), failing, quiet):
            process.terminate()
        for process in (prometheus, *exporters.values(), failing, quiet):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def settled(reader: PrometheusFleet, ready: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reader.poll()
        if callable(ready) and ready():
            return
        time.sleep(1)
    raise AssertionError(f"the fleet never settled: {reader.error or reader.hosts}")


def test_the_fleet_view_ranks_the_failing_host_first_and_opens_its_processes(
        fleet: tuple[str, dict[str, int], dict[str, subprocess.Popen[str]]]) -> None:
    url, pids, exporters = fleet
    reader = PrometheusFleet(url, host_label="host")

    def both_seen() -> bool:
        hosts = reader.hosts
        return ({"alpha", "beta"} <= set(hosts) and pids["alpha"] in hosts["alpha"].processes
                and hosts["alpha"].emfile_recent > 0 and pids["beta"] in hosts["beta"].processes
                and hosts["alpha"].processes[pids["alpha"]].fd_usage == 1.0)
    settled(reader, both_seen)
    assert reader.error is None
    assert [h.host for h in reader.ranked()] == ["alpha", "beta"]
    alpha, beta = reader.hosts["alpha"], reader.hosts["beta"]
    fullest = alpha.fullest()
    assert fullest is not None and (fullest.pid, fullest.open_fds, fullest.fd_soft_limit) == (pids["alpha"], 64, 64)
    assert beta.emfile_recent == 0 and beta.up and alpha.up
    # each exporter traces the events of its --pid only (it samples the processes with most FDs too)
    assert alpha.processes[pids["alpha"]].emfile_recent == alpha.emfile_recent
    assert beta.processes.get(pids["alpha"]) is None or beta.processes[pids["alpha"]].emfile_recent == 0

    async def scenario() -> None:
        app = FleetApp(PrometheusFleet(url, host_label="host"), interval_s=1.0)
        async with app.run_test(size=(160, 30)) as pilot:
            table = app.query_one("#hosts", DataTable)
            for _ in range(100):
                if table.row_count == 2:
                    break
                await pilot.pause(0.1)
            assert [str(table.get_row_at(i)[0]) for i in range(2)] == ["alpha", "beta"]
            assert str(table.get_row_at(0)[2]) != "·"  # its EMFILE/ENFILE of the window
            await pilot.press("enter")

            def host_drawn() -> bool:  # the host screen is up and its table has its rows
                screen = app.screen
                return isinstance(screen, HostScreen) and bool(screen.query("#host-processes")) \
                    and screen.query_one("#host-processes", DataTable).row_count > 0
            for _ in range(300):
                if host_drawn():
                    break
                await pilot.pause(0.1)
            assert isinstance(app.screen, HostScreen) and app.screen.host == "alpha"
            processes = app.screen.query_one("#host-processes", DataTable)
            assert str(processes.get_row_at(0)[0]) == str(pids["alpha"])  # failing first
            assert str(processes.get_row_at(0)[2]) == "64/64" and str(processes.get_row_at(0)[3]) == "100%"
    asyncio.run(scenario())

    exporters["beta"].terminate()  # its host stops answering Prometheus
    exporters["beta"].wait(timeout=30)
    settled(reader, lambda: "beta" in reader.hosts and not reader.hosts["beta"].up)
    assert [h.host for h in reader.ranked()] == ["alpha", "beta"]


def test_a_bad_prometheus_url_is_one_line() -> None:
    for url, said in (("ftp://example", "give the server's URL"), ("127.0.0.1:9090", "give the server's URL")):
        result = subprocess.run([FDTRACE, "top", "--prometheus", url], capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and result.stderr.strip().splitlines() == [
            f"fdtrace: error: --prometheus {url!r}: {said}, e.g. http://127.0.0.1:9090"]
    down = PrometheusFleet(f"http://127.0.0.1:{free_port()}")
    assert down.poll() == {} and down.error is not None and "did not answer" in down.error
