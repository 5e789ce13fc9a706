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
from fdtrace.recording.layout import TABLES, count_compaction, host_dir, lock_path, part_files, part_name, part_range
from fdtrace.recording.summaries import SUMMARY_KEY, encode, merge, read_summary, summarize, without_summary
from fdtrace.recording.upgrade import upgrade
from fdtrace.safe_files import check_directory, write_atomically
from fdtrace.schema import TABLES as TABLES_DECLARED

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


def _merge(table: str, version: int, parts: list[Path], out: BinaryIO) -> int:
    """Copy parts into one Parquet stream of the table's current declaration, in row groups of
    about ROW_GROUP_ROWS rows (parts of older versions are upgraded as the reader would)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    declared = without_summary(TABLES_DECLARED[table].arrow_schema())
    schema = pa.schema([f for f in declared if f.name != "host"], metadata=declared.metadata)  # host: the folder
    rows = 0
    pending: list[pa.Table] = []
    summaries = []
    with pq.ParquetWriter(out, schema, compression="zstd") as merged:
        def write() -> None:
            merged.write_table(pa.concat_tables(pending), row_group_size=ROW_GROUP_ROWS)
            pending.clear()

        for path in parts:
            data = _current(table, pq.read_table(path), version, schema)
            if table == "events":  # their summaries become one (made for older parts)
                summaries.append(read_summary(path) or summarize(data))
            pending.append(data)
            rows += data.num_rows
            if sum(t.num_rows for t in pending) >= ROW_GROUP_ROWS:
                write()
        if pending:
            write()
        if summaries:
            merged.add_key_value_metadata({SUMMARY_KEY: encode(merge(summaries))})
    return rows


def _listing(folder: Path) -> list[tuple[Path, int, int]]:
    """(path, size, mode) of the regular part files of a folder, as they are now."""
    found = []
    for path in part_files(folder):
        try:
            info = os.lstat(path)
        except FileNotFoundError:  # the recorder merged or rotated it out just now
            continue
        if stat.S_ISREG(info.st_mode):
            found.append((path, info.st_size, stat.S_IMODE(info.st_mode)))
    return found


def _groups(parts: list[tuple[Path, int, int]], target: int,
            unsummarized: set[Path] | None = None) -> list[list[tuple[Path, int, int]]]:
    """Runs of consecutive parts that together stay under ``target`` bytes: at least two each, or
    one part in ``unsummarized`` (events written before part summaries, rewritten with one)."""
    groups: list[list[tuple[Path, int, int]]] = []
    run: list[tuple[Path, int, int]] = []
    size = 0
    for part in parts:
        if run and size + part[1] > target:
            groups.append(run)
            run, size = [], 0
        run.append(part)
        size += part[1]
    groups.append(run)
    return [g for g in groups if len(g) > 1 or (g and g[0][0] in (unsummarized or set()))]


def compact_host(recording: HostRecording, target: int = TARGET_BYTES) -> Compacted:
    """Merge each table's parts of one host; raises FdtraceError (one line) when a file cannot
    be read or written."""
    import pyarrow as pa

    done = Compacted(recording.host)
    lock = lock_path(recording.root, recording.host)
    for table in TABLES:
        folder = host_dir(recording.root, table, recording.host)
        parts = _listing(folder)
        done.files_before += len(parts)
        done.files_after += len(parts)
        bare = {path for path, _, _ in parts if read_summary(path) is None} if table == "events" else set()
        for chosen in _groups(parts, target, bare):
            group = [path for path, _, _ in chosen]
            first, last = part_range(group[0]), part_range(group[-1])
            assert first is not None and last is not None
            merged = folder / part_name(first[0], last[1])
            mode = chosen[0][2]
            try:
                rows = [0]

                def write(out: BinaryIO, chosen: list[Path] = group, counted: list[int] = rows,
                          name: str = table) -> None:
                    counted[0] = _merge(name, recording.version, chosen, out)

                write_atomically(merged, write, mode)
            except FileNotFoundError:  # the recorder merged or rotated them out meanwhile
                done.changed_meanwhile += 1
                continue
            except (OSError, pa.ArrowException, ValueError) as exc:
                raise FdtraceError(f"{folder}: cannot compact ({' '.join(str(exc).split())[:200]})") from None
            try:
                check_directory(lock.parent)
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
            except (OSError, FdtraceError) as exc:
                os.unlink(merged)  # the parts stay as they were
                why = exc.strerror if isinstance(exc, OSError) else str(exc)
                raise FdtraceError(f"{lock}: cannot take the host's lock ({why})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                count_compaction(fd)
                if len(group) == 1:  # rewritten in place, now with its summary
                    done.rows += rows[0]
                elif all(os.path.lexists(p) for p in group):
                    for path in group:
                        os.unlink(path)
                    done.files_after -= len(group) - 1
                    done.rows += rows[0]
                else:
                    os.unlink(merged)
                    done.changed_meanwhile += 1
            finally:
                os.close(fd)
    return done


