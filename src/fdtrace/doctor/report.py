"""Choosing what to check, and printing the checks as a table or JSON."""

from __future__ import annotations

import json
from pathlib import Path

from fdtrace.doctor.checks import Check, Doctor, Status

DEFAULT_TOP = 5


def select_pids(doctor: Doctor, pids: tuple[int, ...], comms: tuple[str, ...]) -> list[int]:
    """The processes to check: those named, else the top ones by open FDs and every haproxy."""
    if pids or comms:
        chosen = set(pids)
        for pid in doctor.sampler.pids():
            sample = doctor.sampler.sample(pid) if comms else None
            if sample is not None and sample.comm in comms:
                chosen.add(pid)
        return sorted(chosen)
    chosen = set(doctor.sampler.top_by_open_fds(DEFAULT_TOP))
    for pid in doctor.sampler.pids():
        sample = doctor.sampler.sample(pid)
        if sample is not None and sample.comm.startswith("haproxy"):
            chosen.add(pid)
    return sorted(chosen)


def apply_recording(directory: Path, doctor: Doctor, pids: list[int], engine: str = "auto") -> dict[str, int]:
    """From a recording, give the doctor each live process's peak open FDs and thread growth
    (its samples with the same pid and start, else with the same name). Returns how far the
    listen-queue counters moved during the recording. ``engine``: as ``fdtrace.analysis.load``'s
    (only these processes' samples are read)."""
    from fdtrace.analysis import load
    from fdtrace.analysis.engines import quote
    from fdtrace.analysis.engines.dataset import engine_for

    recording = load(directory, engine=engine)
    live = {pid: doctor.sampler.sample(pid) for pid in pids}
    names = sorted({s.comm for s in live.values() if s is not None})
    wanted = " OR ".join([f"pid IN ({', '.join(str(p) for p in pids)})"] * bool(pids)
                         + [f"comm IN ({', '.join(quote(n) for n in names)})"] * bool(names)) or "false"
    with engine_for(recording) as runner:
        samples = runner.query(f"SELECT pid, start_ns, comm, ts_ns, open_fds, threads FROM samples WHERE {wanted}")
    system = recording.system
    getattr(recording, "close", lambda: None)()
    for pid in pids:
        sample = live[pid]
        if sample is None or samples.empty:
            continue
        same = samples[(samples["pid"] == pid) & (samples["start_ns"] == sample.start_ns)]
        if same.empty:
            same = samples[samples["comm"].astype(str) == sample.comm]
        if same.empty:
            continue
        doctor.peaks[pid] = int(same["open_fds"].max())
        span = (same["ts_ns"].max() - same["ts_ns"].min()) / 1e9
        if span > 0:
            first, last = same.sort_values("ts_ns")["threads"].iloc[[0, -1]]
            doctor.thread_growth[pid] = max(0.0, (last - first) / span)
    moved = {}
    for column, name in (("listen_overflows", "ListenOverflows"), ("listen_drops", "ListenDrops")):
        if column in system.columns and len(system):
            moved[name] = int(system[column].max() - system[column].min())
    return moved


def run_checks(doctor: Doctor, pids: list[int], listen_moved: dict[str, int] | None) -> list[Check]:
    """System checks, then each process's."""
    checks = doctor.system_checks(listen_moved, consumers=doctor.sampler.top_by_open_fds(10))
    for pid in pids:
        checks += doctor.process_checks(pid)
    return checks


def worst(checks: list[Check]) -> Status:
    """The worst status (the exit code)."""
    return max((c.status for c in checks), default=Status.OK)


def as_json(checks: list[Check]) -> str:
    """The checks and the overall status as JSON."""
    return json.dumps({"status": worst(checks).name, "checks": [c.as_dict() for c in checks]}, indent=1)


def as_table(checks: list[Check]) -> str:
    """A table for a terminal, then the changes to make, numbered."""
    header = ("STATUS", "SCOPE", "CHECK", "CURRENT", "RECOMMENDED")
    rows = [(c.status.name, c.scope, c.name, c.current, c.recommended) for c in checks]
    widths = [min(max(len(r[i]) for r in [header, *rows]), 70) for i in range(len(header))]
    lines = ["  ".join(cell[:70].ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]
    changes = [c for c in checks if c.change]
    if changes:
        lines += ["", "Changes:"]
        lines += [f"{i}. [{c.status.name}] {c.scope}, {c.name}: {c.change}" for i, c in enumerate(changes, 1)]
    lines += ["", f"overall: {worst(checks).name}"]
    return "\n".join(lines)
