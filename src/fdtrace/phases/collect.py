"""The phase records the shim wrote (JSON lines, one file per process) as a table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

#: Columns of the ``phases`` table. Times are CLOCK_MONOTONIC ns (BPF's clock) and wall ns.
PHASES_SCHEMA = pa.schema([
    ("rank", pa.int32()), ("local_rank", pa.int32()), ("world_size", pa.int32()), ("pid", pa.int32()),
    ("tid", pa.int32()), ("step", pa.int64()), ("phase", pa.string()), ("name", pa.string()),
    ("bucket", pa.int32()), ("start_mono_ns", pa.int64()), ("end_mono_ns", pa.int64()),
    ("start_wall_ns", pa.int64()), ("end_wall_ns", pa.int64()), ("source", pa.string()),
])

#: The phase names the shim writes; ``user`` marks come from ``fdtrace.phases.phase(name)``.
PHASE_NAMES = ("init_process_group", "new_group", "barrier", "destroy_process_group", "forward", "backward",
               "allreduce", "optimizer", "checkpoint_save", "checkpoint_load", "user")


#: Colours of the phases, the same in the HTML report and in ``fdtrace.analysis.plots``.
PHASE_COLOURS = {
    "init_process_group": "#9ecae1", "new_group": "#c6dbef", "barrier": "#d9d9d9", "destroy_process_group": "#f0f0f0",
    "forward": "#c7e9c0", "backward": "#fdd0a2", "allreduce": "#fdae6b", "optimizer": "#dadaeb",
    "checkpoint_save": "#fcbba1", "checkpoint_load": "#fcbba1", "user": "#fff59d",
}


def read_phase_files(directory: Path) -> pa.Table:
    """Every record of every process, ordered by start; a torn last line (a killed rank) is skipped."""
    rows: list[dict[str, Any]] = []
    for path in sorted(directory.glob("phases-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            record.setdefault("source", "shim")
            rows.append(record)
    rows.sort(key=lambda r: (r["start_mono_ns"], r["pid"]))
    return pa.Table.from_pylist(rows, schema=PHASES_SCHEMA)
