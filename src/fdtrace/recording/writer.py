"""Writes a recording: buffered tables flushed as whole Parquet part files of the declared
schemas (see layout.py)."""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import functools
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from fdtrace.errors import FdtraceError
from fdtrace.policy import is_system_uid
from fdtrace.recording.layout import (
    TABLES,
    host_folder,
    lock_name,
    meta_name,
    parquet_options,
    part_name,
    part_names,
    part_range,
)
from fdtrace.recording.manifest import MAX_MANIFEST_BYTES, Manifest, manifest_name, readers_lock_name
from fdtrace.recording.summaries import SUMMARY_KEY, encode, merge, read_summary, summarize, without_summary
from fdtrace.recording.upgrade import upgrade
from fdtrace.safe_files import (
    PRIVATE_DIR,
    PRIVATE_FILE,
    SHARED_DIR,
    SHARED_FILE,
    HeldDirectory,
)
from fdtrace.schema import SCHEMA_VERSION

#: Bytes of a metadata file read at most when a recording is resumed.
MAX_META_BYTES = 1 << 20
#: Flushes that may wait for the writer thread before the caller is held back.
MAX_PENDING_WRITES = 3

T = TypeVar("T")


@dataclass
class _Part:
    first: int
    last: int
    name: str
    rows: int
    size: int
    start_ns: int = 0  # the CLOCK_MONOTONIC times its rows fall in
    end_ns: int = 0
    kept: bool = False  # it covers an incident window


@dataclass
class IncidentWindow:
    """The incidents of one program close in time, and the time around them whose parts a ring
    keeps (CLOCK_MONOTONIC ns; ``wall_offset_ns`` turns them into UTC).

    ``start_ns``/``end_ns`` is what the budget holds now: the parts with the incidents first,
    then wider (``level``, an index into the writer's ladder of seconds before and after) as
    far as ``keep_before``/``keep_after`` when the budget allows."""

    start_ns: int
    end_ns: int
    first_ns: int
    wall_offset_ns: int
    kinds: dict[str, int]
    last_ns: int = -1
    program: str = ""
    uid: int | None = None
    ordinal: int = 0  # the program's how-many-th window (0: its first)
    level: int = 0
    cap: int = 1 << 30  # the widest level it may have: once trimmed, what went is not there to widen over

    def __post_init__(self) -> None:
        if self.last_ns < self.first_ns:
            self.last_ns = self.first_ns

    @property
    def incidents(self) -> int:
        return sum(self.kinds.values())


#: An incident for ``RecordingWriter.mark_incidents``: (CLOCK_MONOTONIC ns, failure class,
#: program, real uid of its process or None when unknown).
Incident = tuple[int, str, str, "int | None"]

#: A program's failures this close together are one window; one failing on and on starts a new
#: window this often, so that its first and its latest stay apart (and the ones between go first).
WINDOW_GAP_NS = 10 * 10**9
WINDOW_SPAN_NS = 10 * 10**9
#: Windows held at most (the rest given up, counted), and per program besides its first and latest.
MAX_WINDOWS = 64
MAX_MIDDLE_WINDOWS = 4
#: The ladder of seconds around a window's incidents that the budget widens it by, step by step.
WIDENING_S = (0, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)


