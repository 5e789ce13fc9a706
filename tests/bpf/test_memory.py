"""The OOM half of the HAProxy incident, on a real memory cgroup: a program keeps 100 KiB per
socket it holds in a 150 MiB cgroup until the OOM killer takes it. The samples' memory is the
kernel's own figures, the memory a connection costs is fitted from them, the kill is shown with
its victim's last state, and doctor --from names the limit and the need; a program far from its
limit raises nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fdtrace.analysis import load
from fdtrace.analysis.memory import memory_needs, oom_victims
from tests.conftest import needs_root
from tests.helpers import FDTRACE, memory_cgroup, started

pytestmark = [needs_root(), pytest.mark.bpf]

LIMIT = 150 << 20
PER_SOCKET = 100 * 1024
FIRST = 200  # sockets held while the test compares the samples with the kernel's files

HOARDER = """
import ctypes, os, select, socket, sys, time
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(sys.argv[1].encode()), 0, 0, 0)  # PR_SET_NAME
held = []
def more(n):
    for _ in range(n):
        held.append((socket.socket(), b"\\x01" * PER_SOCKET))  # memset: every page touched
        time.sleep(0.006)  # 16 MiB/s: the recorder's rounds (0.2 s) see it well past 80 % of its limit
more(FIRST)
print(len(held), flush=True)
while not select.select([sys.stdin], [], [], 0.05)[0]:  # still: the test reads the kernel's figures
    try:
        os.close(-1)  # a traced call each round keeps it among the processes sampled, on any host
    except OSError:
        pass
while True:
    more(50)
