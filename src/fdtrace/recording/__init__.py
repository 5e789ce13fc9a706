"""Recordings: the on-disk layout, the writer, and the reader that upgrades their parts (they are
opened through ``fdtrace.analysis.engines.dataset.open_dataset``)."""

from fdtrace.recording.layout import TABLES, host_dir, meta_path, part_files, part_name
from fdtrace.recording.reader import read_meta, read_parts

__all__ = ["TABLES", "host_dir", "meta_path", "part_files", "part_name", "read_meta",
           "read_parts"]
