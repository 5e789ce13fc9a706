"""`fdtrace trace-export`: a recording as a Chrome trace, and merged into the PyTorch profiler
traces of a real DDP job (gloo, 2 ranks) recorded by `fdtrace run --record`: Holistic Trace
Analysis reads the merged traces and its analyses give what they give on the profiler's own, and
fdtrace's tracks lie where the recording says."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from fdtrace.analysis import failures, load
from tests.bpf.test_ddp_phases import FDTRACE, STEPS, TRAIN, free_port, run_job
from tests.bpf.test_ddp_phases import netns as netns  # the fixture, used by its name

torch = pytest.importorskip("torch")
hta = pytest.importorskip("hta.trace_analysis")
pytestmark = pytest.mark.bpf
DATA = Path(__file__).parents[1] / "data"


def exported(args: list[str]) -> dict[str, Any]:
    result = subprocess.run([FDTRACE, "trace-export", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    output = Path(args[args.index("-o") + 1])
    raw = output.read_bytes()
    return json.loads(gzip.decompress(raw) if output.name.endswith(".gz") else raw)


def test_a_recording_exports_its_counters_failures_and_phases(tmp_path: Path) -> None:
    trace = exported([str(DATA / "emfile"), "-o", str(tmp_path / "t.json.gz")])
    rec = load(DATA / "emfile")
    base = trace["otherData"]["fdtrace.base_wall_ns"]
    child = int(rec.events[rec.events["comm"] == "emfile-child"]["pid"].iloc[0])
    mine = [e for e in trace["traceEvents"] if e["pid"] == child]
    named = [e["args"]["name"] for e in mine if e["ph"] == "M" and e["name"] == "process_name"]
    assert named == [f"emfile-child [{child}]"]
    # one counter sample per recorded sample, at its time
    samples = rec.samples[rec.samples["pid"] == child].sort_values("ts_ns")
    opened = sorted((e["ts"], e["args"]["value"]) for e in mine if e["ph"] == "C" and e["name"] == "open FDs")
    assert [v for _, v in opened] == samples["open_fds"].tolist()
    assert [round(t) for t, _ in opened] == [round((t.value - base) / 1000) for t in samples["time"]]
    assert {e["args"]["value"] for e in mine if e["name"] == "FD soft limit"} == {64}
    instants = [e for e in mine if e["ph"] == "i"]
    expected = failures(rec)
    expected = expected[expected["pid"] == child]
    assert sorted(e["name"] for e in instants) == sorted(expected["failure"])
    assert sorted(e["args"]["wall_ns"] for e in instants) == sorted(t.value for t in expected["time"])
    per_second = [e["args"]["value"] for e in mine if e["name"] == "EMFILE/ENFILE per second"]
    assert sum(per_second) == 4  # 3 socket() and 1 pipe2()


def outcome(analysis: Any) -> Any:
    """What an HTA analysis gives, or the kind of error it raises (CPU-only traces make some fail)."""
    try:
        return analysis()
    except Exception as exc:  # noqa: BLE001 - the outcome compared is the exception's type
        return type(exc).__name__


def same(left: Any, right: Any) -> bool:
    if isinstance(left, pd.DataFrame):
        return isinstance(right, pd.DataFrame) and left.reset_index(drop=True).equals(right.reset_index(drop=True))
    if isinstance(left, tuple | list):
        return type(left) is type(right) and len(left) == len(right) and all(map(same, left, right))
    if isinstance(left, dict):
        return isinstance(right, dict) and left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    return bool(left == right)


def test_merged_into_the_profilers_traces_hta_reads_them_and_the_tracks_are_in_place(
        netns: list[str], tmp_path: Path) -> None:
    out, profiles, merged = tmp_path / "rec", tmp_path / "profiles", tmp_path / "merged"
    profiles.mkdir()
    merged.mkdir()
    job = run_job([*netns, FDTRACE, "run", "--record", str(out), "--", sys.executable, TRAIN, "--steps", str(STEPS),
                   "--profile", str(profiles), "--port", str(free_port()), "--checkpoint", str(tmp_path / "c.pt")],
                  fresh=out)
    assert job.returncode == 0, job.stderr[-3000:]
    rec = load(out)
    ours_by_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in (0, 1):
        original = json.loads((profiles / f"trace-{rank}.json").read_text())
        trace = exported([str(out), "--merge", str(profiles / f"trace-{rank}.json"), "-o",
                          str(merged / f"trace-{rank}.json")])
        base = int(original["baseTimeNanoseconds"])
        assert trace["distributedInfo"] == original["distributedInfo"]
        theirs = original["traceEvents"]
        assert trace["traceEvents"][:len(theirs)] == theirs  # Kineto's own events, untouched
        ours = ours_by_rank[rank] = trace["traceEvents"][len(theirs):]
        stamped = [e for e in theirs if isinstance(e.get("ts"), int | float) and e.get("ph") != "M"]
        first = min(e["ts"] for e in stamped)
        last = max(e["ts"] + e.get("dur", 0) for e in stamped)
        assert all(first <= e["ts"] <= last for e in ours if e["ph"] != "M")  # within what the profiler traced
        pid = next(int(e["pid"]) for e in theirs if e.get("name") == "DistributedDataParallel.forward")
        # every slice is one of the shim's phases of this rank, at its wall time (cut to the span)
        phases = rec.phases[(rec.phases["rank"] == rank) & (rec.phases["source"] == "shim")]
        spans = [(r.phase, max((r.start_wall_ns - base) / 1000, first), min((r.end_wall_ns - base) / 1000, last))
                 for r in phases.itertuples()]
        slices = [e for e in ours if e["ph"] == "X"]
        assert slices and all(e["pid"] == pid for e in slices)
        for event in slices:
            assert any(name == event["name"] and abs(start - event["ts"]) < 0.01
                       and abs(end - event["ts"] - event["dur"]) < 0.01 for name, start, end in spans), event
        # the shim's forward passes hold Kineto's, one each: the same calls on one clock
        forwards = sorted(e["ts"] for e in theirs if e.get("name") == "DistributedDataParallel.forward")
        shim_forwards = sorted((e["ts"], e["ts"] + e["dur"]) for e in slices if e["name"] == "forward")
        assert len(forwards) == len(shim_forwards) == STEPS
        assert all(start - 1000 <= t <= end for (start, end), t in zip(shim_forwards, forwards, strict=True))
        # the rank's open FDs on its own process: the sample before the span at its start, then
        # every sample within it (the recorder samples each second; the profiler traced less)
        samples = rec.samples[rec.samples["pid"] == pid].sort_values("ts_ns")
        stamps = [(t.value - base) / 1000 for t in samples["time"]]
        earlier = [n for t, n in zip(stamps, samples["open_fds"], strict=True) if t < first]
        within = [(round(t), n) for t, n in zip(stamps, samples["open_fds"], strict=True) if first <= t <= last]
        opened = sorted((round(e["ts"]), e["args"]["value"]) for e in ours if e["pid"] == pid
                        and e["name"] == "open FDs")
        assert earlier and opened == [(round(first), earlier[-1]), *within]
    # Holistic Trace Analysis reads both sets: the same ranks, Kineto's events as they were, ours
    # beside them, and every analysis gives what it gives on the profiler's own traces.
    loaded = {name: hta.TraceAnalysis(trace_dir=str(folder)) for name, folder in
              (("profiler", profiles), ("merged", merged))}
    for rank in (0, 1):
        frames = {}
        for name, analyzer in loaded.items():
            frame = analyzer.t.get_trace(rank).copy()
            symbols = pd.Series(analyzer.t.symbol_table.get_sym_table())
            frame["event"] = symbols[frame["name"].to_numpy()].to_numpy()
            frame["category"] = symbols[frame["cat"].to_numpy()].to_numpy()
            frames[name] = frame
        added = frames["merged"]["category"].str.startswith("fdtrace")
        kept = frames["merged"][~added]
        columns = ["event", "ts", "dur", "pid", "tid"]
        pd.testing.assert_frame_equal(kept[columns].reset_index(drop=True),
                                      frames["profiler"][columns].reset_index(drop=True), check_dtype=False)
        # HTA counts time from its own zero: ours keep their distance to Kineto's first forward pass
        slices = sorted((e["name"], e["ts"]) for e in ours_by_rank[rank] if e["ph"] == "X")
        forward = min(float(e["ts"]) for e in json.loads((profiles / f"trace-{rank}.json").read_text())["traceEvents"]
                      if e.get("name") == "DistributedDataParallel.forward")
        shift = float(kept[kept["event"] == "DistributedDataParallel.forward"]["ts"].min()) - forward
        seen = sorted(zip(frames["merged"][added]["event"], frames["merged"][added]["ts"], strict=True))
        assert [n for n, _ in seen] == [n for n, _ in slices]
        assert all(abs(ts - (want + shift)) <= 1 for (_, ts), (_, want) in zip(seen, slices, strict=True))
    for analysis in ("get_comm_comp_overlap", "get_gpu_kernel_breakdown", "get_cuda_kernel_launch_stats",
                     "get_queue_length_summary", "get_temporal_breakdown", "get_idle_time_breakdown"):
        results = [outcome(lambda a=analyzer, name=analysis: getattr(a, name)(visualize=False))
                   for analyzer in loaded.values()]
        assert same(*results), analysis


def test_bad_inputs_are_one_line(tmp_path: Path) -> None:
    not_a_trace = tmp_path / "trace.json"
    not_a_trace.write_text('{"traceEvents": "no"}')
    truncated = tmp_path / "cut.json"
    truncated.write_text('{"traceEvents": [{"ph": "X"')
    for args, said in (([str(tmp_path), "-o", str(tmp_path / "t.json")], "not an fdtrace recording"),
                       ([str(DATA / "emfile"), "--merge", str(not_a_trace), "-o", str(tmp_path / "t.json")],
                        "not a PyTorch profiler trace"),
                       ([str(DATA / "emfile"), "--merge", str(truncated), "-o", str(tmp_path / "t.json")],
                        "not a JSON trace"),
                       ([str(DATA / "emfile"), "--top", "0"], "--top must be positive")):
        result = subprocess.run([FDTRACE, "trace-export", *args], capture_output=True, text=True, timeout=60)
        lines = result.stderr.strip().splitlines()
        assert result.returncode != 0 and len(lines) == 1 and said in lines[0], result.stderr
    assert not (tmp_path / "t.json").exists()
