"""The round tables' codecs: each record has its table's columns, and what the sink encodes
replay decodes back to the same records, in the declared Arrow types."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from fdtrace.schema import COUNTERS, TABLES, codecs
from fdtrace.schema.records import (
    ClockOffsets,
    ClockQuality,
    ProcessSample,
    ProcessTotals,
    SiteRow,
    Stack,
    ThreadCensus,
    ThreadState,
)

OFFSET = 1_700_000_000_000_000_000
NOW = 5_000_000_000

SAMPLE = ProcessSample(pid=41, start_ns=7, comm="haproxy", open_fds=4093, fd_soft_limit=4096, fd_hard_limit=None,
                       threads=4, sockets=4080, cmdline="haproxy -f /etc/haproxy.cfg", uid=0, pids_max=512,
                       pids_current=9, go_max_threads=None, go_limit_unread=None, cgroup="/system.slice/x",
                       unit="haproxy.service", container_id=None, rss_anon_kb=1200, rss_file_kb=30, rss_shmem_kb=0,
                       memcg_limit_bytes=1 << 30, memcg_usage_bytes=1 << 29, memcg_oom_kills=2)
SITE = SiteRow(pid=41, comm="haproxy", origin="traced", stack_id=2**62 + 3, open=12, opened=40, closed=28,
               oldest_ns=123)
STACK = Stack(stack_id=2**63 - 5, pid=41, comm="haproxy", frames=("accept4+0x10 [libc.so.6]", "main+0x2 [haproxy]"),
              truncated=None, mono_ns=NOW - 3)
CENSUS = ThreadCensus(77, "thread_storm", [ThreadState("futex", None, 280), ThreadState("read", "dns", 20,
                                                                                         "net.(*Resolver).lookup")])
CLOCK = ClockOffsets(NOW, OFFSET, 1_000, ClockQuality(True, 120, 4000, None))


def _rows(table: Any) -> list[dict[str, Any]]:
    if "time" not in table.column_names:  # the clock table
        return [{**row, "time_ns": row["ts_ns"] + row["realtime_offset_ns"]} for row in table.to_pylist()]
    times = table["time"].cast(pa.int64()).to_pylist()
    return [{**row, "time_ns": when} for row, when in zip(table.drop_columns(["time"]).to_pylist(), times,
                                                          strict=True)]


@pytest.mark.parametrize("codec", [codecs.SAMPLES, codecs.FD_SITES])
def test_a_record_has_its_tables_columns(codec: codecs.RoundCodec[Any]) -> None:
    declared = set(TABLES[codec.table].columns) - set(codecs.TIME_COLUMNS)
    assert codec.record is not None and set(codecs.record_columns(codec.record)) == declared


@pytest.mark.parametrize(("codec", "records", "optional"), [
    (codecs.SAMPLES, [SAMPLE, ProcessSample(1, 2, "sh", 3, None, None, 1, None)], ("cmdline",)),
    (codecs.FD_SITES, [SITE, SiteRow(42, "bash", "before_tracing", None, 3, None, None, None)], ()),
    (codecs.CLOCK, [CLOCK, ClockOffsets(NOW, OFFSET, 1_000, None)], ()),
    (codecs.STACKS, [STACK], ()),
])
def test_what_is_encoded_decodes_to_the_same_records(codec: codecs.RoundCodec[Any], records: list[Any],
                                                     optional: tuple[str, ...]) -> None:
    times = [r.mono_ns for r in records] if codec.table in ("stacks", "clock") else NOW
    table = codec.encode(records, times, OFFSET, with_optional=optional)
    assert table.schema.equals(TABLES[codec.table].arrow_schema(optional), check_metadata=False)
    assert codec.decode(_rows(table)) == records
    assert _rows(table)[0]["time_ns"] == (times if isinstance(times, int) else times[0]) + OFFSET


def test_a_sample_without_cmdline_asked_is_written_without_it() -> None:
    table = codecs.SAMPLES.encode([SAMPLE], NOW, OFFSET)
    assert "cmdline" not in table.column_names
    assert codecs.SAMPLES.decode(_rows(table))[0].cmdline is None


def test_a_census_is_written_a_row_per_state_and_read_back_a_census_per_process() -> None:
    other = ThreadCensus(78, "go", [ThreadState("running", None, 1)])
    table = codecs.THREAD_CENSUS.encode([CENSUS, other], NOW, OFFSET)
    assert table.num_rows == 3 and table.schema.equals(TABLES["thread_census"].arrow_schema(), check_metadata=False)
    assert codecs.census_by_process(_rows(table)) == [(NOW + OFFSET, CENSUS), (NOW + OFFSET, other)]


def test_plain_rows_keep_their_columns_and_name_the_missing_ones() -> None:
    system = {"file_nr": 10, "file_max": 100, "threads_max": 2000}
    table = codecs.SYSTEM.encode([system], NOW, OFFSET)
    [back] = codecs.SYSTEM.decode(_rows(table))
    assert back["file_nr"] == 10 and back["threads_max"] == 2000 and back["somaxconn"] is None
    assert set(back) == set(TABLES["system"].columns) - set(codecs.TIME_COLUMNS)


def test_the_host_lives_in_the_folder_name_and_comes_back_as_the_declared_column() -> None:
    events = pa.table({"pid": pa.array([1, 2], pa.int32())}).append_column("host", codecs.host_column("web-1", 2))
    stored = codecs.without_host(events)
    assert stored.column_names == ["pid"]
    back = codecs.with_host(stored, "web-1")
    assert back["host"].type == TABLES["events"].arrow_schema().field("host").type
    assert back["host"].cast(pa.string()).to_pylist() == ["web-1", "web-1"]
    assert codecs.with_host(back, "web-2")["host"].cast(pa.string()).to_pylist() == ["web-2", "web-2"]
    assert [f.name for f in TABLES["events"].stored_fields] == [c for c in TABLES["events"].columns if c != "host"]


def test_counters_are_written_a_row_per_instance_and_read_back_the_same() -> None:
    counts = {name: i * 7 for i, name in enumerate(COUNTERS)}
    failing = ProcessTotals(41, 900, "haproxy", None, counts, {("accept4", "EMFILE"): 12, ("socket", "ENFILE"): 1})
    ended = ProcessTotals(42, 901, "sh", 5_000, dict.fromkeys(COUNTERS, 0))
    table = codecs.PROCESS_COUNTERS.encode([failing, ended], NOW, OFFSET)
    assert table.schema.equals(TABLES["counters"].arrow_schema(), check_metadata=False)
    assert table["ts_ns"].to_pylist() == [NOW, NOW] and table["exit_ts"].to_pylist() == [None, 5_000]
    assert table["errors"].to_pylist()[0] == [{"syscall": "accept4", "errno": "EMFILE", "count": 12},
                                              {"syscall": "socket", "errno": "ENFILE", "count": 1}]
    assert codecs.PROCESS_COUNTERS.decode(table.to_pylist()) == [failing, ended]
    older = table.drop_columns([COUNTERS[0]]).to_pylist()  # a counter this recording did not have
    assert [totals.counts[COUNTERS[0]] for totals in codecs.PROCESS_COUNTERS.decode(older)] == [0, 0]
