"""Phases from a PyTorch profiler (Kineto) trace: the Chrome-trace JSON that
``torch.profiler.profile(...).export_chrome_trace(path)`` writes, plain or gzipped.

What becomes a phase, per process of the trace:

- ``DistributedDataParallel.forward`` -> ``forward``
- the autograd engine's ops (``autograd::engine::evaluate_function: ...``) after each forward and
  before the next -> one ``backward`` from the first of them to the end of the last
- ``gloo:all_reduce`` / ``nccl:all_reduce`` (the collective's own span) -> ``allreduce``
- ``Optimizer.step#SGD.step`` -> ``optimizer`` (``name`` is the optimizer's class)
- ``ProfilerStep#N`` numbers the steps when the profiler ran with a schedule; otherwise ``step``
  counts the optimizer steps begun before, from 0 at the start of the trace
- every other ``record_function`` block (category ``user_annotation``) -> ``user`` with its name

Kineto stamps are microseconds since ``baseTimeNanoseconds`` on the wall clock. They are put on
CLOCK_MONOTONIC, the clock of the recorded events, with the recording's CLOCK_REALTIME -
CLOCK_MONOTONIC offset sampled nearest in time (``to_monotonic``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fdtrace.errors import FdtraceError

FORWARD = "DistributedDataParallel.forward"
BACKWARD_OPS = "autograd::engine::evaluate_function: "
ALLREDUCE = ("gloo:all_reduce", "nccl:all_reduce", "mpi:all_reduce")
OPTIMIZER = "Optimizer.step#"
PROFILER_STEP = "ProfilerStep#"
#: Spans Kineto writes that are not phases of the job.
IGNORED_ANNOTATIONS = ("Optimizer.zero_grad#",)


def read_trace(path: str | Path) -> dict[str, Any]:
    """The trace's JSON; one-line FdtraceError when it is not a Kineto trace."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        trace = json.loads(raw)
    except OSError as exc:
        raise FdtraceError(f"{path}: cannot read the trace ({exc.strerror})", exit_code=2) from None
    except (ValueError, EOFError) as exc:
        raise FdtraceError(f"{path}: not a JSON trace ({' '.join(str(exc).split())[:120]})", exit_code=2) from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise FdtraceError(f"{path}: not a PyTorch profiler trace (no traceEvents)", exit_code=2)
    if "baseTimeNanoseconds" not in trace:
        raise FdtraceError(f"{path}: the trace has no baseTimeNanoseconds (PyTorch < 2.1?): its stamps cannot "
                           "be put on the wall clock", exit_code=2)
    return trace


def kineto_phases(path: str | Path) -> pd.DataFrame:
    """The phases of one trace file, on the wall clock (``start_wall_ns``, ``end_wall_ns``; the
    monotonic columns are left for ``to_monotonic``). Columns of the phases table."""
    trace = read_trace(path)
    base = int(trace["baseTimeNanoseconds"])
    info = trace.get("distributedInfo") or {}
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e and "ts" in e]
    rows: list[dict[str, Any]] = []
    for pid in sorted({int(e["pid"]) for e in spans if str(e.get("pid", "")).isdigit()}):
        mine = sorted((e for e in spans if str(e.get("pid")) == str(pid)), key=lambda e: float(e["ts"]))
        rows += _process_phases(mine, pid, base)
    frame = pd.DataFrame(rows, columns=["pid", "tid", "phase", "name", "start_wall_ns", "end_wall_ns"])
    frame = frame.sort_values(["start_wall_ns", "pid"], kind="stable", ignore_index=True)
    frame["step"] = _steps(frame, spans, base)
    frame["rank"] = info.get("rank")
    frame["world_size"] = info.get("world_size")
    frame["local_rank"] = None
    frame["bucket"] = None
    frame["source"] = "kineto"
    return frame


def _wall(event: dict[str, Any], base: int) -> tuple[int, int]:
    start = base + round(float(event["ts"]) * 1000)
    return start, start + round(float(event["dur"]) * 1000)


