"""The phase each rank is in now: read from the state files the shim keeps under `fdtrace run`
(live), or from a recording's phases table (replay).

Each process of a job under `fdtrace run` keeps one small file, ``state-PID.bin`` in the run's
phases folder, that it rewrites in place through a memory map whenever a phase begins or ends.
A reader takes it only when two reads agree and its sequence number is even (not mid-write).
"""

from __future__ import annotations

import os
import stat
import struct
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fdtrace.procfs import TICK_NS, ProcessAccessDeniedError, ProcessGoneError, ProcFS
from fdtrace.procfs.reader import PROC_ROOT
from fdtrace.schema.records import PhaseNow

#: The layout of a state file; the shim writes the same one (see tests/unit/test_live_phases.py).
STATE_MAGIC = b"FDTP"
STATE_FORMAT = "<4sIiiiiqqqq24s40s"
STATE_SIZE = struct.calcsize(STATE_FORMAT)
#: State files read per poll at most (one per rank of the jobs on this host).
MAX_STATE_FILES = 4096
#: `fdtrace run` makes its phases folder under the temporary directory with this prefix.
RUN_DIR_PREFIX = "fdtrace-phases-"


def _optional(value: int) -> int | None:
    return None if value < 0 else value


def read_state(path: Path) -> tuple[PhaseNow, int] | None:
    """A state file as (PhaseNow, the process's start time in clock ticks); None when it is
    unreadable, not a state file, or being written both times it was read."""
    read = read_state_owned(path)
    return None if read is None else read[:2]


def read_state_owned(path: Path) -> tuple[PhaseNow, int, int] | None:
    """``read_state`` and the file's owner. Only a regular file is read, never through a link,
    without blocking (a FIFO planted under the name cannot hang the reader), at most
    STATE_SIZE bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        for _ in range(3):
            first, second = os.pread(fd, STATE_SIZE, 0), os.pread(fd, STATE_SIZE, 0)
            decoded = _decode_state(first, second)
            if decoded == "retry":
                continue
            return None if decoded is None else (*decoded, info.st_uid)
        return None
    except OSError:
        return None
    finally:
        os.close(fd)


def _decode_state(first: bytes, second: bytes) -> tuple[PhaseNow, int] | str | None:
    """Two reads of a state file as (PhaseNow, start ticks); "retry" when it was being written,
    None when it is not a state file."""
    if len(first) < STATE_SIZE:
        return None
    if first != second:
        return "retry"
    (magic, sequence, pid, rank, local_rank, world, start_ticks, step, since_wall, _, phase,
     name) = struct.unpack(STATE_FORMAT, first)
    if magic != STATE_MAGIC:
        return None
    if sequence % 2:
        return "retry"
    return (PhaseNow(pid, _optional(rank), _optional(local_rank), _optional(world), step,
                     phase.rstrip(b"\0").decode("utf-8", "replace"), name.rstrip(b"\0").decode("utf-8", "replace"),
                     since_wall), start_ticks)


def runs_base() -> Path:
    """Where `fdtrace run` makes its phases folders and `fdtrace top` looks for them:
    ``$FDTRACE_RUNS_DIR``, else the temporary directory (``$TMPDIR``, else /tmp)."""
    return Path(os.environ.get("FDTRACE_RUNS_DIR") or tempfile.gettempdir())


class LivePhases:
    """Finds the jobs running under `fdtrace run` and reads where each of their processes is.

    Args:
        base: the folder holding the runs' phases folders (``runs_base()``).
        procfs: to tell a live process from an exited one whose PID was reused.
    """

    def __init__(self, base: str | Path | None = None, procfs: str | Path = PROC_ROOT) -> None:
        self.base = Path(base) if base is not None else runs_base()
        self.procfs = ProcFS(procfs)

    def _uid(self, pid: int) -> int | None:
        try:
            return int(self.procfs.status(pid, ("Uid",))["Uid"].split()[0])
        except (ProcessGoneError, ProcessAccessDeniedError, KeyError, IndexError, ValueError):
            return None

    def state_files(self) -> list[Path]:
        """The state files of every run under the base folder (at most MAX_STATE_FILES: the
        folder is shared, and anyone can fill it)."""
        try:
            runs = [entry for entry in self.base.iterdir() if entry.name.startswith(RUN_DIR_PREFIX)]
        except OSError:
            return []
        files: list[Path] = []
        for run in runs:
            try:
                for entry in run.iterdir():
                    if entry.name.startswith("state-") and entry.name.endswith(".bin"):
                        files.append(entry)
                        if len(files) >= MAX_STATE_FILES:
                            return files
            except OSError:
                continue
        return files

    def poll(self) -> dict[int, PhaseNow]:
        """The phase of every live process of every run, by pid."""
        found = {}
        for path in self.state_files():
            read = read_state_owned(path)
            if read is None:
                continue
            now, start_ticks, owner = read
            # The file must be the process's own (or root's), and the process the one that wrote
            # it: another user cannot show a phase for someone else's process.
            if self.procfs.start_ns(now.pid) == start_ticks * TICK_NS and owner in (0, self._uid(now.pid)):
                found[now.pid] = now
        return found


def phases_at(phases: Any, wall_ns: int, pids: Iterable[int] | None = None) -> dict[int, PhaseNow]:
    """From a recording's phases table (a DataFrame), where each process was at ``wall_ns``:
    the innermost phase in progress, else ``""`` since its last phase ended. Processes whose first
    phase is still ahead are left out."""
    if phases is None or len(phases) == 0:
        return {}
    begun = phases[phases["start_wall_ns"] <= wall_ns]
    if pids is not None:
        begun = begun[begun["pid"].isin(list(pids))]
    found: dict[int, PhaseNow] = {}
    for pid, mine in begun.groupby("pid", sort=False):
        running = mine[mine["end_wall_ns"] > wall_ns]
        if len(running):
            row = running.loc[running["start_wall_ns"].idxmax()]
            phase, since = str(row["phase"]), int(row["start_wall_ns"])
        else:
            row = mine.loc[mine["end_wall_ns"].idxmax()]
            phase, since = "", int(row["end_wall_ns"])
        found[int(pid)] = PhaseNow(int(pid), _nullable(row["rank"]), _nullable(row["local_rank"]),
                                   _nullable(row["world_size"]), int(row["step"]), phase,
                                   "" if row["name"] is None or row["name"] != row["name"] else str(row["name"]),
                                   since)
    return found


def _nullable(value: Any) -> int | None:
    return None if value is None or value != value else int(value)
