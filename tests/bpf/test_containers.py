"""Containers and services: processes put in cgroups the test makes under the names container
runtimes and systemd give them (cgroup v1's pids hierarchy and the v2 tree, where this machine has
them), recorded with --container and --unit: only their events are traced, with exact counts, and
their samples say where they ran."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdtrace.analysis import load
from tests.conftest import python_child
from tests.helpers import FDTRACE, started, wait_recorded

pytestmark = pytest.mark.bpf
CGROUPFS = Path("/sys/fs/cgroup")
V1_PIDS = CGROUPFS / "pids"
V2 = CGROUPFS / "unified" if (CGROUPFS / "unified" / "cgroup.procs").exists() else CGROUPFS
SOCKETS = 5
# Makes exactly SOCKETS sockets once told, then stays until its stdin closes (its samples are taken).
CHILD = f"""
import socket, sys
sys.stdin.readline()
for _ in range({SOCKETS}):
    socket.socket().close()
print("made", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def cgroups() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for folder in reversed(made):
        for _ in range(50):
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def cgroup(base: Path, path: str, made: list[Path]) -> Path:
    folder = base
    for part in path.strip("/").split("/"):
        folder = folder / part
        if not folder.exists():
            folder.mkdir()
            made.append(folder)
    return folder


def record_children(tmp_path: Path, selection: list[str], placed: dict[str, Path],
                    selected: str) -> tuple[Path, dict[str, int]]:
    """Start one child per cgroup, put each in it, record with ``selection``, let them run; they
    end once the ``selected`` one's sockets and a sample of it are on disk."""
    children = {name: subprocess.Popen(python_child(CHILD), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for name in placed}
    for name, folder in placed.items():
        (folder / "cgroup.procs").write_text(str(children[name].pid))
    out = tmp_path / f"rec-{secrets.token_hex(3)}"
    recorder = started([FDTRACE, "record", "-o", str(out), "--interval", "0.5", *selection], "recording to")
    pid = children[selected].pid
    try:
        for child in children.values():
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children.values():
            assert child.stdout is not None and child.stdout.readline().strip() == "made"
        recorded_sockets(out, pid, SOCKETS)
        wait_recorded(out, lambda rec: bool((rec.samples["pid"] == pid).any()), f"a sample of {selected} on disk")
    finally:
        for child in children.values():
            if child.stdin is not None:
                child.stdin.close()
        for child in children.values():
            child.wait(timeout=30)
            if child.stdout is not None:
                child.stdout.close()
        recorder.send_signal(2)
        recorder.communicate(timeout=60)
    return out, {name: child.pid for name, child in children.items()}


@pytest.mark.skipif(not (V1_PIDS / "cgroup.procs").exists(), reason="no cgroup v1 pids hierarchy here")
def test_a_docker_container_on_cgroup_v1_is_recorded_alone(tmp_path: Path, cgroups: list[Path]) -> None:
    ident = secrets.token_hex(32)
    test = f"fdtrace-test-{os.getpid()}"
    placed = {"docker": cgroup(V1_PIDS, f"{test}/docker-{ident}.scope", cgroups),
              "other": cgroup(V1_PIDS, f"{test}/other.scope", cgroups)}
    out, pids = record_children(tmp_path, ["--container", ident[:12]], placed, "docker")
    rec = load(out)
    traced = rec.events[rec.events["kind"] == "socket"]
    assert set(traced["pid"]) == {pids["docker"]} and len(traced) == SOCKETS  # exactly its calls, not the other's
    samples = rec.samples[rec.samples["pid"] == pids["docker"]]
    assert len(samples) and set(samples["container_id"]) == {ident}
    assert set(samples["container_runtime"]) == {"docker"}
    assert set(samples["cgroup"]) == {f"/{test}/docker-{ident}.scope"}
    assert set(traced["container_id"]) == {ident} and set(traced["container_runtime"]) == {"docker"}
    assert set(traced["cgroup"]) == {f"/{test}/docker-{ident}.scope"}


def test_a_service_holding_a_containerd_container_on_cgroup_v2(tmp_path: Path, cgroups: list[Path]) -> None:
    ident = secrets.token_hex(32)
    unit = f"fdtrace-test-{os.getpid()}"
    placed = {"service": cgroup(V2, f"{unit}.service/cri-containerd-{ident}.scope", cgroups),
              "other": cgroup(V2, f"{unit}-other.service", cgroups)}
    out, pids = record_children(tmp_path, ["--unit", unit], placed, "service")
    rec = load(out)
    traced = rec.events[rec.events["kind"] == "socket"]
    assert set(traced["pid"]) == {pids["service"]} and len(traced) == SOCKETS
    samples = rec.samples[rec.samples["pid"] == pids["service"]]
    assert len(samples) and set(samples["container_id"]) == {ident}
    assert set(samples["container_runtime"]) == {"containerd"}
    assert set(samples["unit"]) == {f"cri-containerd-{ident}.scope"}
    assert set(samples["cgroup"]) == {f"/{unit}.service/cri-containerd-{ident}.scope"}
    assert set(traced["container_id"]) == {ident} and set(traced["unit"]) == {f"cri-containerd-{ident}.scope"}
    assert set(traced["cgroup"]) == {f"/{unit}.service/cri-containerd-{ident}.scope"}
    assert traced["pod_uid"].isna().all()
    quiet = subprocess.run([FDTRACE, "record", "-o", str(tmp_path / "none"), "--unit", f"{unit}-nothing"],
                           capture_output=True, text=True, timeout=60)
    assert quiet.returncode != 0 and quiet.stderr.strip().splitlines() == [
        f"fdtrace: error: --unit {unit}-nothing: no process in a matching cgroup under /sys/fs/cgroup"]


# Makes SOCKETS sockets each time it is told, then stays a moment.
TWICE = f"""
import socket, sys, time
for _ in range(2):
    sys.stdin.readline()
    for _ in range({SOCKETS}):
        socket.socket().close()
    print("made", flush=True)
time.sleep(1)
"""


def recorded_sockets(out: Path, pid: int, count: int, timeout: float = 30) -> None:
    """Wait until the recording being written holds ``count`` socket events of ``pid``."""
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        try:
            events = load(out, columns={"events": ["pid", "kind"]}).events
            seen = int(((events["pid"] == pid) & (events["kind"] == "socket")).sum())
        except Exception:  # nothing flushed yet
            seen = 0
        if seen >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{seen} of {count} socket events recorded after {timeout} s")


def test_a_process_moved_to_another_cgroup_has_its_new_place_in_events_a_second_later(
        tmp_path: Path, cgroups: list[Path]) -> None:
    unit = f"fdtrace-test-{os.getpid()}"
    first, second = cgroup(V2, f"{unit}-first.service", cgroups), cgroup(V2, f"{unit}-second.service", cgroups)
    child = subprocess.Popen(python_child(TWICE), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    (first / "cgroup.procs").write_text(str(child.pid))
    out = tmp_path / "rec"
    recorder = started([FDTRACE, "record", "-o", str(out), "--interval", "0.5", "--pid", str(child.pid)],
                       "recording to")
    try:
        for move in (True, False):
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "made"
            if move:
                recorded_sockets(out, child.pid, SOCKETS)  # decoded, its place read, before it moves
                (second / "cgroup.procs").write_text(str(child.pid))  # no exec: no event shows the move
                # past the age (1 s) of the place read for the first sockets: the next event has it
                # read again. A length of time that fdtrace defines, not a wait for something to arrive
                time.sleep(1.5)
        recorded_sockets(out, child.pid, 2 * SOCKETS)
        child.wait(timeout=30)
    finally:
        recorder.send_signal(2)
        recorder.communicate(timeout=60)
    events = load(out).events
    sockets = events[(events["kind"] == "socket") & (events["pid"] == child.pid)].sort_values("ts_ns")
    assert sockets["unit"].tolist() == [f"{unit}-first.service"] * SOCKETS + [f"{unit}-second.service"] * SOCKETS
