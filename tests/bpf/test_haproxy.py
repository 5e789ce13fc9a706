"""Debian's haproxy as a real peer: doctor reads its limits, and its accept4() EMFILE failures
under a loopback connection storm are counted per syscall."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveTracer
from tests.helpers import FDTRACE, eventually

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, Path]]:
    """haproxy at most 64 FDs, with a maxconn that needs far more, in front of a local server."""
    backend = socket.socket()
    backend.bind(("127.0.0.1", 0))
    backend.listen(1024)
    port, stats = free_port(), tmp_path / "stats.sock"
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        f"global\n    maxconn 1000\n    ulimit-n 64\n    no strict-limits\n    stats socket {stats} mode 600\n"
        "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 120s\n    timeout server 120s\n"
        "    timeout client-fin 1s\n    timeout server-fin 1s\n"
        f"frontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n"
        f"backend be\n    server s1 127.0.0.1:{backend.getsockname()[1]}\n")
    proc = subprocess.Popen(["prlimit", "--nofile=64:64", "haproxy", "-db", "-f", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(100):
        if stats.exists():
            break
        time.sleep(0.05)
    assert stats.exists(), proc.stderr.read() if proc.poll() is not None and proc.stderr else "haproxy did not start"
    try:
        yield proc, port, config
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        backend.close()


def test_doctor_flags_a_maxconn_the_fd_limit_cannot_hold(haproxy: tuple[subprocess.Popen[str], int, Path]) -> None:
    proc, _, config = haproxy
    result = subprocess.run([FDTRACE, "doctor", "--pid", str(proc.pid), "--json"], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"] if c["scope"].startswith(f"pid {proc.pid}")}
    maxconn = checks["haproxy maxconn vs FD limit"]
    # as haproxy 2.6 counts it: 2 per connection, 3 per thread (2), a bind and a stats socket, the stats
    # CLI's 10, 10 reserved
    assert maxconn["status"] == "FAIL" and "maxconn 1000 needs 2028 FDs" in maxconn["current"]
    assert maxconn["recommended"] == "FD limit >= 2434 (RLIMIT_NOFILE soft, above), or maxconn <= 18"
    # either way is one haproxy accepts under strict-limits: maxconn 18 under 64, 1000 under 2434
    from tests.bpf.test_rehearse import starts_under_strict_limits

    folder, backend = Path(config).parent, int(config.read_text().rsplit(":", 1)[1].split()[0])
    assert starts_under_strict_limits(folder, 18, 64, backend)["Maxsock"] == "64"
    assert starts_under_strict_limits(folder, 19, 64, backend) == {}
    assert starts_under_strict_limits(folder, 1000, 2434, backend)["Maxsock"] == "2028"
    # the one FD limit to set, from what maxconn needs (2028 and the margin), not from the few FDs open
    soft = checks["RLIMIT_NOFILE soft"]
    assert soft["status"] == "FAIL" and soft["recommended"] == ">= 2434" and "its maxconn needs ~2028" in soft["change"]
    assert checks["haproxy strict-limits"]["status"] == "WARN"
    runtime = checks["haproxy CurrConns vs Maxconn"]
    assert runtime["status"] == "OK" and "Ulimit-n 64" in runtime["current"]
    table = subprocess.run([FDTRACE, "doctor", "--pid", str(proc.pid)], capture_output=True, text=True)
    assert table.returncode == 2 and "overall: FAIL" in table.stdout


def test_accept4_emfile_of_haproxy_under_a_connection_storm(
        live_tracer: LiveTracer, haproxy: tuple[subprocess.Popen[str], int, Path]) -> None:
    proc, port, _ = haproxy
    start_ns = time.monotonic_ns()
    clients = []
    for _ in range(120):  # twice what haproxy may hold: its listener meets EMFILE
        client = socket.socket()
        client.settimeout(2)
        try:
            client.connect(("127.0.0.1", port))
        except OSError:
            client.close()
            continue
        clients.append(client)

    def refused() -> bool:
        with live_tracer.lock:
            return any(e["pid"] == proc.pid and e["ts_ns"] >= start_ns and e["kind"] == "accept"
                       and e["errno"] == "EMFILE" for e in live_tracer.events)
    try:  # held open until haproxy's listener has met EMFILE and the tracer has its event
        eventually(refused, "an accept4 of haproxy's failing with EMFILE, traced")
    finally:
        for client in clients:
            client.close()
    with live_tracer.lock:
        events = [e for e in live_tracer.events if e["pid"] == proc.pid and e["ts_ns"] >= start_ns]
        totals = live_tracer.source.read_counters().for_pid(proc.pid)
    accept_emfile = [e for e in events if e["kind"] == "accept" and e["errno"] == "EMFILE"]
    assert accept_emfile and {e["syscall"] for e in accept_emfile} == {"accept4"}
    [instance] = totals
    # The exact counter agrees with the stream (nothing was lost) since the test began.
    assert instance.errors[("accept4", "EMFILE")] >= len(accept_emfile) > 0
    assert live_tracer.losses.get("ringbuf_full", 0) == 0


def test_show_info_samples_land_in_a_recording(haproxy: tuple[subprocess.Popen[str], int, Path],
                                               tmp_path: Path) -> None:
    proc, _, config = haproxy
    stats = str(config.parent / "stats.sock")
    out = tmp_path / "rec"
    result = subprocess.run([FDTRACE, "record", "-o", str(out), "--duration", "2", "--interval", "0.5",
                             "--haproxy-socket", stats, "--haproxy-socket", str(tmp_path / "nobody.sock")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    from fdtrace.analysis import load

    rows = load(out).haproxy
    answered = rows[rows["socket"] == stats]
    assert len(answered) >= 4
    assert set(answered["maxconn"]) == {1000} and set(answered["ulimit_n"]) == {64}
    assert set(answered["haproxy_pid"]) == {proc.pid} and answered["error"].isna().all()
    silent = rows[rows["socket"] == str(tmp_path / "nobody.sock")]
    # one that does not answer is tried again after 2, 4, ... intervals: fewer rows, each saying so
    assert 1 <= len(silent) < len(answered) and silent["error"].notna().all() and silent["maxconn"].isna().all()
    assert silent["error"].str.contains("fdtrace tries again in").all()
    # with no flag, what its configuration demands: read once, as haproxy itself could read it
    # (this haproxy's: others may run on a shared machine, and the recording sees every haproxy)
    [demand] = rows[(rows["source"] == "configuration") & (rows["haproxy_pid"] == proc.pid)].to_dict("records")
    assert (demand["socket"], demand["haproxy_pid"], demand["maxconn"], demand["ulimit_n"]) == \
        (str(config), proc.pid, 1000, 64)
    threads = len(os.sched_getaffinity(proc.pid))  # nbthread not set: one per CPU it may run on
    assert (demand["listeners"], demand["nbthread"], demand["maxsock"]) == (2, threads, 2000 + 3 * threads + 2 + 20)


def fill(pid: int, port: int) -> tuple[list[socket.socket], Any]:
    """Connections through haproxy ``pid`` until fewer than 16 of its 64 descriptors are free
    (each proxied connection takes 2, held for the timeouts' 120 s: a slow, busy machine fills it
    late, not never); the connections and haproxy's last sample."""
    from fdtrace.procfs.sampler import ProcSampler

    samples, clients = ProcSampler(), []
    deadline = time.monotonic() + 90
    while True:
        sample = samples.sample(pid)
        assert sample is not None and sample.open_fds is not None and sample.fd_soft_limit == 64
        if sample.open_fds > 64 - 16:
            return clients, sample
        assert time.monotonic() < deadline, f"haproxy did not fill up: {sample.open_fds} of 64"
        clients.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        time.sleep(0.05)


