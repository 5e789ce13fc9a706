"""The descriptors fdtrace says it needs are enough: `record --stacks` under `prlimit --nofile=N:N`,
N being what fdtrace states, starts, records a program's failures with their stacks and stops with
exit 0; one below is refused in one line before anything is attached."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fdtrace.analysis import load
from fdtrace.kernel.features import probe_kernel
from fdtrace.kernel.loader import TraceOptions
from fdtrace.kernel.session import KernelSession, descriptor_budget, planned_probes
from tests.helpers import FDTRACE

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(os.geteuid() != 0, reason="attaching BPF programs needs root")]

NEEDS = re.compile(r"^fdtrace: error: the hard RLIMIT_NOFILE is (\d+): fdtrace needs (\d+) file descriptors "
                   r"\((.*)\); raise it \(prlimit --nofile=(\d+):\4, ulimit -Hn, or LimitNOFILE= of its unit\)$")
SITES = Path(__file__).parents[1] / "data" / "call_sites" / "sites.c"


@pytest.fixture(scope="module")
def sites_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/data/call_sites/sites.c, with frame pointers: its stacks are walked whole."""
    binary = tmp_path_factory.mktemp("sites") / "sites"
    subprocess.run(["gcc", "-O0", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", str(binary), str(SITES)],
                   check=True, capture_output=True, timeout=120)
    return binary


def stated_need(argv: list[str]) -> tuple[int, str]:
    """(N, its parts) from fdtrace's refusal under a limit of 32."""
    refused = subprocess.run(["prlimit", "--nofile=32:32", FDTRACE, *argv], capture_output=True, text=True,
                             timeout=120)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode != 0 and len(lines) == 1, refused.stderr
    found = NEEDS.match(lines[0])
    assert found and found[1] == "32" and found[2] == found[4], lines[0]
    return int(found[2]), found[3]


def test_record_with_stacks_runs_and_stops_at_the_limit_it_states_and_not_one_below(sites_binary: Path,
                                                                                     tmp_path: Path) -> None:
    need, parts = stated_need(["record", "-o", str(tmp_path / "refused"), "--stacks"])
    assert "--stacks" in parts and "the detach helper: 2" in parts and "recording to" in parts, parts
    assert not (tmp_path / "refused").exists()

    below = subprocess.run(["prlimit", f"--nofile={need - 1}:{need - 1}", FDTRACE, "record", "-o",
                            str(tmp_path / "below"), "--stacks"], capture_output=True, text=True, timeout=120)
    lines = below.stderr.strip().splitlines()
    assert below.returncode != 0 and len(lines) == 1 and f"is {need - 1}: fdtrace needs {need} " in lines[0], lines
    assert not (tmp_path / "below").exists()  # refused before anything was made or attached

    out = tmp_path / "rec"
    recorder = subprocess.Popen(["prlimit", f"--nofile={need}:{need}", FDTRACE, "record", "-o", str(out), "--stacks",
                                 "--interval", "0.5"], stderr=subprocess.PIPE, text=True)
    assert recorder.stderr is not None
    said = []
    for line in recorder.stderr:
        said.append(line)
        if "probes attached" in line:
            break
    else:
        raise AssertionError("".join(said))
    # sockets until EMFILE, then three open()s refused, under a limit of 24; it waits for stdin
    program = subprocess.Popen(["prlimit", "--nofile=24:24", str(sites_binary), "emfile"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert program.stdin is not None and program.stdout is not None
    try:
        program.stdin.write("x")
        program.stdin.flush()
        assert program.stdout.readline().split()[1] == "failed=4"
        # its stacks are symbolized while it lives: wait until they are in the recording
        until(lambda: len(stacked_failures(out, program.pid)) == 4)
    finally:
        program.stdin.close()
        program.wait(timeout=30)
    until(lambda: exit_recorded(out, program.pid))
    recorder.terminate()
    rest = recorder.communicate(timeout=120)[1]
    assert recorder.returncode == 0, "".join(said) + rest
    assert "Traceback" not in rest and "error" not in rest, rest
    recording = load(out)
    failures = stacked_failures(out, program.pid)
    frames = recording.stacks.set_index("stack_id")["frames"]
    assert all(list(frames.loc[int(i)])[1].startswith("exhaust_descriptors+") for i in failures["stack_id"])
    counters = recording.counters
    final = counters[counters["pid"] == program.pid].sort_values("ts_ns").iloc[-1]
    assert (final["socket_errors"], final["other_fd_call_errors"]) == (1, 3)


def until(condition: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not seen in the recording"
        time.sleep(0.2)


def _events(out: Path) -> Any:
    try:
        return load(out).events
    except Exception:  # noqa: BLE001 - nothing written yet
        return None


def stacked_failures(out: Path, pid: int) -> Any:
    events = _events(out)
    if events is None:
        return []
    return events[(events["pid"] == pid) & (events["errno"] == "EMFILE") & events["stack_id"].notna()]


def exit_recorded(out: Path, pid: int) -> bool:
    events = _events(out)
    return events is not None and bool(((events["pid"] == pid) & (events["kind"] == "process_exit")).any())


@pytest.mark.parametrize("options", [TraceOptions(), TraceOptions(stacks=True, connections=True),
                                     TraceOptions(errors_only=True)], ids=["default", "stacks", "errors-only"])
def test_the_budget_counts_the_probes_that_are_attached(options: TraceOptions) -> None:
    session = KernelSession(options)
    session.start()
    try:
        assert sorted(planned_probes(probe_kernel(), options)) == sorted(session.probes)
        budget = descriptor_budget(probe_kernel(), options, open_now=0)
        assert dict(budget.parts)[f"{len(session.probes)} probes"] == 2 * len(session.probes)
    finally:
        session.stop()
