"""The live phase state the shim keeps and `fdtrace top` reads, with a real process running the
shim (no torch needed: `with phase(...)` blocks), and phases_at() over a recorded phases table."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pandas as pd

from fdtrace.integrations.phases.live import (
    RUN_DIR_PREFIX,
    STATE_FORMAT,
    STATE_MAGIC,
    LivePhases,
    phases_at,
    read_state,
)

SHIM = resources.files("fdtrace.integrations.phases") / "_shim"
NESTED = """
import sys
from fdtrace.integrations.phases import phase
step = lambda: (print("ready", flush=True), sys.stdin.readline())
with phase("eval"):
    with phase("inner"):
        step()
    step()
step()
"""


def test_the_shim_writes_the_layout_fdtrace_reads() -> None:
    source = (Path(str(SHIM)) / "sitecustomize.py").read_text()
    assert f'_STATE_FORMAT = "{STATE_FORMAT}"' in source and STATE_MAGIC.decode() in source


def test_a_running_process_shows_its_innermost_phase_then_the_outer_then_none(tmp_path: Path) -> None:
    run = tmp_path / f"{RUN_DIR_PREFIX}test"
    run.mkdir()
    env = dict(os.environ, FDTRACE_PHASES_DIR=str(run), PYTHONPATH=str(SHIM), RANK="3", LOCAL_RANK="1",
               WORLD_SIZE="4")
    child = subprocess.Popen([sys.executable, "-c", NESTED], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    assert child.stdin is not None and child.stdout is not None
    live = LivePhases(base=tmp_path)
    seen = []
    try:
        for _ in range(3):
            assert child.stdout.readline() == "ready\n"
            now = live.poll()
            assert list(now) == [child.pid]
            seen.append(now[child.pid].label)
            child.stdin.write("\n")
            child.stdin.flush()
        child.wait(timeout=30)
    finally:
        child.kill()
    assert seen == ["user:inner", "user:eval", "-"]
    [state_file] = list(run.glob("state-*.bin"))
    read = read_state(state_file)
    assert read is not None
    now, _ = read
    assert (now.rank, now.local_rank, now.world_size, now.step) == (3, 1, 4, 0)
    assert live.poll() == {}  # the process is gone: its state is stale


def test_a_state_mid_write_or_of_another_kind_is_not_taken(tmp_path: Path) -> None:
    odd = struct.pack(STATE_FORMAT, STATE_MAGIC, 7, 1, 0, 0, 2, 0, 0, 0, 0, b"forward", b"")
    (tmp_path / "mid-write.bin").write_bytes(odd)
    assert read_state(tmp_path / "mid-write.bin") is None
    (tmp_path / "other.bin").write_bytes(b"x" * len(odd))
    assert read_state(tmp_path / "other.bin") is None
    (tmp_path / "short.bin").write_bytes(odd[:10])
    assert read_state(tmp_path / "short.bin") is None


def test_phases_at_a_moment_of_a_recording() -> None:
    rows = [  # rank 0: forward 0-10, backward 10-30 with allreduce 20-30; rank 1: forward 5-15
        (0, 100, 0, "forward", None, 0, 10), (0, 100, 0, "backward", None, 10, 30),
        (0, 100, 0, "allreduce", None, 20, 30), (1, 101, 0, "forward", None, 5, 15),
    ]
    phases = pd.DataFrame(rows, columns=["rank", "pid", "step", "phase", "name", "start_wall_ns", "end_wall_ns"])
    phases["local_rank"], phases["world_size"] = phases["rank"], 2
    at = phases_at(phases, 25)
    assert (at[100].label, at[100].since_wall_ns, at[100].rank) == ("allreduce", 20, 0)
    assert (at[101].label, at[101].since_wall_ns) == ("-", 15)
    assert set(phases_at(phases, 3)) == {100}  # rank 1 has not begun
    assert phases_at(phases, 12)[100].label == "backward"