class RecordingWriter:
    """One host's side of a recording directory.

    ``add()`` buffers rows in memory; ``flush()`` writes each buffered table as a new part file
    (temporary name, fsync, rename), so a recorder killed at any moment leaves only complete
    files and loses at most what it buffered since the last flush. Parts are numbered by flush,
    alike in every table, so a number stands for the same interval everywhere.

    ``compact()`` merges the parts written since the last compaction into one file per table
    (``--rotate``); ``max_size`` keeps the recording under that many bytes by deleting its oldest
    parts, counted in the metadata as ``rotated_out`` (``--max-size``).

    A flight recorder, with ``max_size``: ``mark_incidents()`` gathers incidents into windows,
    one per program and burst (``WINDOW_GAP_NS``, ``WINDOW_SPAN_NS``). The parts of every table
    that a window covers are kept, apart from the ring, under ``keep_incidents`` bytes of their
    own, shared out at each flush (``_allocate``): first root's and the system services'
    windows (uid below 1000), then the users' (in turn per uid); within each, a program's first
    window before its latest, before the ones between (newest first); each window gets the parts that hold its
    incidents first, and is widened towards ``keep_before_ns``/``keep_after_ns`` only once every
    window of its rank holds its incidents. A window is trimmed before it is given up, and given
    up only when even the parts with its incidents do not fit (counted in the metadata as
    ``incidents_dropped``); the kept ones are listed there as ``incident_windows``, with what
    each kept. Parts that a window keeps are never merged with the ring's (``_compact``), so a
    window can be trimmed a second at a time.

    ``resume``: a recording of this host already in ``root`` is continued (a service's restart):
    its parts, what it counted and its incident windows are taken over, and numbering goes on
    after its last part.
    """

    def __init__(self, root: Path, host: str, meta: dict[str, Any], shared: bool = False,
                 max_size: int | None = None, keep_incidents: int | None = None,
                 keep_before_ns: int = 60 * 10**9, keep_after_ns: int = 30 * 10**9,
                 resume: bool = False) -> None:
        self.root = Path(root)
        self.host = host
        self.meta = dict(meta)
        self.max_size = max_size
        self.keep_incidents = keep_incidents if keep_incidents is not None else (max_size or 0) // 2
        self.keep_before_ns = keep_before_ns
        self.keep_after_ns = keep_after_ns
        self._windows: list[IncidentWindow] = []
        self._programs: dict[tuple[str, int | None], list[IncidentWindow]] = {}
        self._befores = _ladder(keep_before_ns)
        self._afters = _ladder(keep_after_ns)
        self.incidents_dropped: dict[str, int] = {"windows": 0, "incidents": 0, "bytes": 0}
        self._last_flush_ns = time.monotonic_ns()
        self._wall_offset_ns = time.clock_gettime_ns(time.CLOCK_REALTIME) - self._last_flush_ns
        self._other_boot = False  # resumed parts of another boot: their times come from UTC
        self._size = 0
        self._kept_bytes = 0
        self.file_mode = SHARED_FILE if shared else PRIVATE_FILE
        self.dir_mode = SHARED_DIR if shared else PRIVATE_DIR
        self.bytes_written = 0
        self.rows_written: dict[str, int] = dict.fromkeys(TABLES, 0)
        self.rotated_out: dict[str, Any] = {"files": 0, "bytes": 0, "rows": dict.fromkeys(TABLES, 0)}
        self._buffers: dict[str, list[pa.Table]] = {t: [] for t in TABLES}
        self._parts: dict[str, list[_Part]] = {t: [] for t in TABLES}
        self._unmerged: dict[str, int] = dict.fromkeys(TABLES, 0)  # parts since the last compaction
        self._flush_number = 1
        self._lock_depth = 0
        self._generation = 0  # of the manifest this writer published or took over last
        self._retired: dict[str, list[str]] = {t: [] for t in TABLES}  # out of the manifest, still on disk
        self._folders: dict[str, HeldDirectory] = {}
        self._locks: dict[str, int] = {}
        self._open_folders(resume)
        try:
            if resume:
                self._resume()
            with self._locked():  # the manifest before the metadata: a reader that finds one finds both
                self._publish()
        except BaseException:
            self._release_folders()
            raise
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fdtrace-writer")
        self._pending: list[Future[None]] = []
        self.write_meta(complete=False)

    def _open_folders(self, resume: bool) -> None:
        """Open the recording's folders once, each checked, and hold them: every later write,
        merge and deletion goes through these descriptors, so a folder renamed or swapped for a
        link meanwhile is never written through (``fdtrace.safe_files``)."""
        held = [HeldDirectory.open(self.root, create_mode=self.dir_mode)]
        try:
            meta = held[0].subdirectory("meta", self.dir_mode)
            held.append(meta)
            if meta.exists(meta_name(self.host)) and not resume:
                raise FdtraceError(f"{self.root} already holds a recording of host {self.host}: choose another -o, "
                                   "or --resume to continue it")
            for table in TABLES:
                with held[0].subdirectory(table, self.dir_mode) as folder:
                    held.append(folder.subdirectory(host_folder(self.host), self.dir_mode))
        except BaseException:
            for folder in held:
                folder.close()
            raise
        self._folders = {"root": held[0], "meta": held[1], **dict(zip(TABLES, held[2:], strict=True))}
        # Both locks held open for the writer's life; the readers' one private even when --shared:
        # only its owner may hold deletions back (see fdtrace.recording.manifest).
        for key, name, mode in (("writers", lock_name(self.host), self.file_mode),
                                ("readers", readers_lock_name(self.host), PRIVATE_FILE)):
            try:
                self._locks[key] = self._folders["meta"].open_lock(name, mode)
            except OSError as exc:
                self._release_folders()
                raise FdtraceError(f"{self.root / 'meta' / name}: cannot open the recording's lock ({exc.strerror}): "
                                   "is it a link or a FIFO someone planted?") from None

    def _resume(self) -> None:
        """Take over the recording of this host already here (see the class's doc)."""
        name = meta_name(self.host)
        if not self._folders["meta"].exists(name):
            return
        try:
            with self._folders["meta"].open_file(name) as file:
                old = json.loads(file.read(MAX_META_BYTES + 1)[:MAX_META_BYTES])
            if not isinstance(old, dict):
                raise ValueError("not an object")
        except (OSError, ValueError) as exc:
            self._release_folders()
            raise FdtraceError(f"{self.root}: cannot resume its recording of {self.host}: its metadata is unreadable "
                               f"({exc}); record into another directory") from None
        if old.get("schema_version") != self.meta.get("schema_version"):
            self._release_folders()
            raise FdtraceError(f"{self.root}: its recording of {self.host} has schema {old.get('schema_version')!r}, "
                               f"this fdtrace writes {self.meta.get('schema_version')}: record into another directory")
        self._other_boot = old.get("boot_id") != self.meta.get("boot_id")
        self.bytes_written = _count(old.get("bytes"))
        rows, rotated = old.get("rows"), old.get("rotated_out")
        self.rows_written = {t: _count(rows.get(t) if isinstance(rows, dict) else 0) for t in TABLES}
        if isinstance(rotated, dict):
            found = rotated.get("rows")
            rotated_rows: dict[str, Any] = found if isinstance(found, dict) else {}
            self.rotated_out = {"files": _count(rotated.get("files")), "bytes": _count(rotated.get("bytes")),
                                "rows": {t: _count(rotated_rows.get(t)) for t in TABLES}}
        dropped = old.get("incidents_dropped")
        if isinstance(dropped, dict):
            self.incidents_dropped = {k: _count(dropped.get(k)) for k in self.incidents_dropped}
        for window in old.get("incident_windows") or []:
            try:
                kinds = {str(k): _count(v) for k, v in dict(window["incidents"]).items()}
                start, end, first = (int(window[k]) - self._wall_offset_ns for k in ("start", "end", "first"))
                last = int(window.get("last", window["first"])) - self._wall_offset_ns
                program = str(window.get("program", ""))
                uid = window.get("uid")
                uid = uid if isinstance(uid, int) and not isinstance(uid, bool) else None
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            self._open_window(IncidentWindow(start, end, first, self._wall_offset_ns, kinds, last, program, uid))
        self.meta.update(first_started=old.get("first_started", old.get("started")),
                         runs=_count(old.get("runs", 1)) + 1)
        manifest = self._read_manifest()
        if manifest is not None:
            self._adopt(manifest)
        else:  # written before manifests: its parts as the folders list them
            self._refresh()
        self._unmerged = dict.fromkeys(TABLES, 0)  # what the last run wrote stays as it is
        self._flush_number = 1 + max((part.last for parts in self._parts.values() for part in parts), default=0)

    def _release_folders(self) -> None:
        for folder in self._folders.values():
            folder.close()
        self._folders = {}
        for fd in self._locks.values():
            os.close(fd)
        self._locks = {}

    #: Descriptors a writer holds open while it records (its folders, two locks, a part being
    #: written and one being merged, the manifest being written).
    DESCRIPTORS = len(TABLES) + 7

    @property
    def size(self) -> int:
        """Bytes of the part files the recording holds now."""
        return self._size

    def _insert(self, table: str, part: _Part, at: int | None = None) -> None:
        part.kept = False  # until the next _allocate
        parts = self._parts[table]
        parts.insert(len(parts) if at is None else at, part)
        self._size += part.size
        self._kept_bytes += part.size if part.kept else 0

    def _remove(self, table: str, index: int) -> _Part:
        part = self._parts[table].pop(index)
        self._size -= part.size
        self._kept_bytes -= part.size if part.kept else 0
        return part

    def _recount(self) -> None:
        """Sizes and kept flags again from the part lists (after they were read from disk)."""
        self._size = sum(part.size for parts in self._parts.values() for part in parts)
        self._allocate()

    def add(self, table: str, rows: pa.Table) -> None:
        """Buffer rows for ``table`` until the next flush."""
        if rows.num_rows:
            self._buffers[table].append(rows)

    # Disk work runs on one writer thread, in order, so the caller can go on draining the ring
    # buffer while a second's worth of events is compressed and written (pyarrow and file I/O
    # release the GIL). Errors surface at the caller's next call, or at wait().

    def _submit(self, work: Callable[..., None], *args: Any, wait: bool) -> None:
        for future in [f for f in self._pending if f.done()]:
            self._pending.remove(future)
            future.result()
        while len(self._pending) >= MAX_PENDING_WRITES:  # behind: hold the caller back
            self._pending.pop(0).result()
        self._pending.append(self._executor.submit(work, *args))
        if wait:
            self.wait()

    def wait(self) -> None:
        """Wait until everything submitted is on disk; raises the first error of the writes."""
        while self._pending:
            self._pending.pop(0).result()

    def close(self) -> None:
        """Wait for the writes, delete the parts merged or rotated out when no reader holds them
        (else they are left named in the manifest, for the next writer), and stop the writer
        thread."""
        try:
            self._submit(self._finish, wait=True)
        finally:
            self._executor.shutdown(wait=True)
            self._release_folders()

    def abandon(self) -> None:
        """After a failed write: let the writes still queued finish or fail, quietly, and stop."""
        for future in self._pending:
            future.exception()
        self._pending.clear()
        self._executor.shutdown(wait=True)
        self._release_folders()

    def flush(self, wait: bool = True) -> None:
        """Write every buffered table as a complete part file (in the background if not ``wait``)."""
        number = self._flush_number
        self._flush_number += 1
        pending = {table: buffered for table, buffered in self._buffers.items() if buffered}
        self._buffers = {t: [] for t in TABLES}
        self._submit(self._write_flush, number, pending, time.monotonic_ns(), wait=wait)

    def mark_incidents(self, incidents: list[Incident], wall_offset_ns: int) -> None:
        """Keep what the recording holds around these incidents (see ``Incident``), under
        ``keep_incidents`` (only with ``max_size``: a recording without one deletes nothing)."""
        if self.max_size is not None and incidents:
            self._submit(self._add_windows, list(incidents), wall_offset_ns, wait=False)

    def _add_windows(self, incidents: list[Incident], wall_offset_ns: int) -> None:
        for at_ns, kind, program, uid in sorted(incidents, key=lambda i: i[0]):
            windows = self._programs.get((program, uid))
            last = windows[-1] if windows else None
            if last is not None and at_ns - last.last_ns <= WINDOW_GAP_NS and at_ns - last.first_ns <= WINDOW_SPAN_NS:
                last.last_ns = max(last.last_ns, at_ns)
                last.kinds[kind] = last.kinds.get(kind, 0) + 1
                continue
            self._open_window(IncidentWindow(at_ns, at_ns, at_ns, wall_offset_ns, {kind: 1}, at_ns, program, uid))

    def _open_window(self, window: IncidentWindow) -> None:
        """A new window of its program; past the program's or the writer's share of windows, the
        lowest in rank is given up (counted)."""
        windows = self._programs.setdefault((window.program, window.uid), [])
        window.ordinal = windows[-1].ordinal + 1 if windows else 0
        windows.append(window)
        self._windows.append(window)
        if len(windows) > MAX_MIDDLE_WINDOWS + 2:  # the oldest between its first and its latest
            self._give_up(windows[1], 0)
        if len(self._windows) > MAX_WINDOWS:
            self._give_up(max(self._windows, key=self._rank), 0)

    def _give_up(self, window: IncidentWindow, held: int) -> None:
        self._windows.remove(window)
        windows = self._programs[(window.program, window.uid)]
        windows.remove(window)
        if not windows:  # its next failure opens its first window again: this one is gone
            del self._programs[(window.program, window.uid)]
        self.incidents_dropped["windows"] += 1
        self.incidents_dropped["incidents"] += window.incidents
        self.incidents_dropped["bytes"] += held

    def _rank(self, window: IncidentWindow) -> tuple[int, int, int]:
        """A window's place in the budget (lower first): root's and system services' windows
        before users'; a program's first window, then its latest, then those between (newest
        first); by time within each."""
        windows = self._programs.get((window.program, window.uid)) or [window]
        place = 0 if window.ordinal == 0 else 1 if window is windows[-1] else 2
        return (0 if is_system_uid(window.uid) else 1, place,
                -window.first_ns if place == 2 else window.first_ns)

    def _fairly(self, ordered: list[IncidentWindow]) -> list[IncidentWindow]:
        """Windows in rank order, the users' taken in turn per uid within each place (a user with
        many programs gets no more of the budget's first share than one with a single one)."""
        turns: dict[tuple[int, int, int | None], int] = {}
        keyed = []
        for order, window in enumerate(ordered):
            tier, place, _ = self._rank(window)
            turn = 0
            if tier:
                turn = turns.get((tier, place, window.uid), 0)
                turns[(tier, place, window.uid)] = turn + 1
            keyed.append(((tier, place, turn, order), window))
        return [window for _, window in sorted(keyed, key=lambda item: item[0])]

    def _extent(self, window: IncidentWindow, level: int) -> tuple[int, int]:
        before = self._befores[min(level, len(self._befores) - 1)]
        after = self._afters[min(level, len(self._afters) - 1)]
        return window.first_ns - before, window.last_ns + after

    def _allocate(self) -> None:
        """Share ``keep_incidents`` among the windows (see the class's doc) and mark the parts it
        keeps; a window whose incidents' own parts do not fit is given up."""
        by_table = [(parts, [part.end_ns for part in parts]) for parts in self._parts.values()]
        chosen: set[int] = set()
        used = 0

        def cost(start: int, end: int) -> tuple[int, list[_Part]]:
            found, total = [], 0
            for parts, ends in by_table:
                for index in range(bisect.bisect_left(ends, start), len(parts)):
                    part = parts[index]
                    if part.start_ns > end:
                        break
                    if id(part) not in chosen and part.end_ns >= start and part.end_ns:
                        found.append(part)
                        total += part.size
            return total, found

        levels = max(len(self._befores), len(self._afters))
        ordered = self._fairly(sorted(self._windows, key=self._rank))
        for tier in (True, False):
            windows = [w for w in ordered if is_system_uid(w.uid) == tier]
            held = []
            for window in windows:
                need, found = cost(*self._extent(window, 0))
                if used + need > self.keep_incidents:
                    self._give_up(window, need)
                    continue
                used += need
                chosen.update(id(part) for part in found)
                window.level = 0
                held.append(window)
            for level in range(1, levels):
                widening = [w for w in held if w.level == level - 1 and w.cap >= level]
                if not widening:
                    break
                for window in widening:
                    need, found = cost(*self._extent(window, level))
                    if used + need <= self.keep_incidents:
                        used += need
                        chosen.update(id(part) for part in found)
                        window.level = level
        for window in self._windows:
            window.cap = window.level
            window.start_ns, window.end_ns = self._extent(window, window.level)
        kept = 0
        for parts, _ in by_table:
            for part in parts:
                part.kept = id(part) in chosen
                kept += part.size if part.kept else 0
        self._kept_bytes = kept

    def trimmed(self) -> int:
        """Windows kept narrower than --keep-before/--keep-after (the budget held no more)."""
        top = max(len(self._befores), len(self._afters)) - 1
        return sum(window.level < top for window in self._windows)

    @staticmethod
    def _span(part: _Part) -> tuple[int, int]:
        """The CLOCK_MONOTONIC times a part's rows fall in."""
        return part.start_ns, part.end_ns

    def _write_flush(self, number: int, pending: dict[str, list[pa.Table]], asked_ns: int) -> None:
        # Under the writers' lock from the start: a manifest compact published meanwhile is
        # taken over before this flush's parts join the lists.
        with self._locked():
            self._write_flush_locked(number, pending, asked_ns)
        self._collect()

    def _write_flush_locked(self, number: int, pending: dict[str, list[pa.Table]], asked_ns: int) -> None:
        start_ns, self._last_flush_ns = self._last_flush_ns, asked_ns
        # Encoded first, so that the parts they push out of the budget are deleted before they
        # are written: the files on disk never hold more than the budget plus the parts a reader
        # still has open.
        encoded = {table: _encoded_parquet(table, upgrade(table, pa.concat_tables(buffered, promote_options="default"),
                                                          SCHEMA_VERSION))
                   for table, buffered in pending.items()}
        if self.max_size is not None:
            self._make_room(sum(body.size for _, body in encoded.values()))
        for table, (rows, body) in encoded.items():
            name = part_name(number, number)
            size = self._guard(functools.partial(self._folders[table].write_file, name,
                                                 functools.partial(_write_buffer, body), self.file_mode))
            self._insert(table, _Part(number, number, name, rows, size, start_ns, asked_ns))
            self._unmerged[table] += 1
            self.rows_written[table] += rows
            self.bytes_written += size
        if self.max_size is not None:
            self._rotate_out()
        self._publish()

    def _finish(self) -> None:
        with self._locked():
            self._collect()
            self._publish()

    def compact(self, wait: bool = True) -> None:
        """Merge each table's parts since the last compaction into one file (see ``_compact``)."""
        self._submit(self._compact, wait=wait)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the host's writers' lock (``layout.lock_path``) while the parts change and the
        manifest is published, so that ``fdtrace compact`` and this writer never publish over each
        other; when the manifest on disk is not the one this writer published last (compact
        changed the parts), take its parts over first."""
        if self._lock_depth == 0:
            fcntl.flock(self._locks["writers"], fcntl.LOCK_EX)
            try:
                manifest = self._read_manifest()
                if manifest is not None and manifest.generation != self._generation:
                    self._adopt(manifest)
            except BaseException:
                fcntl.flock(self._locks["writers"], fcntl.LOCK_UN)
                raise
        self._lock_depth += 1
        try:
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0:
                fcntl.flock(self._locks["writers"], fcntl.LOCK_UN)

    def _read_manifest(self) -> Manifest | None:
        """The manifest on disk (None: there is none, or it cannot be used: this writer's own
        state is then published over it)."""
        from fdtrace.recording.reader import loads_bounded

        try:
            with self._folders["meta"].open_file(manifest_name(self.host)) as file:
                return Manifest.decode(loads_bounded(file.read(MAX_MANIFEST_BYTES + 1)[:MAX_MANIFEST_BYTES]))
        except (OSError, ValueError):
            return None

    def _publish(self) -> None:
        """Publish the parts as they are now as the next generation of the manifest (under the
        writers' lock)."""
        assert self._lock_depth > 0
        manifest = Manifest(self._generation + 1, {t: [p.name for p in parts] for t, parts in self._parts.items()},
                            {t: list(names) for t, names in self._retired.items()},
                            {"rows": dict(self.rows_written), "bytes": self.bytes_written,
                             "rotated_out": json.loads(json.dumps(self.rotated_out))})
        text = manifest.encode()
        self._guard(lambda: self._folders["meta"].write_file(manifest_name(self.host), lambda out: out.write(text),
                                                              self.file_mode))
        self._generation = manifest.generation

    def _retire(self, table: str, name: str) -> None:
        """A part taken out of the recording: deleted by ``_collect`` once no reader can need it."""
        self._retired[table].append(name)

    def _collect(self) -> None:
        """Delete the retired parts if no reader holds the readers' lock now (never waiting for
        one: else at the next flush, merge or close). Called after the manifest without them
        was published, so a reader that takes the lock later never lists them."""
        if not any(self._retired.values()):
            return
        try:
            fcntl.flock(self._locks["readers"], fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a reader of an older state holds it
        try:
            for table, names in self._retired.items():
                for name in names:
                    try:
                        self._folders[table].unlink(name)
                    except FileNotFoundError:
                        continue  # deleted already (by fdtrace compact, or before a crash)
                    except OSError as exc:
                        raise FdtraceError(f"{self.root}: cannot delete a merged part {name} "
                                           f"({exc.strerror})", exit_code=1) from None
                names.clear()
        finally:
            fcntl.flock(self._locks["readers"], fcntl.LOCK_UN)

    def _adopt(self, manifest: Manifest) -> None:
        """Take over the parts of a manifest someone else published (``fdtrace compact``, or the
        run of the recorder before a resume): parts known keep what this writer knows of them,
        others are read from their footers; its retired parts are deleted with this writer's."""
        for table in TABLES:
            self._parts[table] = self._described(table, manifest.parts.get(table, []))
            retired = self._retired[table]
            retired += [name for name in manifest.retired.get(table, []) if name not in retired]
            self._unmerged[table] = min(self._unmerged[table], self._singles(table))
        self._generation = manifest.generation
        self._recount()

    def _described(self, table: str, names: list[str]) -> list[_Part]:
        """``_Part``s of these names of a table (footers read for those this writer has not
        written; one that cannot be read is left out)."""
        folder = self._folders[table]
        known = {part.name: part for part in self._parts[table]}
        fresh = []
        for name in names:
            part = known.get(name)
            covered = part_range(Path(name))
            try:
                if part is None and covered is not None:
                    with folder.open_file(name) as file:
                        metadata = pq.read_metadata(file)
                    part = _Part(covered[0], covered[1], name, metadata.num_rows, 0,
                                 *_stored_span(metadata, self._wall_offset_ns if self._other_boot else None))
                if part is not None:
                    part.size = folder.lstat(name).st_size  # compact may have rewritten it in place
                    fresh.append(part)
            except (OSError, pa.ArrowException):
                continue
        return fresh

    def _singles(self, table: str) -> int:
        """How many of a table's newest parts are a flush's own (not merged)."""
        singles = 0
        for part in reversed(self._parts[table]):
            if part.first != part.last:
                break
            singles += 1
        return singles

    def _refresh(self) -> None:
        """The part lists as the folders have them (a recording written before manifests):
        merged files replace the parts they cover, which are retired."""
        for table in TABLES:
            listed = self._folders[table].names()
            kept = part_names(listed)
            self._parts[table] = self._described(table, kept)
            self._retired[table] += [n for n in listed if part_range(Path(n)) is not None and n not in kept]
            self._unmerged[table] = min(self._unmerged[table], self._singles(table))
        self._recount()

    def _compact(self) -> None:
        """Merge each table's parts since the last compaction into one file.

        The merged file is complete under its final name before the parts go; a reader that
        finds both (a crash in between) reads the merged file and skips the parts it covers.
        The parts are copied one at a time, each a row group of the merged file: a minute of a
        million events a second merges in the memory of one second's part.
        """
        with self._locked():
            self._compact_locked()
            self._publish()
        self._collect()

    def _compact_locked(self) -> None:
        if self.max_size is not None and self._windows:
            self._allocate()
        for table, parts in self._parts.items():
            count = self._unmerged[table]
            self._unmerged[table] = 0
            if count < 2:
                continue
            # The parts an incident window keeps stay as they are (a window is trimmed part by
            # part); each run of the others between them becomes one file.
            runs: list[list[_Part]] = [[]]
            for part in parts[-count:]:
                if part.kept:
                    runs.append([])
                else:
                    runs[-1].append(part)
            for merging in (run for run in runs if len(run) >= 2):
                self._merge(table, merging)

    def _merge(self, table: str, merging: list[_Part]) -> None:
        parts = self._parts[table]
        if self.max_size is not None:  # the merged file sits beside its parts until they go
            self._make_room(sum(part.size for part in merging), keep=tuple(merging))
            if any(part.kept for part in merging):  # the budget changed its mind meanwhile: leave them
                return
        name = part_name(merging[0].first, merging[-1].last)
        folder = self._folders[table]
        merge = functools.partial(_merge_parts, table, folder, merging)
        size = self._guard(functools.partial(folder.write_file, name, merge, self.file_mode))
        for part in merging:
            self._retire(table, part.name)
        rows = sum(part.rows for part in merging)
        at = next(index for index, part in enumerate(parts) if part is merging[0])
        for _ in merging:
            self._remove(table, at)
        self._insert(table, _Part(merging[0].first, merging[-1].last, name, rows, size,
                                  min(p.start_ns for p in merging), max(p.end_ns for p in merging)), at)

    def _make_room(self, reserve: int, keep: tuple[_Part, ...] = ()) -> None:
        """Rotate out (``_rotate_out``) so that ``reserve`` bytes about to be written fit, and
        delete what went now rather than after the write: published first, so no reader that
        comes later lists it (one holding the readers' lock keeps it until the next collection)."""
        self._rotate_out(reserve=reserve, keep=keep)
        if any(self._retired.values()):
            self._publish()
            self._collect()

    def _rotate_out(self, reserve: int = 0, keep: tuple[_Part, ...] = ()) -> None:
        """Share the incident budget out again (``_allocate``), then delete the oldest parts
        outside the incident windows until they, and ``reserve`` bytes more (a merged file about
        to be written beside its parts), fit ``max_size``, keeping the newest part of each table
        and the parts in ``keep``."""
        assert self.max_size is not None
        if self._windows:
            self._allocate()
        elif self._kept_bytes:
            for parts in self._parts.values():
                for part in parts:
                    part.kept = False
            self._kept_bytes = 0
        while self._size - self._kept_bytes + reserve > self.max_size:
            candidates = []
            for table, parts in self._parts.items():
                for index, part in enumerate(parts[:-1]):  # the newest part of each table stays
                    if not part.kept and not any(part is k for k in keep):
                        candidates.append((part.first, table, index))
                        break
            if not candidates:
                return
            _, table, index = min(candidates)
            unmerged_from = len(self._parts[table]) - self._unmerged[table]
            part = self._remove(table, index)
            if index >= unmerged_from:  # one of the parts not merged yet
                self._unmerged[table] -= 1
            self._retire(table, part.name)
            self.rotated_out["files"] += 1
            self.rotated_out["bytes"] += part.size
            self.rotated_out["rows"][table] += part.rows

    def incident_windows(self) -> list[dict[str, Any]]:
        """The incident windows kept, for the metadata (times as UTC ns): what each keeps, its
        first and last incident, its program and its process's uid, and whether it was trimmed
        (narrower than --keep-before/--keep-after)."""
        top = max(len(self._befores), len(self._afters)) - 1
        return [{"start": window.start_ns + window.wall_offset_ns, "end": window.end_ns + window.wall_offset_ns,
                 "first": window.first_ns + window.wall_offset_ns, "last": window.last_ns + window.wall_offset_ns,
                 "incidents": dict(window.kinds), "program": window.program, "uid": window.uid,
                 "trimmed": window.level < top}
                for window in sorted(self._windows, key=lambda w: w.first_ns)]

    def write_meta(self, complete: bool, wait: bool = True, **updates: Any) -> None:
        """Write the metadata file (atomically); ``complete`` marks a clean end."""
        self._submit(self._write_meta, complete, updates, wait=wait)

    def _write_meta(self, complete: bool, updates: dict[str, Any]) -> None:
        self.meta.update(updates, complete=complete, rows=self.rows_written, bytes=self.bytes_written,
                         rotated_out=self.rotated_out)
        if self.max_size is not None:
            self.meta.update(incident_windows=self.incident_windows(), incidents_dropped=self.incidents_dropped,
                             incidents_trimmed=self.trimmed(),
                             keep_incidents=self.keep_incidents, max_size=self.max_size)
        text = json.dumps(self.meta, indent=1, sort_keys=True).encode()
        self._guard(lambda: self._folders["meta"].write_file(meta_name(self.host), lambda out: out.write(text),
                                                              self.file_mode))

    def _guard(self, action: Callable[[], T]) -> T:
        try:
            return action()
        except FileNotFoundError as exc:
            raise FdtraceError(f"{self.root}: a file of the recording went missing while it was written "
                               f"({exc.strerror}): was it deleted or moved by someone else?", exit_code=1) from None
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise FdtraceError(
                    f"{self.root}: disk full: recording stopped; the {sum(self.rows_written.values())} rows "
                    "already written are complete", exit_code=1,
                ) from None
            raise FdtraceError(f"{self.root}: cannot write the recording ({exc.strerror})", exit_code=1) from None


def _ladder(keep_ns: int) -> list[int]:
    """The seconds a window widens by, step by step, up to ``keep_ns`` (ns)."""
    steps = [s * 10**9 for s in WIDENING_S if s * 10**9 < keep_ns]
    return [*steps, keep_ns] if keep_ns > 0 else [0]


def _count(value: Any) -> int:
    """A count as a metadata file holds it (anything else is 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _stored_span(metadata: Any, wall_offset_ns: int | None) -> tuple[int, int]:
    """The CLOCK_MONOTONIC times a part file's rows fall in, from its footer's statistics: of its
    ``ts_ns`` (this boot's clock), or with ``wall_offset_ns`` (a part of another boot) of its
    UTC ``time``; (0, 0) when it has neither (then no incident window keeps it)."""
    column, offset = ("time", wall_offset_ns) if wall_offset_ns is not None else ("ts_ns", 0)
    low, high = None, None
    try:
        index = metadata.schema.names.index(column)
        for group in range(metadata.num_row_groups):
            stats = metadata.row_group(group).column(index).statistics
            if stats is None or not stats.has_min_max:
                return 0, 0
            found_low, found_high = (int(getattr(v, "value", v) if not hasattr(v, "timestamp") else
                                         round(v.timestamp() * 1e9)) for v in (stats.min, stats.max))
            low = found_low if low is None else min(low, found_low)
            high = found_high if high is None else max(high, found_high)
    except (ValueError, TypeError, AttributeError):
        return 0, 0
    return (0, 0) if low is None or high is None else (low - offset, high - offset)


def _encoded_parquet(table: str, data: pa.Table) -> tuple[int, pa.Buffer]:
    """A flush's rows of ``table`` as the bytes of one Parquet file, with their row count."""
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, **parquet_options(table, data.column_names))
    return data.num_rows, sink.getvalue()


def _write_buffer(body: pa.Buffer, out: BinaryIO) -> None:
    out.write(memoryview(body))


def _merge_parts(table: str, folder: HeldDirectory, parts: list[_Part], out: BinaryIO) -> None:
    """Copy part files into one Parquet stream, one part (one row group) at a time; a merge of
    events gets the summary of its rows (``fdtrace.recording.summaries``). A flush gets none:
    summing up a second of a million events would take the writer a tenth of a second it needs
    for writing them."""
    with folder.open_file(parts[0].name) as first:
        schema = without_summary(pq.read_schema(first))
    summaries = []
    with pq.ParquetWriter(out, schema, **parquet_options(table, schema.names)) as merged:
        for part in parts:
            with folder.open_file(part.name) as file:
                data = pq.read_table(file)
                if "kind" in data.column_names:
                    file.seek(0)
                    summaries.append(read_summary(file) or summarize(data))
            data = data.replace_schema_metadata(schema.metadata)
            merged.write_table(data if data.schema.equals(schema) else data.cast(schema))
            del data
        if summaries:
            merged.add_key_value_metadata({SUMMARY_KEY: encode(merge(summaries))})


def write_parquet(rows: pa.Table, out: BinaryIO) -> None:
    """``rows`` as one Parquet file into ``out`` (``fdtrace run --phases-out``: a file of its own,
    not a part of a recording): only the recording package writes or opens Parquet."""
    pq.write_table(rows, out)


def append_part(root: Path, table: str, host: str, rows: pa.Table) -> Path:
    """Add rows to a finished recording as a new part of ``table`` (e.g. the phases that
    `fdtrace run` collects after its recorder has stopped), published in its manifest (under the
    writers' lock) when it has one. Returns the file written."""
    from fdtrace.recording.reader import loads_bounded

    with HeldDirectory.open(Path(root)) as recording, recording.subdirectory("meta") as meta, \
            recording.subdirectory(table, PRIVATE_DIR) as table_folder, \
            table_folder.subdirectory(host_folder(host), PRIVATE_DIR) as folder:
        lock = meta.open_lock(lock_name(host))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            manifest = None
            try:
                with meta.open_file(manifest_name(host)) as file:
                    manifest = Manifest.decode(loads_bounded(file.read(MAX_MANIFEST_BYTES + 1)[:MAX_MANIFEST_BYTES]))
            except (OSError, ValueError):  # none (written before manifests), or unusable: readers list the folder
                manifest = None
            names = part_names(folder.names())
            if manifest is not None:  # numbers it used, for parts since deleted too
                names += manifest.parts.get(table, []) + manifest.retired.get(table, [])
            ranges = [part_range(Path(name)) for name in names]
            last = max((covered[1] for covered in ranges if covered is not None), default=0)
            name = part_name(last + 1, last + 1)
            folder.write_file(name, lambda out: pq.write_table(rows, out, **parquet_options(table, rows.column_names)))
            if manifest is not None:
                manifest.generation += 1
                manifest.parts.setdefault(table, []).append(name)
                text = manifest.encode()
                meta.write_file(manifest_name(host), lambda out: out.write(text),
                                stat.S_IMODE(meta.lstat(manifest_name(host)).st_mode))
        finally:
            os.close(lock)
    return Path(root) / table / host_folder(host) / name
