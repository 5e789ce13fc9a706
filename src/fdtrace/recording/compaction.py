"""``fdtrace compact``: many small part files merged into few large ones per table and host, the
way engines like them (DuckDB and Spark pay per file opened and per row group read).

Safe on a recording that is still being written, by the protocol of its manifest
(``fdtrace.recording.manifest``): the parts are read from one state of the recording, under the
readers' lock, like any reader's; each merged file is written whole beside its parts; then,
under the writers' lock, which the recorder takes to publish its own changes, the merged files
whose parts are still in the manifest replace them there, and the parts are retired (deleted
when no reader holds the readers' lock, by compact or by the recorder later). A merge whose
parts the recorder changed meanwhile is given up: its file, which no manifest names, is
deleted. A recording written before manifests is compacted as before: merged files renamed
into place beside their parts, which are deleted under the writers' lock.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from fdtrace.errors import FdtraceError
from fdtrace.recording.fleet import HostRecording, find_fleet
from fdtrace.recording.layout import (
    TABLES,
    count_compaction,
    host_folder,
    lock_name,
    parquet_options,
    part_name,
    part_names,
    part_range,
)
from fdtrace.recording.manifest import MAX_MANIFEST_BYTES, Manifest, manifest_name, readers_lock_name
from fdtrace.recording.summaries import SUMMARY_KEY, encode, merge, read_summary, summarize, without_summary
from fdtrace.recording.upgrade import upgrade
from fdtrace.safe_files import HeldDirectory
from fdtrace.schema import TABLES as TABLES_DECLARED
from fdtrace.schema.tables import PARTITION_COLUMN

#: Default size of a merged file.
TARGET_BYTES = 256 << 20
#: Rows per row group of a merged file.
ROW_GROUP_ROWS = 1 << 19


@dataclass
class Compacted:
    """What compaction did to one host's recording."""

    host: str
    files_before: int = 0
    files_after: int = 0
    rows: int = 0
    changed_meanwhile: int = 0  # merged files given up because the recorder changed their parts
    root: Path | None = None


@dataclass
class FleetCompaction:
    """What ``compact_recordings`` found besides the hosts: recordings skipped, and notes."""

    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def compact_recordings(paths: list[str | Path], target: int, found: FleetCompaction
                       ) -> Iterator[Compacted | tuple[str, FdtraceError]]:
    """Compact every host of the recordings at ``paths`` (one recording or a fleet), one after
    the other: each host's ``Compacted``, or its name and root with the one-line error that left
    its parts as they were (the others are compacted). Recordings that could not be used are
    named in ``found``. Raises FdtraceError when ``paths`` hold no recording."""
    fleet = find_fleet(paths)
    try:
        found.skipped += fleet.skipped
        found.notes += fleet.notes
        for recording in fleet.hosts:
            try:
                yield compact_host(recording, target)
            except FdtraceError as error:
                yield f"{recording.host} ({recording.root})", error
    finally:
        fleet.close()


def _current(table: str, data: Any, version: int, schema: Any) -> Any:
    """A part's rows in the table's current declaration (the reader's upgrade step), with every
    column of ``schema`` (optional ones a part lacks as nulls)."""
    import pyarrow as pa

    data = upgrade(table, data, version)
    for spec in schema:
        if spec.name not in data.column_names:
            data = data.append_column(spec, pa.nulls(data.num_rows, spec.type))
    return data.select(schema.names).cast(schema)