""".replace("PER_SOCKET", str(PER_SOCKET)).replace("FIRST", str(FIRST))

QUIET = """
import ctypes, socket, sys
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(sys.argv[1].encode()), 0, 0, 0)
held = [socket.socket() for _ in range(20)]
print("ready", flush=True)
sys.stdin.readline()
"""


def rss_kb(pid: int) -> tuple[int, int, int]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return tuple(int(status[name].split()[0]) for name in ("RssAnon", "RssFile", "RssShmem"))  # type: ignore[return-value]


def recorded_samples(out: Path, pid: int, sockets: int, after_ns: int = 0) -> Any:
    """The samples the recording has written of ``pid`` holding ``sockets``, taken after
    ``after_ns`` (CLOCK_MONOTONIC, the samples' ts_ns); waits for two of them."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            samples = load(out).samples
        except Exception:  # a part being renamed into place: read again
            samples = None
        if samples is not None and len(samples):
            mine = samples[(samples["pid"] == pid) & (samples["sockets"] == sockets) & (samples["ts_ns"] > after_ns)]
            if len(mine) >= 2:
                return mine
        time.sleep(0.2)
    raise AssertionError(f"no two samples of pid {pid} with {sockets} sockets in 60 s")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    out = tmp_path_factory.mktemp("memory") / "rec"
    tag = os.getpid() % 100000
    names = {"hoarder": f"hoard-{tag}", "quiet": f"quiet-{tag}"}
    recorder = started([FDTRACE, "record", "-o", str(out), "--interval", "0.2", "--comm", names["hoarder"],
                        "--comm", names["quiet"]], "recording to")
    found: dict[str, Any] = {"out": out, "names": names}
    try:
        with memory_cgroup(LIMIT) as procs, memory_cgroup(1 << 30) as roomy:
            quiet = subprocess.Popen(["sh", "-c", f'echo $$ > {roomy} && exec "$@"', "sh", sys.executable, "-c",
                                      QUIET, names["quiet"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            hoarder = subprocess.Popen(["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", "prlimit",
                                        "--nofile=8192:8192", sys.executable, "-c", HOARDER, names["hoarder"]],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert hoarder.stdout is not None and hoarder.stdin is not None
            assert quiet.stdout is not None and quiet.stdin is not None
            assert quiet.stdout.readline() == "ready\n"
            assert hoarder.stdout.readline() == f"{FIRST}\n"
            group = procs.parent
            usage_file = "memory.current" if (group / "memory.current").exists() else "memory.usage_in_bytes"
            recorded_samples(out, hoarder.pid, FIRST)  # still, its idle loop paged in: its memory stays put
            read_ns = time.monotonic_ns()
            found.update(pid=hoarder.pid, quiet=quiet.pid, rss=rss_kb(hoarder.pid),
                         usage=int((group / usage_file).read_text()))
            found["idle"] = recorded_samples(out, hoarder.pid, FIRST, after_ns=read_ns)
            found["usage_after"] = int((group / usage_file).read_text())
            hoarder.stdin.write("go\n")
            hoarder.stdin.flush()
            found["returncode"] = hoarder.wait(timeout=120)
            quiet.stdin.write("done\n")
            quiet.stdin.flush()
            quiet.wait(timeout=30)
    finally:
        recorder.send_signal(signal.SIGINT)
        _, said = recorder.communicate(timeout=60)
    assert recorder.returncode == 0, said
    yield found


def test_the_samples_hold_the_kernels_figures(recorded: dict[str, Any]) -> None:
    idle = recorded["idle"]
    assert recorded["returncode"] == -signal.SIGKILL
    rss = tuple(int(v) for v in idle[["rss_anon_kb", "rss_file_kb", "rss_shmem_kb"]].iloc[-1])
    kernel = recorded["rss"]
    assert all(abs(mine - theirs) <= 64 for mine, theirs in zip(rss, kernel, strict=True)), (rss, kernel)
    assert rss[0] >= FIRST * PER_SOCKET // 1024  # its 100 KiB per socket are anonymous memory
    assert set(idle["memcg_limit_bytes"]) == {LIMIT}
    usage = int(idle["memcg_usage_bytes"].iloc[-1])
    low, high = sorted((recorded["usage"], recorded["usage_after"]))
    assert low - (1 << 20) <= usage <= high + (1 << 20)  # the kernel's charge batching, at most 1 MiB


def test_the_memory_of_a_connection_and_the_need(recorded: dict[str, Any]) -> None:
    needs = memory_needs(load(recorded["out"]))
    [row] = needs[needs["pid"] == recorded["pid"]].to_dict("records")
    assert abs(row["per_connection"] - PER_SOCKET) <= 0.2 * PER_SOCKET, row
    assert row["memcg_limit_bytes"] == LIMIT and row["usage"] >= 0.95
    assert "its cgroup allows 150 MiB" in row["basis"] and "raise MemoryMax=" in row["change"]
    [quiet] = needs[needs["pid"] == recorded["quiet"]].to_dict("records")
    assert quiet["usage"] < 0.1 and not quiet["change"]


def test_the_kill_with_its_victims_last_state(recorded: dict[str, Any]) -> None:
    victims = oom_victims(load(recorded["out"]))
    [victim] = victims[victims["pid"] == recorded["pid"]].to_dict("records")
    assert victim["sockets"] > 1000 and victim["memcg_limit_bytes"] == LIMIT and victim["foreseen"]
    assert f"{int(victim['sockets']):,} sockets" in victim["last_state"]
    assert "of 150 MiB" in victim["last_state"] and "foreseen" in victim["last_state"]
    shown = subprocess.run([FDTRACE, "info", str(recorded["out"])], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert victim["last_state"] in shown.stdout


def test_doctor_from_names_the_limit_and_the_need(recorded: dict[str, Any]) -> None:
    doctor = subprocess.run([FDTRACE, "doctor", "--comm", recorded["names"]["hoarder"], "--from",
                             str(recorded["out"]), "--json"], capture_output=True, text=True, timeout=120)
    checks = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "memory cgroup"]
    assert len(checks) == 1 and checks[0]["status"] == "FAIL", checks
    assert "of 150 MiB" in checks[0]["current"] and "OOM-killed" in checks[0]["current"]
    assert "needs about" in checks[0]["current"] and "MemoryMax=" in checks[0]["change"]
    quiet = subprocess.run([FDTRACE, "doctor", "--comm", recorded["names"]["quiet"], "--from",
                            str(recorded["out"]), "--json"], capture_output=True, text=True, timeout=120)
    assert all(c["status"] == "OK" for c in json.loads(quiet.stdout)["checks"] if c["name"] == "memory cgroup")


def test_the_report_has_the_same_advice_and_the_kill(recorded: dict[str, Any], tmp_path: Path) -> None:
    from fdtrace.analysis.memory import memory_advice_lines
    from fdtrace.analysis.report import build
    from fdtrace.analysis.report.charts import panels_of

    rec = load(recorded["out"])
    report = build(rec)
    # this test's own processes: a concurrent run's hoarder on the host is recorded too
    lines = memory_advice_lines(memory_needs(rec), oom_victims(rec))
    [advice] = [line for line in lines if f"{recorded['names']['hoarder']} [" in line]
    assert not [line for line in lines if recorded["names"]["quiet"] in line]  # the quiet one has nothing to change
    assert advice in report.recommendations
    assert any(title.startswith("Memory of the processes") for title in panels_of(report))
    page = tmp_path / "report.md"
    made = subprocess.run([FDTRACE, "report", str(recorded["out"]), "-o", str(page)], capture_output=True, text=True,
                          timeout=300)
    assert made.returncode == 0, made.stderr
    text = page.read_text()
    assert "## Memory headroom and OOM kills" in text and "foreseen (fdtrace showed it at its cgroup" in text


def test_the_oom_kill_is_counted_once_its_sigkill_is_no_crash(recorded: dict[str, Any]) -> None:
    """Issue 35: the OOM killer's victim ends by SIGKILL; that end is the kill's, not a crash of
    its own. failures(), incidents(), info's headline and the report's incidents count the
    victim once, as an OOM kill; the recording holds both events (the join is by pid and time)."""
    from fdtrace.analysis import failures, incidents
    from fdtrace.analysis.report import build
    from fdtrace.schema.failures import incident_mask

    rec, pid, name = load(recorded["out"]), recorded["pid"], recorded["names"]["hoarder"]
    events = rec.events
    mine = events[events["pid"] == pid]
    [kill] = mine[mine["kind"] == "oom_kill"]["ts_ns"]
    [end] = mine[mine["kind"] == "process_exit"].to_dict("records")
    assert end["signal"] == "SIGKILL" and kill <= end["ts_ns"]  # both there: the join has work to do
    listed = failures(rec)
    assert list(listed[listed["pid"] == pid]["failure"]) == ["OOM kill"]
    for found in (incidents(rec), build(rec).incidents):
        assert [(r.severity, r.failure, r.count) for r in found[found["comm"] == name].itertuples()] == \
            [("OOM kill", "OOM kill", 1)]
    import pyarrow as pa
    table = pa.Table.from_pandas(mine[["ts_ns", "pid", "kind", "errno", "signal", "exit_code"]], preserve_index=False)
    assert [k for k, hit in zip(mine["kind"], incident_mask(table, exits=True).to_pylist(), strict=True) if hit] == \
        ["oom_kill"]  # replay's n/N, the flight recorder and the metrics: one incident
    shown = subprocess.run([FDTRACE, "info", str(recorded["out"])], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    wrong = shown.stdout.split("what to change:")[0]  # the headline: what went wrong
    said = [line for line in wrong.splitlines() if f"[{pid}]:" in line]
    assert len(said) == 1 and "OOM-killed at" in said[0], shown.stdout
    assert "SIGKILL" not in shown.stdout


def test_one_memory_figure_in_doctor_the_report_and_the_live_view(recorded: dict[str, Any], tmp_path: Path) -> None:
    """The advice layer's one MemoryMax change (advice.memory.memory_change) is what doctor --from,
    the Markdown report and the live view's detail (replaying the recording) say: the same
    connections, need, value and words."""
    from fdtrace.advice.change import Change
    from fdtrace.advice.memory import memory_max
    from fdtrace.display import markdown_shown
    from tests.helpers import replayed_detail

    out, pid = recorded["out"], recorded["pid"]
    [row] = memory_needs(load(out)).query(f"pid == {pid}").to_dict("records")
    change = row["advice"]
    assert isinstance(change, Change) and change.resource == "MemoryMax" and change.value > LIMIT, row
    assert f"to {memory_max(change.value)}" in change.command and change.reason == row["basis"]
    assert row["basis"].startswith(f"at {int(row['connections']):,} connections (the FD limit recommended for it)")

    doctor = subprocess.run([FDTRACE, "doctor", "--pid", str(pid), "--from", str(out), "--json"],
                            capture_output=True, text=True, timeout=120)
    [check] = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "memory cgroup"]
    assert check["recommended"] == f"MemoryMax >= {memory_max(change.value)}", check
    assert check["change"] == change.command and row["basis"] in check["current"], check

    page = tmp_path / "report.md"
    made = subprocess.run([FDTRACE, "report", str(out), "-o", str(page)], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    hoarder = f"- memory of {recorded['names']['hoarder']}"
    [line] = [line for line in page.read_text().splitlines() if line.startswith(hoarder)]
    assert markdown_shown(f"; {row['basis']}; {change.command}.") in line, line

    text = replayed_detail(out, pid)
    assert " ".join(row["basis"].split()) in text, text
    assert "what to change (memory): " + " ".join(change.command.split()) in text, text