def _process_phases(events: list[dict[str, Any]], pid: int, base: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    backward_ops: list[tuple[int, int, int]] = []
    forwards: list[int] = []
    for event in events:
        name = str(event.get("name", ""))
        start, end = _wall(event, base)
        tid = int(event["tid"]) if str(event.get("tid", "")).isdigit() else None
        phase = None
        if name == FORWARD:
            phase, label = "forward", None
            forwards.append(start)
        elif name in ALLREDUCE:
            phase, label = "allreduce", None
        elif name.startswith(OPTIMIZER):
            phase, label = "optimizer", name[len(OPTIMIZER):].split(".")[0]
        elif name.startswith(BACKWARD_OPS):
            backward_ops.append((start, end, tid or 0))
        elif (event.get("cat") == "user_annotation" and not name.startswith(PROFILER_STEP)
              and not name.startswith(IGNORED_ANNOTATIONS)):
            phase, label = "user", name
        if phase is not None:
            rows.append({"pid": pid, "tid": tid, "phase": phase, "name": label, "start_wall_ns": start,
                         "end_wall_ns": end})
    # One backward per forward: its autograd ops up to the next forward.
    bounds = [*forwards, np.iinfo(np.int64).max]
    for after, before in zip(bounds[:-1], bounds[1:], strict=False):
        ops = [op for op in backward_ops if after <= op[0] < before]
        if ops:
            rows.append({"pid": pid, "tid": ops[0][2], "phase": "backward", "name": None,
                         "start_wall_ns": min(op[0] for op in ops), "end_wall_ns": max(op[1] for op in ops)})
    return rows


def _steps(frame: pd.DataFrame, spans: list[dict[str, Any]], base: int) -> np.ndarray:
    """``ProfilerStep#N`` around (or last before) each phase when the trace has such spans, else
    the optimizer steps the process had begun before the phase."""
    steps = np.zeros(len(frame), dtype=np.int64)
    for pid, index in frame.groupby("pid", sort=False).groups.items():
        at = frame.loc[index, "start_wall_ns"].to_numpy(dtype=np.int64)
        marks = sorted((_wall(e, base)[0], int(e["name"][len(PROFILER_STEP):])) for e in spans
                       if str(e.get("pid")) == str(pid) and str(e.get("name", "")).startswith(PROFILER_STEP)
                       and e["name"][len(PROFILER_STEP):].isdigit())
        positions = frame.index.get_indexer(index)
        if marks:
            starts = np.array([start for start, _ in marks], dtype=np.int64)
            numbers = np.array([number for _, number in marks], dtype=np.int64)
            steps[positions] = numbers[np.clip(np.searchsorted(starts, at, side="right") - 1, 0, None)]
        else:
            mine = frame.loc[index]
            optimizer_starts = np.sort(mine.loc[mine["phase"] == "optimizer", "start_wall_ns"].to_numpy(np.int64))
            steps[positions] = np.searchsorted(optimizer_starts, at, side="left")
    return steps


def to_monotonic(phases: pd.DataFrame, clock: pd.DataFrame) -> pd.DataFrame:
    """``start_mono_ns`` and ``end_mono_ns`` from the wall stamps, with the recording's clock
    offsets (one host's ``clock`` table) sampled nearest in time to each stamp."""
    if clock is None or clock.empty:
        raise FdtraceError("the recording has no clock offsets to put the trace on its clock", exit_code=2)
    offsets = clock.sort_values("ts_ns")
    wall_at = (offsets["ts_ns"] + offsets["realtime_offset_ns"]).to_numpy(dtype=np.int64)
    offset = offsets["realtime_offset_ns"].to_numpy(dtype=np.int64)
    result = phases.copy()
    for side in ("start", "end"):
        wall = result[f"{side}_wall_ns"].to_numpy(dtype=np.int64)
        nearest = np.clip(np.searchsorted(wall_at, wall), 1, max(len(wall_at) - 1, 1)) if len(wall_at) > 1 else 0
        if len(wall_at) > 1:
            before = np.asarray(nearest) - 1
            take = np.where(np.abs(wall_at[before] - wall) <= np.abs(wall_at[nearest] - wall), before, nearest)
        else:
            take = np.zeros(len(wall), dtype=np.int64)
        result[f"{side}_mono_ns"] = wall - offset[take]
    return result