def _merge(table: str, version: int, folder: HeldDirectory, parts: list[str], out: BinaryIO) -> int:
    """Copy parts into one Parquet stream of the table's current declaration, in row groups of
    about ROW_GROUP_ROWS rows (parts of older versions are upgraded as the reader would)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    declared = without_summary(TABLES_DECLARED[table].arrow_schema())
    schema = pa.schema([f for f in declared if f.name != PARTITION_COLUMN], metadata=declared.metadata)
    rows = 0
    pending: list[pa.Table] = []
    summaries = []
    with pq.ParquetWriter(out, schema, **parquet_options(table, schema.names)) as merged:
        def write() -> None:
            merged.write_table(pa.concat_tables(pending), row_group_size=ROW_GROUP_ROWS)
            pending.clear()

        for name in parts:
            with folder.open_file(name) as file:
                data = _current(table, pq.read_table(file), version, schema)
                if table == "events":  # their summaries become one (made for older parts)
                    file.seek(0)
                    summaries.append(read_summary(file) or summarize(data))
            pending.append(data)
            rows += data.num_rows
            if sum(t.num_rows for t in pending) >= ROW_GROUP_ROWS:
                write()
        if pending:
            write()
        if summaries:
            merged.add_key_value_metadata({SUMMARY_KEY: encode(merge(summaries))})
    return rows


def _listing(folder: HeldDirectory) -> list[tuple[str, int, int]]:
    """(name, size, mode) of the regular part files of a folder, as they are now."""
    found = []
    for name in part_names(folder.names()):
        try:
            info = folder.lstat(name)
        except FileNotFoundError:  # the recorder merged or rotated it out just now
            continue
        if stat.S_ISREG(info.st_mode):
            found.append((name, info.st_size, stat.S_IMODE(info.st_mode)))
    return found


def _groups(parts: list[tuple[str, int, int]], target: int,
            unsummarized: set[str] | None = None) -> list[list[tuple[str, int, int]]]:
    """Runs of consecutive parts that together stay under ``target`` bytes: at least two each, or
    one part in ``unsummarized`` (events written before part summaries, rewritten with one)."""
    groups: list[list[tuple[str, int, int]]] = []
    run: list[tuple[str, int, int]] = []
    size = 0
    for part in parts:
        if run and size + part[1] > target:
            groups.append(run)
            run, size = [], 0
        run.append(part)
        size += part[1]
    groups.append(run)
    return [g for g in groups if len(g) > 1 or (g and g[0][0] in (unsummarized or set()))]


def _unsummarized(folder: HeldDirectory, parts: list[tuple[str, int, int]]) -> set[str]:
    bare = set()
    for name, _, _ in parts:
        try:
            with folder.open_file(name) as file:
                if read_summary(file) is None:
                    bare.add(name)
        except OSError:
            continue
    return bare


def compact_host(recording: HostRecording, target: int = TARGET_BYTES) -> Compacted:
    """Merge each table's parts of one host; raises FdtraceError (one line) when a file cannot
    be read or written. The recording's folders are held (``HeldDirectory``) from the first
    look to the last deletion."""
    done = Compacted(recording.host, root=recording.root)
    with HeldDirectory.open(recording.root) as root, root.subdirectory("meta") as meta:
        if meta.exists(manifest_name(recording.host)):
            _compact_published(recording, root, meta, target, done)
            return done
        for table in TABLES:
            if not root.exists(table):
                continue
            with root.subdirectory(table) as table_folder:
                if not table_folder.exists(host_folder(recording.host)):
                    continue
                with table_folder.subdirectory(host_folder(recording.host)) as folder:
                    _compact_table(recording, table, folder, meta, target, done)
    return done


def _compact_table(recording: HostRecording, table: str, folder: HeldDirectory, meta: HeldDirectory, target: int,
                   done: Compacted) -> None:
    import pyarrow as pa

    parts = _listing(folder)
    done.files_before += len(parts)
    done.files_after += len(parts)
    bare = _unsummarized(folder, parts) if table == "events" else set()
    for chosen in _groups(parts, target, bare):
        group = [name for name, _, _ in chosen]
        first, last = part_range(Path(group[0])), part_range(Path(group[-1]))
        assert first is not None and last is not None
        merged = part_name(first[0], last[1])
        mode = chosen[0][2]
        try:
            rows = [0]

            def write(out: BinaryIO, chosen: list[str] = group, counted: list[int] = rows) -> None:
                counted[0] = _merge(table, recording.version, folder, chosen, out)

            folder.write_file(merged, write, mode)
        except FileNotFoundError:  # the recorder merged or rotated them out meanwhile
            done.changed_meanwhile += 1
            continue
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise FdtraceError(f"{folder.path}: cannot compact ({' '.join(str(exc).split())[:200]})") from None
        try:
            fd = meta.open_lock(lock_name(recording.host), mode)
        except OSError as exc:
            folder.unlink(merged)  # the parts stay as they were
            raise FdtraceError(f"{meta.path / lock_name(recording.host)}: cannot take the host's lock "
                               f"({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            count_compaction(fd)
            if len(group) == 1:  # rewritten in place, now with its summary
                done.rows += rows[0]
            elif all(folder.exists(name) for name in group):
                for name in group:
                    folder.unlink(name)
                done.files_after -= len(group) - 1
                done.rows += rows[0]
            else:
                folder.unlink(merged)
                done.changed_meanwhile += 1
        finally:
            os.close(fd)


def _lock(meta: HeldDirectory, name: str, mode: int) -> int:
    try:
        return meta.open_lock(name, mode)
    except OSError as exc:
        raise FdtraceError(f"{meta.path / name}: cannot take the host's lock ({exc.strerror})") from None


def _manifest(meta: HeldDirectory, host: str) -> Manifest:
    from fdtrace.recording.reader import loads_bounded

    try:
        with meta.open_file(manifest_name(host)) as file:
            return Manifest.decode(loads_bounded(file.read(MAX_MANIFEST_BYTES + 1)[:MAX_MANIFEST_BYTES]))
    except (OSError, ValueError) as exc:
        raise FdtraceError(f"{meta.path / manifest_name(host)}: unusable manifest "
                           f"({' '.join(str(exc).split())[:200]})") from None


@dataclass
class _Merged:
    table: str
    group: list[str]
    name: str
    rows: int


def _compact_published(recording: HostRecording, root: HeldDirectory, meta: HeldDirectory, target: int,
                       done: Compacted) -> None:
    """Compaction of a recording with a manifest (see the module's doc)."""
    import pyarrow as pa

    host = recording.host
    mode = stat.S_IMODE(meta.lstat(manifest_name(host)).st_mode)
    readers = _lock(meta, readers_lock_name(host), 0o600)
    writers = -1
    folders: dict[str, HeldDirectory] = {}
    try:
        writers = _lock(meta, lock_name(host), mode)
        fcntl.flock(readers, fcntl.LOCK_SH)  # a reader: the recorder deletes nothing read meanwhile
        manifest = _manifest(meta, host)
        merged: list[_Merged] = []
        for table, names in manifest.parts.items():
            if not names:
                continue
            if not root.exists(table):
                continue
            with root.subdirectory(table) as table_folder:
                folders[table] = folder = table_folder.subdirectory(host_folder(host))
            parts = [(name, info.st_size, stat.S_IMODE(info.st_mode)) for name in names
                     if (info := _lstat(folder, name)) is not None and stat.S_ISREG(info.st_mode)]
            done.files_before += len(parts)
            done.files_after += len(parts)
            bare = _unsummarized(folder, parts) if table == "events" else set()
            for chosen in _groups(parts, target, bare):
                group = [name for name, _, _ in chosen]
                first, last = part_range(Path(group[0])), part_range(Path(group[-1]))
                assert first is not None and last is not None
                rows = [0]

                def write(out: BinaryIO, chosen: list[str] = group, counted: list[int] = rows,
                          table: str = table, folder: HeldDirectory = folder) -> None:
                    counted[0] = _merge(table, recording.version, folder, chosen, out)

                name = part_name(first[0], last[1])
                try:
                    folder.write_file(name, write, chosen[0][2])
                except (OSError, pa.ArrowException, ValueError) as exc:
                    raise FdtraceError(f"{folder.path}: cannot compact ({' '.join(str(exc).split())[:200]})") \
                        from None
                merged.append(_Merged(table, group, name, rows[0]))
        fcntl.flock(readers, fcntl.LOCK_UN)
        if not merged and not any(manifest.retired.values()):
            return
        fcntl.flock(writers, fcntl.LOCK_EX)  # the recorder publishes nothing meanwhile
        current = _manifest(meta, host)
        changed = False
        for merge_ in merged:
            live = current.parts.get(merge_.table, [])
            retired = current.retired.setdefault(merge_.table, [])
            if len(merge_.group) == 1 and merge_.name in live:  # rewritten in place, now with its summary
                done.rows += merge_.rows
                continue
            at = live.index(merge_.group[0]) if merge_.group[0] in live else -1
            if at >= 0 and live[at:at + len(merge_.group)] == merge_.group and merge_.name not in live:
                live[at:at + len(merge_.group)] = [merge_.name]
                retired += [name for name in merge_.group if name not in retired]
                done.files_after -= len(merge_.group) - 1
                done.rows += merge_.rows
                changed = True
                continue
            done.changed_meanwhile += 1
            if merge_.name not in live and merge_.name not in retired:  # named by no manifest: nobody reads it
                folders[merge_.table].unlink(merge_.name)
        if changed:
            _publish(meta, host, current, mode)
        collected = _collect(readers, current, folders)
        if collected:  # deleted: no reader can list them again, nor any manifest name them
            for table in collected:
                current.retired.pop(table, None)
            _publish(meta, host, current, mode)
        fcntl.flock(writers, fcntl.LOCK_UN)
    except OSError as exc:
        raise FdtraceError(f"{meta.path}: cannot compact ({exc.strerror})") from None
    finally:
        for folder in folders.values():
            folder.close()
        for fd in (readers, writers):
            if fd >= 0:
                os.close(fd)


def _lstat(folder: HeldDirectory, name: str) -> os.stat_result | None:
    try:
        return folder.lstat(name)
    except FileNotFoundError:
        return None


def _publish(meta: HeldDirectory, host: str, manifest: Manifest, mode: int) -> None:
    """Write ``manifest`` as the next generation (under the writers' lock)."""
    manifest.generation += 1
    text = manifest.encode()
    meta.write_file(manifest_name(host), lambda out: out.write(text), mode)


def _collect(readers: int, manifest: Manifest, folders: dict[str, HeldDirectory]) -> list[str]:
    """Delete the retired parts if no reader holds the readers' lock now (never waiting: else the
    recorder, or the next compact, deletes them). Returns the tables whose retired parts are all
    gone now, which the manifest need not name any more (called under the writers' lock, so
    that the manifest published without them is the one the recorder reads next)."""
    try:
        fcntl.flock(readers, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return []
    collected = []
    try:
        for table, names in manifest.retired.items():
            folder = folders.get(table)
            if folder is None or not names:
                continue  # the recorder deletes them
            for name in names:
                try:
                    folder.unlink(name)
                except FileNotFoundError:
                    continue
            collected.append(table)
    finally:
        fcntl.flock(readers, fcntl.LOCK_UN)
    return collected
