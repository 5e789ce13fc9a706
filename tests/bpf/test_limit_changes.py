"""A limit that changed is seen: a program started with 20000 descriptors lowers its own limit to
64 and fails with EMFILE; another one has it lowered from outside by `prlimit --pid`. Both are
judged by the 64 in force when they failed, and the source of that limit is named from what
was traced, in doctor --from and the report alike."""

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
from fdtrace.analysis.needs import fd_needs
from fdtrace.policy import with_margin
from tests.conftest import needs_root
from tests.helpers import FDTRACE, started

pytestmark = [needs_root(), pytest.mark.bpf]

LOWERED = 64
REFUSED = 5

PROGRAM = """
import ctypes, resource, socket, sys
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(sys.argv[1].encode()), 0, 0, 0)  # PR_SET_NAME
held = [socket.socket() for _ in range(20)]  # room to spare under 20000
print("ready", flush=True)
if sys.argv[2] == "itself":
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOWERED, 20000))
else:
    sys.stdin.readline()  # the test lowers it from outside meanwhile
refused = 0
while refused < REFUSED:
    try:
        held.append(socket.socket())
    except OSError as exc:
        assert exc.errno == 24, exc
        refused += 1
print(refused, flush=True)
if sys.argv[2] == "stays":
    sys.stdin.readline()  # alive for a live doctor, until the test lets it go
""".replace("LOWERED", str(LOWERED)).replace("REFUSED", str(REFUSED))


FAMILY = """
import ctypes, os, resource, socket, sys
name = lambda text: ctypes.CDLL(None).prctl(15, ctypes.c_char_p(text.encode()), 0, 0, 0)  # PR_SET_NAME
name(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (300, 20000))
child = os.fork()
if child == 0:
    name(sys.argv[2])
    held = [socket.socket() for _ in range(10)]
    sys.stdin.readline()  # alive until the test has seen it sampled: its limit is in the recording
    os._exit(0)
print(os.getpid(), child, flush=True)
os.waitpid(child, 0)
"""


