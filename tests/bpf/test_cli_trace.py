"""`fdtrace trace` end to end: filters, summary, losses, limits and the errors users meet."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import python_child
from tests.helpers import FDTRACE

pytestmark = pytest.mark.bpf
SUMMARY = re.compile(r"^fdtrace: (\d+) events \((.*)\); lost (\d+)(?: \((.*)\))?$")

WAIT_THEN = "import sys\nsys.stdin.readline()\n"


def start_tracer(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*prefix, FDTRACE, "trace", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    while line and "tracing (" not in line:
        line = proc.stderr.readline()
    assert line, f"tracer did not start: {proc.communicate()}"
    return proc


def stop_tracer(proc: subprocess.Popen[str]) -> tuple[list[dict], list[str]]:
    """Stop the tracer and read what it wrote. Its last poll drains the ring buffer, so every event
    of a process that has exited (communicate() returned) is printed: no wait is needed before."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()], err.strip().splitlines()


def test_pid_filter_errors_only_and_summary() -> None:
    child = subprocess.Popen(
        ["prlimit", "--nofile=32:32", *python_child(WAIT_THEN + (
            "import os, socket, threading\n"
            "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
            "socks = [socket.socket() for _ in range(4)]\n"
            "[s.close() for s in socks]\n"
            "while True:\n"
            "    try: os.open('/dev/null', os.O_RDONLY)\n"
            "    except OSError: break\n"
            "for _ in range(2):\n"
            "    try: socket.socket()\n"
            "    except OSError: pass\n"
        ))],
        stdin=subprocess.PIPE, text=True,
    )
    other = subprocess.Popen(python_child(WAIT_THEN + "import socket\nsocket.socket().close()\n"),
                             stdin=subprocess.PIPE, text=True)
    tracer = start_tracer("--pid", str(child.pid), "--errors-only")
    child.communicate("go\n", timeout=30)
    other.communicate("go\n", timeout=30)
    events, stderr = stop_tracer(tracer)
    assert {e["pid"] for e in events} == {child.pid}
    assert [(e["kind"], e["syscall"], e["errno"]) for e in events] == [
        ("fd_error", "openat", "EMFILE"), ("socket", "socket", "EMFILE"), ("socket", "socket", "EMFILE"),
    ]
    match = SUMMARY.match(stderr[-1])
    assert match, stderr
    assert match.group(1) == "3" and match.group(2) == "fd_error 1, socket 2" and match.group(3) == "0"


GRANDCHILD = "import socket\nheld = [socket.socket() for _ in range(3)]\nprint(__import__('os').getpid())\n"
SPAWNER = WAIT_THEN + f"""
import socket, subprocess, sys
held = [socket.socket() for _ in range(2)]
child = subprocess.run([sys.executable, "-S", "-c", {GRANDCHILD!r}], capture_output=True, text=True)
print(child.stdout.strip(), flush=True)
"""


