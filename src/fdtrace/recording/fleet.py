"""Many hosts' recordings as one fleet: every recording found under the directories given (one
recording holding many hosts, recordings copied side by side, or one per host under a common
root), with the readable part files of each table and host.

The walk never follows a symbolic link and goes at most :data:`MAX_DEPTH` levels down, so a tree
that other users can write cannot send it elsewhere or keep it walking. A host whose metadata
cannot be used is left out and named (the other hosts are read), and a host's recording found
twice (copied twice: the same host, boot and start) is read once.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fdtrace.errors import FdtraceError
from fdtrace.recording.layout import TABLES
from fdtrace.recording.reader import HostSnapshot, read_meta, well_formed
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
        return version if isinstance(version, int) and not isinstance(version, bool) else SCHEMA_VERSION


@dataclass
class Fleet:
    """Every host recording found, and what could not be used (named, with the reason).

    Each host is read as one state of its recording (``snapshot()``: the readers' lock held
    and its manifest read), taken when its parts are first asked for and held until
    ``close()``: every query of a recording that is still written sees the same files, and its
    recorder deletes none of them meanwhile. A recording written before manifests is listed
    instead, and listed again after ``refresh()``.
    """

    hosts: list[HostRecording]
    skipped: list[str] = field(default_factory=list)
    damaged: set[Path] = field(default_factory=set)  # parts found unreadable: left out from then on
    notes: list[str] = field(default_factory=list)
    doubted: set[Path] = field(default_factory=set)  # parts an engine leaves to fdtrace's reader (see table_files)
    _listed: dict[str, list[tuple[HostRecording, Path]]] = field(default_factory=dict, repr=False)
    _snapshots: dict[tuple[Path, str], HostSnapshot] = field(default_factory=dict, repr=False)

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
        is named in ``skipped``), leaving out parts that a merged file also covers (a merged file
        that holds fewer rows than they do is named in ``notes`` and left out instead)."""
        if table not in self._listed:
            found = []
            for recording in self.hosts:
                listing = self.snapshot(recording).listing(table)
                found += [(recording, path) for path in listing.paths]
                for why in listing.skipped:
                    self.skip(why)
                self.notes += [n for n in listing.notes if n not in self.notes]
            self._listed[table] = found
        return [(r, p) for r, p in self._listed[table] if p not in self.damaged]

    def snapshot(self, recording: HostRecording) -> HostSnapshot:
        """The state of one host's recording this fleet reads (taken once; see the class's doc).
        The metadata's counts (rows written, rotated out) become those of that state."""
        key = (recording.root, recording.host)
        if key not in self._snapshots:
            taken = HostSnapshot(recording.root, recording.host)
            self._snapshots[key] = taken
            for why in taken.skipped:
                self.skip(why)
            self.notes += [n for n in taken.notes if n not in self.notes]
            for name in ("rows", "bytes", "rotated_out"):
                value = taken.counts.get(name)
                if isinstance(value, int if name == "bytes" else dict) and well_formed(name, value):
                    recording.meta[name] = value
        return self._snapshots[key]

    def steady(self, recording: HostRecording) -> bool:
        """Whether a host's parts stay as listed until ``close()`` (``HostSnapshot.steady``)."""
        return self.snapshot(recording).steady

    def refresh(self) -> None:
        """Forget the part lists of the hosts not read as one steady state: the next ``parts()``
        lists their files as they are now (after a recorder merged some of them away)."""
        self._listed.clear()
        for key, taken in list(self._snapshots.items()):
            if not taken.steady:
                taken.close()
                del self._snapshots[key]

    def close(self) -> None:
        """Let go of every host's state: their recorders may delete what they merged or rotated
        out. The part lists are forgotten."""
        self._listed.clear()
        for taken in self._snapshots.values():
            taken.close()
        self._snapshots.clear()

    def skip(self, why: str) -> None:
        """Name something that could not be read (once)."""
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


def _identity(recording: HostRecording) -> tuple[Any, ...] | None:
    """What makes two copies the same recording: the host, its boot and the recorder's start
    (None when the metadata does not say when it started)."""
    started = recording.meta.get("started")
    if started is None:
        return None
    return recording.host, recording.meta.get("boot_id"), started


def _fullest(copies: list[HostRecording]) -> HostRecording:
    """Of copies of one recording, the one to read: complete, then the latest end, then the most
    rows; the first found on a tie."""
    def rows(recording: HostRecording) -> int:
        counts = recording.meta.get("rows")
        return sum(v for v in counts.values() if isinstance(v, int)) if isinstance(counts, dict) else 0

    def ended(recording: HostRecording) -> float:
        value = recording.meta.get("ended")
        return float(value) if isinstance(value, int | float) else float("-inf")

    return max(enumerate(copies), key=lambda item: (bool(item[1].meta.get("complete")), ended(item[1]),
                                                     rows(item[1]), -item[0]))[1]


def without_copies(hosts: list[HostRecording], notes: list[str]) -> list[HostRecording]:
    """``hosts`` with each recording once: of the copies of one (same host, boot and start), the
    fullest is kept and the others are named in ``notes``."""
    groups: dict[tuple[Any, ...], list[HostRecording]] = {}
    for recording in hosts:
        key = _identity(recording)
        if key is not None:
            groups.setdefault(key, []).append(recording)
    dropped = set()
    for copies in groups.values():
        if len(copies) < 2:
            continue
        kept = _fullest(copies)
        for copy in copies:
            if copy is not kept:
                dropped.add(id(copy))
                notes.append(f"{copy.root}: host {copy.host} is a second copy of the recording in {kept.root} (the "
                             "same host, boot and start): read once, from there")
    return [h for h in hosts if id(h) not in dropped]


def find_fleet(paths: str | Path | list[str | Path]) -> Fleet:
    """The fleet of recordings at or under ``paths``. Raises FdtraceError (one line) when a path
    does not exist or holds no recording, or when no host at all can be read; hosts whose
    metadata cannot be used are left out and named in ``skipped``, second copies of a host's
    recording in ``notes``."""
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
            if any(h.root == root for h in hosts):
                continue  # given twice
            try:
                metas = read_meta(root, skipped)
            except FdtraceError as error:
                skipped.append(str(error))
                continue
            hosts += [HostRecording(root, host, meta) for host, meta in metas.items()]
    if not hosts:
        raise FdtraceError(skipped[0] if skipped else "no recording to read")
    notes: list[str] = []
    return Fleet(without_copies(hosts, notes), skipped, notes=notes)


def fleet_roots(paths: str | Path | list[str | Path]) -> list[Path]:
    """The recording directories at or under ``paths`` (see ``find_fleet``), each once."""
    roots: list[Path] = []
    for given in [Path(p) for p in (paths if isinstance(paths, list) else [paths])]:
        found = _recordings_under(given, MAX_DEPTH) if given.is_dir() else []
        roots += [r for r in found or [given] if r not in roots]
    return roots