def sampled(out: Path, pid: int) -> None:
    """Wait until the recording holds a sample of ``pid`` (a part being renamed is read again)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if (load(out).samples["pid"] == pid).any():
                return
        except Exception:  # noqa: BLE001 - a part renamed into place while listed
            pass
        time.sleep(0.1)
    raise AssertionError(f"no sample of pid {pid} in 60 s")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    out = tmp_path_factory.mktemp("limits") / "rec"
    tag = os.getpid() % 100000
    names = {"itself": f"lowers-{tag}", "outside": f"lowered-{tag}"}
    recorder = started([FDTRACE, "record", "-o", str(out), "--interval", "0.3"], "recording to")
    pids: dict[str, int] = {}
    staying: subprocess.Popen[str] | None = None
    try:
        # one more lowered from outside that is still running when doctor looks
        staying = subprocess.Popen(["prlimit", "--nofile=20000:20000", sys.executable, "-c", PROGRAM,
                                    f"stays-{tag}", "stays"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert staying.stdout is not None and staying.stdin is not None
        assert staying.stdout.readline() == "ready\n"
        subprocess.run(["prlimit", "--pid", str(staying.pid), f"--nofile={LOWERED}:20000"], check=True, timeout=30)
        staying.stdin.write("go\n")
        staying.stdin.flush()
        assert staying.stdout.readline() == f"{REFUSED}\n"
        for how, name in names.items():
            program = subprocess.Popen(["prlimit", "--nofile=20000:20000", sys.executable, "-c", PROGRAM, name, how],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert program.stdout is not None and program.stdin is not None
            assert program.stdout.readline() == "ready\n"
            pids[how] = program.pid
            if how == "outside":
                lowering = subprocess.run(["prlimit", "--pid", str(program.pid), f"--nofile={LOWERED}:20000"],
                                          check=True, timeout=30)
                assert lowering.returncode == 0
                program.stdin.write("go\n")
                program.stdin.flush()
            assert program.stdout.readline() == f"{REFUSED}\n"
            program.wait(timeout=30)
        family = subprocess.Popen(["prlimit", "--nofile=20000:20000", sys.executable, "-c", FAMILY, f"parent-{tag}",
                                   f"child-{tag}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert family.stdout is not None and family.stdin is not None
        parent, child = map(int, family.stdout.readline().split())
        sampled(out, child)
        family.stdin.write("done\n")
        family.stdin.flush()
        assert family.wait(timeout=60) == 0
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.communicate(timeout=60)
    try:
        yield {"out": out, "pids": pids, "names": names, "staying": staying.pid if staying else None,
               "family": (parent, child, tag)}
    finally:
        if staying is not None:
            staying.kill()
            staying.wait()


def test_the_changes_are_events(recorded: dict[str, Any]) -> None:
    rec = load(recorded["out"])
    changes = rec.events[rec.events["kind"] == "limit_change"]
    for how, pid in recorded["pids"].items():
        mine = changes[(changes["limit_target"] == pid) & (changes["limit_resource"] == "RLIMIT_NOFILE")]
        # prlimit --nofile=20000:20000 set it in this very process before its exec, then the 64
        assert mine["limit_soft"].tolist() == [20000, LOWERED] and mine["limit_hard"].tolist() == [20000, 20000]
        assert mine["errno"].tolist() == ["", ""] and mine["ret"].tolist() == [0, 0]
        assert mine["pid"].iloc[0] == pid and mine["comm"].iloc[0] == "prlimit"
        if how == "itself":
            assert mine["pid"].iloc[1] == pid and mine["comm"].iloc[1] == recorded["names"][how]
        else:
            assert mine["pid"].iloc[1] != pid and mine["comm"].iloc[1] == "prlimit"


def test_failures_are_judged_by_the_limit_in_force(recorded: dict[str, Any]) -> None:
    needs = fd_needs(load(recorded["out"]))
    for how, pid in recorded["pids"].items():
        [row] = needs[needs["pid"] == pid].to_dict("records")
        assert row["fd_soft_limit"] == LOWERED and row["emfile"] == REFUSED
        assert row["need"] == LOWERED + REFUSED and row["recommended"] == with_margin(LOWERED + REFUSED)
        named = "set by the process itself at " if how == "itself" else "set by prlimit (pid "
        assert row["limit_source"].startswith(named), row


def test_doctor_and_the_report_give_that_number_and_name_its_source(recorded: dict[str, Any], tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    assert subprocess.run([FDTRACE, "report", str(recorded["out"]), "-o", str(report)], capture_output=True,
                          timeout=300).returncode == 0
    text = report.read_text()
    for how, pid in recorded["pids"].items():
        name = recorded["names"][how]
        doctor = subprocess.run([FDTRACE, "doctor", "--comm", name, "--from", str(recorded["out"]), "--json"],
                                capture_output=True, text=True, timeout=120)
        assert doctor.stdout, doctor.stderr
        checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"] if c["scope"].startswith(f"pid {pid}")}
        soft = checks["RLIMIT_NOFILE soft"]
        assert soft["status"] == "FAIL" and soft["current"].startswith(f"{LOWERED} (")
        assert soft["recommended"] == f">= {with_margin(LOWERED + REFUSED)}"
        named = "set by the process itself at " if how == "itself" else "set by prlimit (pid "
        assert checks["RLIMIT_NOFILE source"]["current"].startswith(named)
        assert f"set it to {with_margin(LOWERED + REFUSED)}" in text and name in text


def test_a_running_process_has_the_source_of_its_limit_named_from_the_trace(recorded: dict[str, Any]) -> None:
    """Still running, its limit lowered by prlimit while recorded: doctor names that prlimit,
    not a guess from the process's parent or its configuration."""
    pid = recorded["staying"]
    doctor = subprocess.run([FDTRACE, "doctor", "--pid", str(pid), "--from", str(recorded["out"]), "--json"],
                            capture_output=True, text=True, timeout=120)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"] if c["scope"].startswith(f"pid {pid}")}
    source = checks["RLIMIT_NOFILE source"]["current"]
    assert source.startswith("set by prlimit (pid ") and source.endswith("(traced by the recording)"), source
    assert checks["RLIMIT_NOFILE soft"]["recommended"] == f">= {with_margin(LOWERED + REFUSED)}"


def test_a_limit_inherited_from_the_parent_is_named_so(recorded: dict[str, Any]) -> None:
    """A child forked by a parent that lowered its own limit to 300: the source is its parent, and
    the change the parent made."""
    parent, child, tag = recorded["family"]
    needs = fd_needs(load(recorded["out"]))
    [row] = needs[needs["pid"] == child].to_dict("records")
    assert row["fd_soft_limit"] == 300
    assert row["limit_source"].startswith(f"inherited from pid {parent} (parent-{tag}), whose limit was set by the "
                                          "process itself at "), row
    doctor = subprocess.run([FDTRACE, "doctor", "--comm", f"child-{tag}", "--from", str(recorded["out"]), "--json"],
                            capture_output=True, text=True, timeout=120)
    [source] = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "RLIMIT_NOFILE source"]
    assert source["current"].startswith(f"inherited from pid {parent} (parent-{tag})"), source