def test_a_stats_socket_never_answered_names_its_haproxy_not_pid_0(
        haproxy: tuple[subprocess.Popen[str], int, Path]) -> None:
    """Issue 35: a haproxy at its FD limit before fdtrace's first question gave rows with no pid,
    and the live view's line about its socket read "haproxy[0]". The row names the haproxy that
    holds the socket (pid and name, read from /proc), and so does the log line."""
    from fdtrace.integrations.haproxy import HaproxySampler
    from fdtrace.tui.adapters import log_line
    from fdtrace.tui.state import IncidentState

    proc, port, config = haproxy
    stats = str(config.parent / "stats.sock")
    clients, sample = fill(proc.pid, port)
    try:
        sampler = HaproxySampler([stats], interval_s=0.5, timeout=0.5)  # never answered: no Pid of show info
        [row] = sampler.sample_now()
        assert str(row["error"]).startswith(f"not asked while haproxy [{proc.pid}] has")
        assert (row["haproxy_pid"], row["comm"], row["maxconn"]) == (proc.pid, "haproxy", None)
        state = IncidentState()
        state.apply_haproxy([row], 1_000_000_000)
        [said] = [log_line(entry).plain for entry in state.log]
        assert said.startswith(f"00:00:01 haproxy[{proc.pid}] stats socket {stats} not asked while "), said
        assert "[0]" not in said
    finally:
        for client in clients:
            client.close()


def test_the_stats_socket_of_a_haproxy_at_its_fd_limit_is_not_connected_to(
        haproxy: tuple[subprocess.Popen[str], int, Path]) -> None:
    """Issues 25, 34: each stats connection of fdtrace's to a haproxy at its FD limit failed one of
    its accept4 with EMFILE. With haproxy filled to fewer than 16 free of its 64 descriptors, counted
    just before connecting, the sampler does not connect, and says why; once haproxy has room it
    is asked again."""
    from fdtrace.integrations.haproxy import HaproxySampler
    from fdtrace.procfs.sampler import ProcSampler

    proc, port, config = haproxy
    stats = str(config.parent / "stats.sock")
    samples = ProcSampler()
    sampler = HaproxySampler([stats], interval_s=0.5, timeout=0.5)
    [first] = sampler.sample_now()  # answered while it had room: the sampler knows its pid
    assert first["haproxy_pid"] == proc.pid
    clients, sample = fill(proc.pid, port)
    rows = sampler.sample_now() + sampler.sample_now()
    assert [str(r["error"]).split(",")[0] for r in rows] == [
        f"not asked while haproxy [{proc.pid}] has {sample.open_fds} of its 64 descriptors open"] * 2
    for client in clients:
        client.close()
    deadline = time.monotonic() + 30  # each closed after its *-fin timeout (1 s)
    while (room := samples.sample(proc.pid)) is not None and room.open_fds > 64 - 16:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    [answer] = sampler.sample_now()
    assert answer["error"] is None and answer["haproxy_pid"] == proc.pid
