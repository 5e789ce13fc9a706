"""The phase records the shim wrote (JSON lines, one file per process) as a table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from fdtrace.schema import TABLES

#: Columns of the phase records the shim writes: the ``phases`` table's but ``time`` (added when
#: they are stored). Times are CLOCK_MONOTONIC ns (BPF's clock) and wall ns.
PHASES_SCHEMA = TABLES["phases"].arrow_schema().remove(TABLES["phases"].columns.index("time"))

#: The phase names the shim writes; ``user`` marks come from ``fdtrace.integrations.phases.phase(name)``.
PHASE_NAMES = ("init_process_group", "new_group", "barrier", "destroy_process_group", "forward", "backward",
               "allreduce", "optimizer", "checkpoint_save", "checkpoint_load", "user")


#: Colours of the phases, the same in the HTML report and in ``fdtrace.analysis.plots``.
PHASE_COLOURS = {
    "init_process_group": "#9ecae1", "new_group": "#c6dbef", "barrier": "#d9d9d9", "destroy_process_group": "#f0f0f0",
    "forward": "#c7e9c0", "backward": "#fdd0a2", "allreduce": "#fdae6b", "optimizer": "#dadaeb",
    "checkpoint_save": "#fcbba1", "checkpoint_load": "#fcbba1", "user": "#fff59d",
}


def read_phase_files(directory: Path) -> pa.Table:
    """Every record of every process, ordered by start; a torn last line (a killed rank), and
    anything else that is not a phase record, is skipped."""
    rows: list[dict[str, Any]] = []
    for path in sorted(directory.glob("phases-*.jsonl")):
        try:
            text = path.read_text(errors="replace") if path.is_file() else ""
        except OSError:
            continue
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict) or not isinstance(record.get("start_mono_ns"), int) \
                    or not isinstance(record.get("pid"), int):
                continue
            record.setdefault("source", "shim")
            rows.append(record)
    rows.sort(key=lambda r: (r["start_mono_ns"], r["pid"]))
    return pa.Table.from_pylist(rows, schema=PHASES_SCHEMA)
