"""`fdtrace record` with real probes, then `fdtrace.analysis.load` and `fdtrace info`."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from fdtrace.analysis import destinations, headroom, load, rates
from fdtrace.schema import SCHEMA_VERSION
from tests.bpf.test_cli_trace import FDTRACE, WAIT_THEN
from tests.conftest import python_child
from tests.helpers import exit_recorded, pids_cgroup, wait_recorded

pytestmark = pytest.mark.bpf

HOLD_FDS = WAIT_THEN + """
import os, socket, time
socks = [socket.socket() for _ in range(5)]
files = []
while True:
    try: files.append(os.open("/dev/null", os.O_RDONLY))
    except OSError: break
for _ in range(2):
    try: socket.socket()
    except OSError: pass
print("full", flush=True)
sys.stdin.readline()
"""


THREADS = WAIT_THEN + """
import os, threading
stop = threading.Event()
workers = [threading.Thread(target=stop.wait) for _ in range(11)]
for worker in workers:
    worker.start()
print("started", flush=True)
sys.stdin.readline()
os._exit(0)
"""


def start_recorder(out: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    proc = subprocess.Popen([*prefix, FDTRACE, "record", "-o", str(out), *args], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    while line and "recording to" not in line:
        line = proc.stderr.readline()
    assert line, proc.communicate()
    return proc


def test_recording_holds_exact_counts_samples_and_metadata(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    child = subprocess.Popen(["prlimit", "--nofile=64:64", *python_child(HOLD_FDS)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    recorder = start_recorder(out, "--interval", "0.5")
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline() == "full\n"

    def held(rec: Any) -> bool:  # two rounds' samples of it at its limit, with its sockets
        samples = rec.samples[rec.samples["pid"] == child.pid]
        return len(samples[(samples["open_fds"] == 64) & (samples["sockets"] == 5)]) >= 2
    wait_recorded(out, held, "two samples of the child at its limit")
    child.communicate("stop\n", timeout=30)
    exit_recorded(out, child.pid)
    recorder.send_signal(signal.SIGINT)
    _, err = recorder.communicate(timeout=30)
    assert recorder.returncode == 0, err

    rec = load(out)
    assert rec.skipped == []
    events = rec.events[rec.events["pid"] == child.pid]
    assert len(events[(events["kind"] == "socket") & (events["errno"] == "")]) == 5
    assert len(events[(events["kind"] == "socket") & (events["errno"] == "EMFILE")]) == 2
    assert len(events[(events["kind"] == "fd_error") & (events["syscall"] == "openat")]) == 1
    assert str(rec.events["time"].dtype) == "datetime64[ns, UTC]" and str(rec.events["ts_ns"].dtype) == "int64"
    assert str(rec.events["kind"].dtype) == "category" and str(rec.events["comm"].dtype) == "category"

    samples = rec.samples[rec.samples["pid"] == child.pid]
    assert len(samples) >= 2
    assert samples["open_fds"].max() == 64 and (samples["fd_soft_limit"] == 64).all()
    assert samples["sockets"].max() == 5
    assert "cmdline" not in rec.samples.columns

    [counts] = rec.counters[rec.counters["pid"] == child.pid].groupby("first_ts").tail(1).to_dict("records")
    assert counts["sockets"] == 7 and counts["socket_errors"] == 2 and counts["other_fd_call_errors"] == 1

    [(host, meta)] = rec.meta.items()
    assert meta["schema_version"] == SCHEMA_VERSION and meta["complete"] is True and meta["boot_id"]
    assert "syscalls:sys_exit_accept4" in meta["probes_attached"] and meta["kernel"]
    assert len(rec.clock) >= 2 and rec.clock["realtime_offset_ns"].gt(0).all()
    assert rec.system["file_max"].gt(0).all() and rec.system["file_nr"].gt(0).all()
    assert (rec.losses[["ringbuf_full", "counters_full"]].sum() == 0).all()
    for path in out.rglob("*.parquet"):
        assert path.stat().st_mode & 0o077 == 0, path

    summary = subprocess.run([FDTRACE, "info", str(out)], capture_output=True, text=True, check=True).stdout
    assert f"host {host}:" in summary and "complete" in summary
    assert f"pid {child.pid} python: 64 open of 64 (100%, headroom 0)" in summary.replace(
        Path(sys.executable).name, "python")


def test_sigkill_loses_at_most_about_the_last_second(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    child = subprocess.Popen(python_child(  # a socket every ~2 ms until its stdin closes
        WAIT_THEN + "import select, socket, time\n"
        "while not select.select([sys.stdin], [], [], 0)[0]:\n    socket.socket().close()\n    time.sleep(0.002)\n"
    ), stdin=subprocess.PIPE, text=True)
    recorder = start_recorder(out)
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    # killed in the middle of the run: once some flushed seconds of it are on disk
    wait_recorded(out, lambda rec: ((rec.events["pid"] == child.pid) & (rec.events["kind"] == "socket")).sum() > 100
                  and len(rec.clock) >= 2, "a second of the child's sockets recorded")
    killed_at = time.monotonic_ns()
    recorder.kill()
    recorder.communicate()
    child.stdin.close()
    child.wait(timeout=30)

    rec = load(out)
    assert rec.skipped == []
    mine = rec.events[(rec.events["pid"] == child.pid) & (rec.events["kind"] == "socket")]
    assert len(mine) > 100
    assert killed_at - mine["ts_ns"].max() < 1_500_000_000
    gaps = mine["ts_ns"].diff().dropna()
    assert gaps.max() < 200_000_000  # nothing missing in the middle: every flushed second is there
    assert rec.meta[next(iter(rec.meta))]["complete"] is False


def test_flood_shows_losses_and_counters_stay_exact(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    n = 20000
    child = subprocess.Popen(
        python_child(WAIT_THEN + f"import socket\nfor _ in range({n}):\n    socket.socket().close()\n"),
        stdin=subprocess.PIPE, text=True)
    recorder = start_recorder(out, "--ring-pages", "1", "--pid", str(child.pid), "--interval", "0.3")
    child.communicate("go\n", timeout=60)
    wait_recorded(out, lambda rec: bool((rec.counters[rec.counters["pid"] == child.pid]["sockets"] == n).any()),
                  "the kernel's count of the child's sockets recorded")
    recorder.send_signal(signal.SIGTERM)
    recorder.communicate(timeout=30)
    rec = load(out)
    assert rec.losses["ringbuf_full"].sum() > 0
    assert rec.losses["ringbuf_full"].sum() == rec.losses["ringbuf_full_total"].max()
    final = rec.counters[rec.counters["pid"] == child.pid].iloc[-1]
    assert final["sockets"] == n
    assert (rec.events["kind"] == "socket").sum() < n


def test_truncated_part_is_skipped_and_named(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    subprocess.run([FDTRACE, "record", "-o", str(out), "--duration", "2.5", "--interval", "0.5"],
                   check=True, capture_output=True)
    parts = sorted((out / "system").rglob("part-*.parquet"))
    assert len(parts) >= 3
    whole = sum(pq.read_metadata(p).num_rows for p in parts)
    lost = pq.read_metadata(parts[1]).num_rows
    parts[1].write_bytes(parts[1].read_bytes()[:40])
    rec = load(out)
    assert len(rec.system) == whole - lost
    assert len(rec.skipped) == 1 and str(parts[1]) in rec.skipped[0]
    result = subprocess.run([FDTRACE, "info", str(out)], capture_output=True, text=True)
    assert result.returncode == 0 and "skipped unreadable files:" in result.stdout


def test_rotate_merges_files_and_max_size_caps_the_recording(tmp_path: Path) -> None:
    rotated = tmp_path / "rotated"
    subprocess.run([FDTRACE, "record", "-o", str(rotated), "--duration", "2.6", "--interval", "0.2",
                    "--rotate", "1"], check=True, capture_output=True)
    for table in ("system", "clock", "losses"):
        names = [p.name for p in (rotated / table).rglob("part-*.parquet")]
        # merged each second (less often when rounds run late, on a busy host), and at the stop: what the
        # last update brought is flushed before that last merge, so no part is left unmerged
        unmerged = [n for n in names if "-" not in n.removeprefix("part-")]
        assert 1 <= len(names) <= 4 and unmerged == [], names
    rec = load(rotated)
    # one clock row and one losses row each round: merging lost none of either (under load a round
    # can take longer than --interval, so their number is not fixed)
    assert len(rec.clock) >= 4 and rec.clock["ts_ns"].is_monotonic_increasing
    assert sorted(rec.clock["ts_ns"]) == sorted(rec.losses["ts_ns"])

    capped = tmp_path / "capped"
    result = subprocess.run([FDTRACE, "record", "-o", str(capped), "--duration", "3", "--interval", "0.1",
                             "--max-size", "40K"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    size = sum(p.stat().st_size for p in capped.rglob("*.parquet"))
    [meta] = load(capped).meta.values()
    # an EMFILE of any process on a busy host opens an incident window, kept besides --max-size
    kept = meta["keep_incidents"] if meta["incident_windows"] else 0
    # the newest file of each table always stays: a cap below them all keeps just them
    newest = sum(max(folder.glob("part-*.parquet")).stat().st_size
                 for folder in capped.glob("*/host=*") if any(folder.glob("part-*.parquet")))
    assert size <= max(40 << 10, newest) + kept, (size, newest, meta["incident_windows"])
    assert meta["rotated_out"]["files"] > 0 and meta["rotated_out"]["rows"]["clock"] > 0
    summary = subprocess.run([FDTRACE, "info", str(capped)], capture_output=True, text=True, check=True).stdout
    assert "rotated out (--max-size):" in summary


def test_full_disk_stops_with_one_line_and_keeps_what_was_written(tmp_path: Path) -> None:
    disk = tmp_path / "small"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        result = subprocess.run([FDTRACE, "record", "-o", str(disk / "rec"), "--duration", "30",
                                 "--interval", "0.1", "--top", "200"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 1
        error_lines = [line for line in result.stderr.splitlines() if "error" in line]
        assert len(error_lines) == 1 and "disk full: recording stopped" in error_lines[0], result.stderr
        assert "Traceback" not in result.stderr
        rec = load(disk / "rec")
        assert len(rec.system) > 0 and rec.skipped == []
        assert not list((disk / "rec").rglob("*.tmp"))
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def settled_samples(out: Path, pid: int) -> pd.DataFrame:
    """The recording's samples of PID taken once all its 12 threads ran."""
    series = headroom(load(out))
    mine = series[series["pid"] == pid]
    return mine[mine["threads"] == 12]