@pytest.mark.parametrize("follow", [True, False])
def test_follow_traces_the_processes_a_traced_one_starts(follow: bool) -> None:
    parent = subprocess.Popen(python_child(SPAWNER), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    tracer = start_tracer("--pid", str(parent.pid), *(["--follow"] if follow else []))
    out, _ = parent.communicate("go\n", timeout=30)
    events, _ = stop_tracer(tracer)
    grandchild = int(out)
    sockets = [e["pid"] for e in events if e["kind"] == "socket" and e["errno"] == ""]
    assert sockets.count(parent.pid) == 2
    assert sockets.count(grandchild) == (3 if follow else 0)
    started = [e for e in events if e["kind"] == "process_start"]
    assert [e["pid"] for e in started] == [grandchild] and started[0]["ppid"] == parent.pid  # either way
    exits = {e["pid"] for e in events if e["kind"] == "process_exit"}
    assert exits == ({grandchild, parent.pid} if follow else {parent.pid})


def test_follow_needs_a_pid() -> None:
    result = subprocess.run([FDTRACE, "trace", "--follow", "--duration", "1"], capture_output=True, text=True)
    assert result.returncode != 0 and result.stderr.strip() == (
        "fdtrace: error: --follow follows the processes of --pid: give at least one")


def test_ring_buffer_overflow_is_counted_and_counters_stay_exact(tmp_path: Path) -> None:
    totals_path = tmp_path / "totals.json"
    n = 20000
    child = subprocess.Popen(
        python_child(WAIT_THEN + f"import socket\nfor _ in range({n}):\n    socket.socket().close()\n"),
        stdin=subprocess.PIPE, text=True,
    )
    tracer = start_tracer("--pid", str(child.pid), "--ring-pages", "1", "--totals", str(totals_path))
    child.communicate("go\n", timeout=60)
    events, stderr = stop_tracer(tracer)
    match = SUMMARY.match(stderr[-1])
    assert match, stderr
    lost = int(match.group(3))
    assert lost > 0 and f"ringbuf_full {lost}" in match.group(4)
    assert int(match.group(1)) == len(events) < 2 * n
    [totals] = [t for t in json.loads(totals_path.read_text()) if t["pid"] == child.pid]
    assert totals["sockets"] == n and totals["socket_errors"] == 0
    assert totals["closes"] >= n
    sockets_seen = sum(1 for e in events if e["kind"] == "socket")
    assert sockets_seen < n


def test_tracer_raises_its_own_fd_limit_and_ends_on_duration() -> None:
    proc = start_tracer("--duration", "3", prefix=("prlimit", "--nofile=256:4096"))
    limits = Path(f"/proc/{proc.pid}/limits").read_text()
    [line] = [row for row in limits.splitlines() if row.startswith("Max open files")]
    assert line.split()[3:5] == ["4096", "4096"]
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and SUMMARY.match(err.strip().splitlines()[-1])


def run_fdtrace(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


def assert_one_line_error(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fdtrace: error: "), result.stderr
    assert text in lines[0] and "Traceback" not in result.stderr


def test_unprivileged_user_gets_one_line() -> None:
    result = run_fdtrace(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                          FDTRACE, "trace", "--duration", "1"])
    assert_one_line_error(result, "needs root, or CAP_BPF and CAP_PERFMON")
    assert result.returncode == 77


def test_bcc_not_importable_says_how_to_install() -> None:
    code = ("import sys; sys.modules['bcc'] = None; sys.argv = ['fdtrace', 'trace', '--duration', '1'];"
            "from fdtrace.cli import main; main()")
    result = run_fdtrace([sys.executable, "-c", code])
    assert_one_line_error(result, "python3-bpfcc")


def test_missing_kernel_headers_say_how_to_link_them() -> None:
    result = run_fdtrace(["unshare", "-m", "sh", "-c",
                          f"mount -t tmpfs tmpfs /lib/modules && exec {FDTRACE} trace --duration 1"])
    assert_one_line_error(result, "no kernel headers for")


def test_unmounted_tracefs_is_mounted_or_explained() -> None:
    result = run_fdtrace(["unshare", "-m", "sh", "-c",
                          f"umount /sys/kernel/tracing && exec {FDTRACE} trace --duration 0.5"])
    assert result.returncode == 0, result.stderr
    assert "fdtrace: tracefs was not mounted: mounted it at /sys/kernel/tracing" in result.stderr
    if shutil.which("capsh") is None:
        pytest.skip("capsh is not installed")
    result = run_fdtrace(["unshare", "-m", "sh", "-c",
                          "umount /sys/kernel/tracing && exec capsh --drop=cap_sys_admin -- -c "
                          f"'exec {FDTRACE} trace --duration 0.5'"])
    assert_one_line_error(result, "tracefs is not mounted at /sys/kernel/tracing")
    assert "mount -t tracefs tracefs /sys/kernel/tracing" in result.stderr


def test_kernel_without_a_tracepoint_runs_without_it(tmp_path: Path) -> None:
    formats = tmp_path / "events"
    for category in ("syscalls", "task", "sched", "signal"):  # every category but oom
        for event in Path("/sys/kernel/tracing/events", category).iterdir():
            if (event / "format").exists():
                (formats / category / event.name).mkdir(parents=True)
                shutil.copyfile(event / "format", formats / category / event.name / "format")
    env = {**os.environ, "FDTRACE_TRACEFS_FORMATS": str(formats)}
    result = run_fdtrace([FDTRACE, "trace", "--duration", "0.5"], env=env)
    assert result.returncode == 0, result.stderr
    assert "fdtrace: running without probes this kernel lacks: oom:mark_victim" in result.stderr


def test_comm_filter_keeps_only_that_task_name() -> None:
    bad_close = "import os\ntry: os.close(999)\nexcept OSError: pass\n"
    renamed = subprocess.Popen(
        python_child(WAIT_THEN + "open('/proc/self/comm', 'w').write('fdt-comm-test')\n" + bad_close),
        stdin=subprocess.PIPE, text=True)
    plain = subprocess.Popen(python_child(WAIT_THEN + bad_close), stdin=subprocess.PIPE, text=True)
    tracer = start_tracer("--comm", "fdt-comm-test", "--errors-only")
    renamed.communicate("go\n", timeout=30)
    plain.communicate("go\n", timeout=30)
    events, stderr = stop_tracer(tracer)
    assert [(e["pid"], e["kind"], e["errno"], e["fd"]) for e in events] == [(renamed.pid, "close", "EBADF", None)]
    match = SUMMARY.match(stderr[-1])
    assert match and match.group(1) == "1" and match.group(2) == "close 1"


def test_summary_table_gives_each_processes_exact_counts() -> None:
    child = subprocess.Popen(
        ["prlimit", "--nofile=16:16", *python_child(WAIT_THEN + (
            "import socket\nsocks = [socket.socket() for _ in range(5)]\n[s.close() for s in socks]\n"
            "held = []\n"
            "while True:\n"
            "    try: held.append(socket.socket())\n"
            "    except OSError: break\n"
        ))], stdin=subprocess.PIPE, text=True)
    tracer = start_tracer("--pid", str(child.pid), "--json", "-s")
    child.communicate("go\n", timeout=30)
    events, stderr = stop_tracer(tracer)
    [row] = [line.split() for line in stderr if line.split()[:1] == [str(child.pid)]]
    sockets, accepts, connects, closes = (int(v) for v in row[2:6])
    assert sockets == sum(e["kind"] == "socket" for e in events) >= 7  # 5, then until the 16th FD, then EMFILE
    assert closes == sum(e["kind"] == "close" for e in events) >= 5
    assert (accepts, connects) == (0, 0)
    assert row[7:] == ["socket", "EMFILE", "1"]
