"""Recordings: the on-disk layout, the writer, and the reader that loads (and upgrades) them."""

from fdtrace.recording.layout import TABLES, host_dir, meta_path, part_files, part_name
from fdtrace.recording.reader import Recording, load, read_meta, read_parts

__all__ = ["TABLES", "Recording", "host_dir", "load", "meta_path", "part_files", "part_name", "read_meta",
           "read_parts"]
