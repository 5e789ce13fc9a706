"""``fdtrace compact``: many small part files merged into few large ones per table and host, the
way engines like them (DuckDB and Spark pay per file opened and per row group read).

Safe on a recording that is still being written: a merged file is written whole under its final
name beside its parts (readers then read it and skip the parts it covers), and the parts are
deleted only under the host's lock, which the recorder also takes before it merges or rotates
out parts of its own; when the parts changed meanwhile, the merged file is deleted instead.
"""

from __future__ import annotations

import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from fdtrace.errors import FdtraceError
from fdtrace.recording.fleet import HostRecording
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
    done = Compacted(recording.host)
    with HeldDirectory.open(recording.root) as root, root.subdirectory("meta") as meta:
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
