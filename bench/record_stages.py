"""Where `fdtrace record`'s CPU goes, per stage: the recorder run with its stages wrapped in timers.

Used by ``bench/record_cost --stages``; by hand (root):
    PYTHONPATH=src .venv/bin/python bench/record_stages.py STATS.json record -o REC

Runs the fdtrace command line of PYTHONPATH's tree with the functions of each stage wrapped: each
wrapper adds its thread's CPU time (``time.thread_time_ns``: the ring is drained and decoded on
the main thread, the Parquet files written on the writer's) to its stage, less the time of the
stages it calls. At exit, writes to STATS.json the CPU ns of each stage, the calls of each, and
the process's CPU from the first ring read on (so the start-up's compile is not in it).
Only the stages this tree has are wrapped: a function it lacks is skipped.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: (stage, module, attribute path) of the functions timed: a stage's own time excludes the
#: stages timed inside it on the same thread.
STAGES: tuple[tuple[str, str, str], ...] = (
    ("ring drain", "fdtrace.kernel.loader", "BpfTracer.poll"),
    ("decode: connections", "fdtrace.kernel.session", "decode_connections"),
    ("decode: columns", "fdtrace.kernel.session", "decode"),
    ("decode: placement lookups", "fdtrace.kernel.decode", "_placements"),
    ("decode: start times", "fdtrace.kernel.decode", "_start_times"),
    ("decode: task names", "fdtrace.kernel.decode", "_comm_column"),
    ("decode: peers", "fdtrace.kernel.decode", "_peer_columns"),
    ("decode: exec'd programs", "fdtrace.kernel.session", "KernelSession._programs_started"),
    ("source: the rest of a poll", "fdtrace.sources.live", "LiveSource._events"),
    ("sampler: /proc rounds, counters, losses", "fdtrace.sources.live", "LiveSource._round"),
    ("sink: events to the writer", "fdtrace.sinks.parquet", "ParquetSink.write"),
    ("sink: rows of a round", "fdtrace.sinks.parquet", "ParquetSink._round"),
    ("writer: concat of a flush's batches", "fdtrace.recording.writer", "RecordingWriter._write_flush"),
    ("writer: upgrade() casts", "fdtrace.recording.writer", "upgrade"),
    ("writer: Parquet encode and write", "fdtrace.recording.writer", "_write_parquet"),
    ("pipeline loop", "fdtrace.pipeline.runner", "Pipeline.step"),
)

_totals: dict[str, int] = {}
_calls: dict[str, int] = {}
_inner = threading.local()
_process_start: list[float] = []


def _process_cpu() -> float:
    times = os.times()
    return times.user + times.system


def _timed(stage: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _process_start:
            _process_start.append(_process_cpu())
        stack = getattr(_inner, "stack", None)
        if stack is None:
            stack = _inner.stack = []
        stack.append(0)
        begin = time.thread_time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            spent = time.thread_time_ns() - begin
            inner = stack.pop()
            _totals[stage] = _totals.get(stage, 0) + spent - inner
            _calls[stage] = _calls.get(stage, 0) + 1
            if stack:
                stack[-1] += spent

    return wrapper


def install() -> None:
    """Wrap every stage's function this tree has."""
    for stage, module_name, path in STAGES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        owner: Any = module
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent, None)
        if owner is None or not hasattr(owner, name):
            continue
        setattr(owner, name, _timed(stage, getattr(owner, name)))


def main() -> None:
    out = Path(sys.argv[1])
    install()

    def dump() -> None:
        total = _process_cpu() - (_process_start[0] if _process_start else 0.0)
        out.write_text(json.dumps({"stages": _totals, "calls": _calls, "process_cpu_s": total}))

    atexit.register(dump)
    from fdtrace.cli import main as cli

    sys.argv = ["fdtrace", *sys.argv[2:]]
    cli()


if __name__ == "__main__":
    main()
