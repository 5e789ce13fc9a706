"""The declarations of fdtrace.schema against what reads and describes them: docs/format.md
and docs/recording.md, the BPF programs' use of the extra slots, and the writer's files."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fdtrace.analysis import load
from fdtrace.recording.upgrade import upgrade
from fdtrace.schema import EVENT_FIELDS, EXTRA_SLOTS, SCHEMA_VERSION, TABLES, bpf_cflags, slot

ROOT = Path(__file__).parents[2]
EMFILE = ROOT / "tests" / "data" / "emfile"
TYPE_WORDS = {"int64": "int64", "int32": "int32", "int16": "int16", "timestamp_utc": "timestamp[ns, UTC]",
              "dict_string": "string"}


def test_format_md_lists_the_event_columns_in_order_with_their_types() -> None:
    text = (ROOT / "docs" / "format.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", text.split("## Columns", 1)[1].split("\n## ", 1)[0], re.M)
    assert [name for name, _ in rows] == [f.name for f in EVENT_FIELDS]
    for (name, written), field in zip(rows, EVENT_FIELDS, strict=True):
        assert written.strip() == TYPE_WORDS[field.arrow_type] + (", nullable" if field.nullable else ""), name
    assert f"schema version {SCHEMA_VERSION}" in text


def test_recording_md_names_every_column_of_every_table() -> None:
    text = (ROOT / "docs" / "recording.md").read_text()
    for name, table in TABLES.items():
        if name == "events":
            continue
        [row] = [line for line in text.splitlines() if line.startswith(f"| `{name}` |")]
        missing = [c for c in table.columns if f"`{c}`" not in row and c not in ("ts_ns", "time")]
        assert not missing, (name, missing)


def test_the_bpf_programs_write_extra_slots_only_through_the_declared_flags() -> None:
    sources = "".join((ROOT / "bpf" / name).read_text() for name in ("sockets.bpf.c", "lifecycle.bpf.c"))
    assert not re.search(r"extra\[\d\]", sources), "a raw slot index in the C"
    used = set(re.findall(r"extra\[(FDT_X_\w+)\]", sources))
    flags = {flag.split("=")[0][2:] for flag in bpf_cflags() if flag.startswith("-DFDT_X_")}
    assert used <= flags
    assert {"FDT_X_PROCESS_EXIT_SIGNAL", "FDT_X_OOM_KILL_SHMEM_RSS_KB", "FDT_X_CONNECT_SOCKADDR0"} <= used
    assert all(slot(kind, name) < 4 for kind, names in EXTRA_SLOTS.items() for name in names)


def test_a_version_1_recording_is_upgraded_on_read() -> None:
    meta = load(EMFILE).meta["vm"]
    assert meta["schema_version"] == 1
    rec = load(EMFILE)
    # columns version 1 lacked come back, null
    assert "peer_port" in rec.events.columns and rec.events["peer_port"].isna().all()
    assert {"uid", "pids_max", "go_max_threads"} <= set(rec.samples.columns)
    assert "threads_total" in rec.system.columns
    old = pq.read_table(next((EMFILE / "samples").rglob("part-*.parquet")))
    assert "uid" not in old.column_names
    upgraded = upgrade("samples", old, 1)
    assert upgraded.schema.equals(TABLES["samples"].arrow_schema(with_optional=()))
    assert upgraded.num_rows == old.num_rows and upgraded["uid"].null_count == old.num_rows


def test_a_part_that_lacks_a_required_column_is_refused_by_the_upgrade() -> None:
    import pytest

    with pytest.raises(ValueError, match="lacks the column file_max"):
        upgrade("system", pa.table({"ts_ns": [1], "file_nr": [2]}), 2)


def test_version_1_phases_are_the_shims() -> None:
    ddp = load(ROOT / "tests" / "data" / "ddp")
    assert set(ddp.phases["source"]) == {"shim"}


def test_prometheus_metrics_are_declared_from_the_schemas_columns() -> None:
    """Issue 38: the exporter's per-process families are generated from schema.metrics, each
    reading a declared column (a samples column or ProcessSample's rss_kb; a counters column)."""
    from dataclasses import fields

    from fdtrace.schema import COUNTERS
    from fdtrace.schema.metrics import PROCESS_COUNTERS, PROCESS_GAUGES
    from fdtrace.schema.records import ProcessSample
    from fdtrace.schema.tables import SAMPLES

    sample_columns = {f.name for f in SAMPLES.fields}
    assert {f.name for f in fields(ProcessSample)} - {"cmdline"} <= sample_columns | {"go_limit_unread"}
    assert all(g.column in sample_columns | {"rss_kb"} for g in PROCESS_GAUGES)
    assert {c.column for c in PROCESS_COUNTERS} <= set(COUNTERS)
    assert all(c.name.startswith("fdtrace_") and c.name.endswith("_total") for c in PROCESS_COUNTERS)
    names = [m.name for m in (*PROCESS_GAUGES, *PROCESS_COUNTERS)]
    assert len(names) == len(set(names))
