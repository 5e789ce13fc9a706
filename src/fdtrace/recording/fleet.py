"""Many hosts' recordings as one fleet: every recording found under the directories given (one
recording holding many hosts, recordings copied side by side, or one per host under a common
root), with the readable part files of each table and host.

The walk never follows a symbolic link and goes at most :data:`MAX_DEPTH` levels down, so a tree
that other users can write cannot send it elsewhere or keep it walking.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fdtrace.errors import FdtraceError
from fdtrace.recording.layout import TABLES, host_dir, part_files
from fdtrace.recording.reader import read_meta
from fdtrace.schema import SCHEMA_VERSION

#: How far below a given directory recordings are looked for.
MAX_DEPTH = 4


@dataclass(frozen=True)
class HostRecording:
    """One host's recording: the recording directory it is in, its name and its metadata."""

    root: Path
    host: str
    meta: dict[str, Any]

    @property
    def version(self) -> int:
        """The schema version its metadata gives."""
        version = self.meta.get("schema_version", SCHEMA_VERSION)
        return version if isinstance(version, int) else SCHEMA_VERSION


@dataclass
class Fleet:
    """Every host recording found, and what could not be used (named, with the reason)."""

    hosts: list[HostRecording]
    skipped: list[str] = field(default_factory=list)
    damaged: set[Path] = field(default_factory=set)  # parts found unreadable: left out from then on

    @property
    def names(self) -> list[str]:
        """Host names, sorted, each once."""
        return sorted({h.host for h in self.hosts})

    @property
    def meta(self) -> dict[str, dict[str, Any]]:
        """Metadata by host (the last recording of a host named twice wins)."""
        return {h.host: h.meta for h in self.hosts}

    def parts(self, table: str) -> list[tuple[HostRecording, Path]]:
        """The part files of ``table``, host by host, in order: regular files only (anything else
        is named in ``skipped``), leaving out parts that a merged file also covers."""
        found = []
        for recording in self.hosts:
            for path in part_files(host_dir(recording.root, table, recording.host)):
                if path in self.damaged:
                    continue
                try:
                    mode = os.lstat(path).st_mode
                except OSError as exc:
                    self._skip(f"{path}: {exc.strerror}")
                    continue
                if stat.S_ISREG(mode):
                    found.append((recording, path))
                else:
                    self._skip(f"{path}: not a regular file")
        return found

    def _skip(self, why: str) -> None:
        if why not in self.skipped:  # the parts are listed again whenever views are made
            self.skipped.append(why)


def _is_recording(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path / "meta").st_mode)
    except OSError:
        return False


def _recordings_under(path: Path, depth: int) -> list[Path]:
    """Recording directories at or below ``path``, in name order, not following links."""
    if _is_recording(path):
        return [path]
    if depth == 0:
        return []
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return []
    found = []
    for entry in entries:
        if entry.name.startswith(".") or entry.name in TABLES:
            continue
        if entry.is_dir(follow_symlinks=False):
            found += _recordings_under(Path(entry.path), depth - 1)
    return found


def find_fleet(paths: str | Path | list[str | Path]) -> Fleet:
    """The fleet of recordings at or under ``paths``. Raises FdtraceError (one line) when a path
    does not exist or holds no recording; hosts whose metadata cannot be used are left out and
    named in ``skipped``."""
    hosts: list[HostRecording] = []
    skipped: list[str] = []
    for given in [Path(p) for p in (paths if isinstance(paths, list) else [paths])]:
        try:
            info = os.stat(given)
        except OSError as exc:
            raise FdtraceError(f"{given}: no such recording directory ({exc.strerror})") from None
        if not stat.S_ISDIR(info.st_mode):
            raise FdtraceError(f"{given}: not a directory")
        roots = _recordings_under(given, MAX_DEPTH)
        if not roots:
            raise FdtraceError(f"{given}: not an fdtrace recording, nor a fleet of them (no meta/ folder here "
                               f"or up to {MAX_DEPTH} levels below)")
        for root in roots:
            try:
                metas = read_meta(root, skipped)
            except FdtraceError as error:
                if len(roots) == 1:
                    raise
                skipped.append(str(error))
                continue
            hosts += [HostRecording(root, host, meta) for host, meta in metas.items()]
    if not hosts:
        raise FdtraceError(skipped[0] if skipped else "no recording to read")
    return Fleet(hosts, skipped)


def fleet_roots(paths: str | Path | list[str | Path]) -> list[Path]:
    """The recording directories at or under ``paths`` (see ``find_fleet``), each once."""
    roots: list[Path] = []
    for given in [Path(p) for p in (paths if isinstance(paths, list) else [paths])]:
        found = _recordings_under(given, MAX_DEPTH) if given.is_dir() else []
        roots += [r for r in found or [given] if r not in roots]
    return roots