def test_thread_headroom_against_the_cgroups_pids_max(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    with pids_cgroup(limit=20) as procs:
        child = subprocess.Popen(python_child(THREADS), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdin is not None and child.stdout is not None
        procs.write_text(str(child.pid))
        recorder = start_recorder(out, "--interval", "0.5", "--pid", str(child.pid))
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "started\n"
        deadline = time.monotonic() + 60  # the recorder flushes each round: wait for three rounds on disk
        while len(settled_samples(out, child.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        child.communicate("stop\n", timeout=30)
        recorder.send_signal(signal.SIGINT)
        _, err = recorder.communicate(timeout=30)
        assert recorder.returncode == 0, err
    settled = settled_samples(out, child.pid)
    # The child is alone in its cgroup: the cgroup's tasks are its threads, 20 allowed, and
    # pids.max leaves less room than RLIMIT_NPROC (root is exempt) or threads-max. A sample read
    # while threads start sees them in the cgroup first, one read as it exits may not see the
    # cgroup: once all 12 run, it is exact.
    assert len(settled) >= 3
    assert (settled["thread_limit_kind"] == "cgroup pids.max").all() and (settled["thread_limit"] == 20).all()
    assert (settled["thread_count"] == 12).all() and (settled["thread_headroom"] == 8).all()
    assert (settled["thread_usage"] == 0.6).all()
    summary = subprocess.run([FDTRACE, "info", str(out)], capture_output=True, text=True, check=True).stdout
    assert any(line.strip().startswith(f"pid {child.pid} ") and "12 of 20 (cgroup pids.max, 60%)" in line
               for line in summary.split("least thread headroom:")[1].splitlines())


SOCKETS = WAIT_THEN + """
import socket
held = [socket.socket() for _ in range(6)]
"""


def test_two_hosts_side_by_side_on_one_wall_clock_timeline(tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    child = subprocess.Popen(python_child(SOCKETS), stdin=subprocess.PIPE, text=True)
    recorders = [start_recorder(here, "--pid", str(child.pid)),
                 # another host name, in a UTS namespace of its own
                 start_recorder(there, "--pid", str(child.pid),
                                prefix=("unshare", "--uts", "sh", "-c", 'hostname fdtrace-other && exec "$0" "$@"'))]
    child.communicate("go\n", timeout=30)
    for folder in (here, there):
        exit_recorded(folder, child.pid)
    for recorder in recorders:
        recorder.send_signal(signal.SIGINT)
        _, err = recorder.communicate(timeout=30)
        assert recorder.returncode == 0, err

    both = load([here, there])
    host = socket.gethostname()
    assert sorted(both.meta) == sorted([host, "fdtrace-other"])
    sockets = both.events[(both.events["pid"] == child.pid) & (both.events["kind"] == "socket")]
    assert sockets.groupby("host", observed=True).size().to_dict() == {host: 6, "fdtrace-other": 6}
    assert both.events["time"].is_monotonic_increasing
    # The same calls, seen by both: each host's clock offsets put them at the same wall time.
    times = [sockets[sockets["host"] == name]["time"].astype("int64").to_numpy() for name in (host, "fdtrace-other")]
    assert (abs(times[0] - times[1]) < 1_000_000).all()
    per_host = rates(sockets, kind="socket", by="host")
    assert per_host.sum().to_dict() == {host: 6, "fdtrace-other": 6}

    # Side by side in one folder, as a fleet's recordings are gathered: the same dataset.
    shutil.copytree(there, here, dirs_exist_ok=True)
    merged = load(here)
    assert sorted(merged.meta) == sorted(both.meta) and len(merged.events) == len(both.events)
    summary = subprocess.run([FDTRACE, "info", str(here)], capture_output=True, text=True, check=True).stdout
    assert f"host {host}:" in summary and "host fdtrace-other:" in summary


CONNECTS = WAIT_THEN + """
import socket
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(8)
spare = socket.socket()
spare.bind(("127.0.0.1", 0))
refused = spare.getsockname()[1]
spare.close()
held = []
for _ in range(3):
    held.append(socket.create_connection(listener.getsockname()))
for _ in range(2):
    try:
        socket.create_connection(("127.0.0.1", refused))
    except ConnectionRefusedError:
        pass
print(listener.getsockname()[1], refused)
"""


def test_connect_destinations_in_the_recording_and_the_report(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    child = subprocess.Popen(python_child(CONNECTS), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    recorder = start_recorder(out, "--pid", str(child.pid))
    printed, _ = child.communicate("go\n", timeout=30)
    exit_recorded(out, child.pid)
    recorder.send_signal(signal.SIGINT)
    _, err = recorder.communicate(timeout=30)
    assert recorder.returncode == 0, err
    port, refused = map(int, printed.split())
    found = destinations(load(out))
    rows = {(r.peer_addr, r.peer_port): r for r in found.itertuples()}
    assert set(rows) == {("127.0.0.1", port), ("127.0.0.1", refused)}
    assert (rows[("127.0.0.1", port)].calls, rows[("127.0.0.1", port)].failed) == (3, 0)
    assert (rows[("127.0.0.1", refused)].calls, rows[("127.0.0.1", refused)].failed) == (2, 2)
    assert rows[("127.0.0.1", refused)].errors == {"ECONNREFUSED": 2}
    assert found.iloc[0]["peer_port"] == refused  # most failures first
    report = tmp_path / "report.md"
    subprocess.run([FDTRACE, "report", str(out), "-o", str(report)], check=True, capture_output=True)
    assert f"| 127.0.0.1 | {refused} | 2 | 2 |" in report.read_text().replace("  ", " ")
    summary = subprocess.run([FDTRACE, "info", str(out)], capture_output=True, text=True, check=True).stdout
    assert f"-> 127.0.0.1:{refused}: 2 of 2 failed (ECONNREFUSED 2)" in summary
