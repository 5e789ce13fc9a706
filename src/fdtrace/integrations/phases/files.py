"""Phase files joined to a recording: what `fdtrace run --phases-out` wrote (JSON lines or
Parquet), or a PyTorch profiler (Kineto) trace, put on the recording's clock."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pandas as pd

from fdtrace.errors import FdtraceError
from fdtrace.integrations.phases.collect import PHASES_SCHEMA


def _is_kineto(path: Path) -> bool:
    try:
        with open(path, "rb") as head:
            start = head.read(2)
        if start == b"\x1f\x8b":
            with gzip.open(path, "rb") as unzipped:
                start = unzipped.read(4096).lstrip()[:1]
        else:
            with open(path, "rb") as plain:
                start = plain.read(4096).lstrip()[:1]
    except OSError as exc:
        raise FdtraceError(f"{path}: cannot read the phases ({exc.strerror})", exit_code=2) from None
    return start == b"{" and not _is_json_lines(path)


def _is_json_lines(path: Path) -> bool:
    opener: Any = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", errors="replace") as text:
            first = text.readline()
        record = json.loads(first)
    except (OSError, EOFError, ValueError):  # not gzip after all, or not JSON: not phase lines
        return False
    return isinstance(record, dict) and "phase" in record


def read_phases(path: str | Path, clock: pd.DataFrame | None = None, host: str = "") -> pd.DataFrame:
    """A phases file as the recording's phases table (columns of ``PHASES_SCHEMA`` plus ``host``
    and ``time``). A Kineto trace needs ``clock``, the recording's clock offsets of ``host``."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            frame = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several kinds for a damaged file
            raise FdtraceError(f"{path}: unreadable phases file ({' '.join(str(exc).split())[:120]})",
                               exit_code=2) from None
    elif _is_kineto(path):
        from fdtrace.integrations.phases.kineto import kineto_phases, to_monotonic

        frame = to_monotonic(kineto_phases(path), clock) if clock is not None else kineto_phases(path)
    else:
        rows = []
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                raise FdtraceError(f"{path}:{number}: not a phase record (JSON lines expected)", exit_code=2) from None
        frame = pd.DataFrame(rows)
    missing = {"pid", "phase", "start_wall_ns", "end_wall_ns"} - set(frame.columns)
    if missing:
        raise FdtraceError(f"{path}: not a phases file (no {', '.join(sorted(missing))})", exit_code=2)
    for column in PHASES_SCHEMA.names:
        if column not in frame.columns:
            frame[column] = "shim" if column == "source" else None
    frame = frame[list(PHASES_SCHEMA.names)]
    frame.insert(0, "host", host)
    frame["time"] = pd.to_datetime(frame["start_wall_ns"], unit="ns", utc=True)
    return frame


def with_phase_files(recording: Any, paths: list[str | Path]) -> Any:
    """The recording with the phases of these files added to its phases table. A Kineto trace is
    put on the clock of the host it names (``host_name``) when the recording has that host,
    else of the recording's only host."""
    if not paths:
        return recording
    hosts = sorted(recording.meta)
    added = []
    for path in paths:
        host = _trace_host(Path(path), hosts)
        clock = recording.clock[recording.clock["host"].astype(str) == host] if len(recording.clock) else None
        added.append(read_phases(path, clock, host))
    frames = [f for f in (recording.phases, *added) if len(f)]
    phases = pd.concat(frames, ignore_index=True) if frames else recording.phases
    if len(phases):
        phases["host"] = phases["host"].astype(str).astype("category")
        phases = phases.sort_values("time", kind="stable", ignore_index=True)
    recording.phases = phases
    return recording


def _trace_host(path: Path, hosts: list[str]) -> str:
    if len(hosts) == 1:
        return hosts[0]
    if path.suffix != ".parquet" and _is_kineto(path):
        from fdtrace.integrations.phases.kineto import read_trace

        named = str(read_trace(path).get("host_name", ""))
        if named in hosts:
            return named
        raise FdtraceError(f"{path}: the trace's host {named!r} is not one of the recording's ({', '.join(hosts)})",
                           exit_code=2)
    return hosts[0] if hosts else ""
