"""Phase files joined to a recording: Kineto traces (the rules on a small trace of known shape;
tests/bpf/test_ddp_phases.py checks real profiler traces against the shim), phase JSON lines,
and the one-line errors of `fdtrace report --phases` on bad files."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from fdtrace.analysis import load
from fdtrace.errors import FdtraceError
from fdtrace.integrations.phases.kineto import kineto_phases, to_monotonic
from tests.helpers import FDTRACE

DDP = Path(__file__).parents[1] / "data" / "ddp"
BASE = 1_700_000_000_000_000_000


def span(name: str, ts_us: float, dur_us: float, cat: str = "user_annotation", pid: int = 7, tid: int = 7) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts_us, "dur": dur_us, "pid": pid, "tid": tid}


def trace(events: list[dict], **extra: object) -> dict:
    return {"schemaVersion": 1, "baseTimeNanoseconds": BASE, "traceEvents": events,
            "distributedInfo": {"backend": "gloo", "rank": 1, "world_size": 4}, **extra}


def test_kineto_rules_with_profiler_steps(tmp_path: Path) -> None:
    events = []
    for step, at in ((5, 1000.0), (6, 2000.0)):
        events += [span(f"ProfilerStep#{step}", at, 900),
                   span("DistributedDataParallel.forward", at + 10, 100),
                   span("autograd::engine::evaluate_function: AddmmBackward0", at + 200, 50, cat="cpu_op"),
                   span("autograd::engine::evaluate_function: MeanBackward0", at + 300, 80, cat="cpu_op"),
                   span("gloo:all_reduce", at + 310, 60, tid=9),
                   span("Optimizer.zero_grad#Adam.zero_grad", at + 390, 5),
                   span("Optimizer.step#Adam.step", at + 400, 40),
                   span("eval", at + 500, 100)]
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(trace(events)).encode()))
    phases = kineto_phases(path)
    assert phases["phase"].value_counts().to_dict() == {"forward": 2, "backward": 2, "allreduce": 2,
                                                        "optimizer": 2, "user": 2}
    first = phases[phases["step"] == 5].set_index("phase")
    assert first.loc["backward", "start_wall_ns"] == BASE + 1_200_000  # first autograd op to end of last
    assert first.loc["backward", "end_wall_ns"] == BASE + 1_380_000
    assert (first.loc["optimizer", "name"], first.loc["user", "name"]) == ("Adam", "eval")
    assert first.loc["allreduce", "tid"] == 9 and set(phases["rank"]) == {1} and set(phases["world_size"]) == {4}
    clock = pd.DataFrame({"ts_ns": [0, 10**9], "realtime_offset_ns": [BASE - 1000, BASE - 1000]})
    mono = to_monotonic(phases, clock)
    assert (mono["start_mono_ns"] == mono["start_wall_ns"] - (BASE - 1000)).all()


def test_without_profiler_steps_the_step_counts_optimizer_steps(tmp_path: Path) -> None:
    events = [span("DistributedDataParallel.forward", 0, 10), span("Optimizer.step#SGD.step", 20, 5),
              span("DistributedDataParallel.forward", 30, 10), span("Optimizer.step#SGD.step", 50, 5)]
    (tmp_path / "t.json").write_text(json.dumps(trace(events)))
    phases = kineto_phases(tmp_path / "t.json")
    assert phases[["phase", "step"]].values.tolist() == [["forward", 0], ["optimizer", 0], ["forward", 1],
                                                         ["optimizer", 1]]


@pytest.mark.parametrize(("content", "message"), [
    (b"{not json", "not a JSON trace"),
    (b'{"traceEvents": 3}', "not a PyTorch profiler trace (no traceEvents)"),
    (b'{"traceEvents": []}', "has no baseTimeNanoseconds"),
])
def test_a_bad_trace_is_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(FdtraceError, match=re.escape(message)):
        kineto_phases(path)
    result = subprocess.run([FDTRACE, "report", str(DDP), "--phases", str(path), "-o", str(tmp_path / "r.html")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_phase_lines_added_to_a_recording(tmp_path: Path) -> None:
    recorded = load(DDP)
    extra = recorded.phases[recorded.phases["phase"] == "forward"].head(2)
    lines = tmp_path / "more.jsonl"
    lines.write_text("".join(json.dumps({**row, "phase": "user", "name": "eval", "source": "mine"}) + "\n"
                             for row in extra.drop(columns=["host", "time", "source"]).to_dict("records")))
    combined = load(DDP, phases=[lines])
    assert len(combined.phases) == len(recorded.phases) + 2
    added = combined.phases[combined.phases["source"] == "mine"]
    assert added["name"].tolist() == ["eval", "eval"] and set(added["host"]) == set(recorded.meta)
    assert combined.phases["time"].is_monotonic_increasing
