"""Writes a recording: buffered tables flushed as whole Parquet part files (see recording.py)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from fdtrace.errors import FdtraceError
from fdtrace.recording import TABLES, host_dir, meta_path


class RecordingWriter:
    """One host's side of a recording directory.

    ``add()`` buffers rows in memory; ``flush()`` writes each buffered table as a new part file
    (temporary name, fsync, rename), so a recorder killed at any moment leaves only complete
    files and loses at most what it buffered since the last flush.
    """

    def __init__(self, root: Path, host: str, meta: dict[str, Any], shared: bool = False) -> None:
        self.root = Path(root)
        self.host = host
        self.meta = dict(meta)
        self.file_mode = 0o644 if shared else 0o600
        self.dir_mode = 0o755 if shared else 0o700
        self.bytes_written = 0
        self.rows_written: dict[str, int] = dict.fromkeys(TABLES, 0)
        self._buffers: dict[str, list[pa.Table]] = {t: [] for t in TABLES}
        self._next_part: dict[str, int] = dict.fromkeys(TABLES, 1)
        if meta_path(self.root, host).exists():
            raise FdtraceError(f"{self.root} already holds a recording of host {host}: choose another -o")
        self._guard(self._make_dirs)
        self.write_meta(complete=False)

    def _make_dirs(self) -> None:
        folders = [self.root, self.root / "meta"]
        for table in TABLES:
            folders += [self.root / table, host_dir(self.root, table, self.host)]
        for folder in folders:
            folder.mkdir(mode=self.dir_mode, exist_ok=True)

    def add(self, table: str, rows: pa.Table) -> None:
        """Buffer rows for ``table`` until the next flush."""
        if rows.num_rows:
            self._buffers[table].append(rows)

    def flush(self) -> None:
        """Write every buffered table as a complete part file."""
        for table, buffered in self._buffers.items():
            if not buffered:
                continue
            data = pa.concat_tables(buffered, promote_options="default")
            folder = host_dir(self.root, table, self.host)
            final = folder / f"part-{self._next_part[table]:06d}.parquet"
            self._guard(lambda d=data, f=final: self._write_part(d, f))
            self._next_part[table] += 1
            self.rows_written[table] += data.num_rows
            buffered.clear()

    def _write_part(self, data: pa.Table, final: Path) -> None:
        temporary = final.with_suffix(".parquet.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.file_mode)
        try:
            with os.fdopen(fd, "wb") as out:
                pq.write_table(data, out, compression="zstd")
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        os.replace(temporary, final)
        self.bytes_written += final.stat().st_size

    def write_meta(self, complete: bool, **updates: Any) -> None:
        """Write the metadata file (atomically); ``complete`` marks a clean end."""
        self.meta.update(updates, complete=complete, rows=self.rows_written, bytes=self.bytes_written)
        path = meta_path(self.root, self.host)
        temporary = path.with_suffix(".json.tmp")

        def write() -> None:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.file_mode)
            with os.fdopen(fd, "w") as out:
                json.dump(self.meta, out, indent=1, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)

        self._guard(write)

    def _guard(self, action: Any) -> None:
        try:
            action()
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise FdtraceError(
                    f"{self.root}: disk full: recording stopped; the {sum(self.rows_written.values())} rows "
                    "already written are complete", exit_code=1,
                ) from None
            raise FdtraceError(f"{self.root}: cannot write the recording ({exc.strerror})", exit_code=1) from None
