"""The readers' bounds and checks, one by one: JSON nesting, text cut at MAX_TEXT (inside
dictionaries, lists and structs too), impossible values, chunks over their budget, the part
footer's summary against the part, merged parts that hold fewer rows than they claim, copies of
a host, and the span that timelines cover."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fdtrace.analysis.binning import factor_for
from fdtrace.analysis.engines.duckdb_engine import DuckDBEngine
from fdtrace.analysis.span import SECOND, Span, span_on
from fdtrace.recording import reader
from fdtrace.recording.fleet import HostRecording, without_copies
from fdtrace.recording.summaries import disagreement, summary_problem

EMFILE = Path(__file__).parents[1] / "data" / "emfile"


def test_json_is_parsed_only_within_its_nesting_bound() -> None:
    assert reader.loads_bounded(b'{"a": [[1], {"b": "[[[[[[[[[[[["}]}', max_depth=3) == {"a": [[1], {"b": "[" * 12}]}
    with pytest.raises(ValueError, match="nested 4 levels deep, more than the 3 fdtrace reads"):
        reader.loads_bounded(b"[[[[]]]]", max_depth=3)
    with pytest.raises(ValueError, match="nested 100000 levels deep"):
        reader.loads_bounded(b"[" * 100_000)


def test_text_is_cut_wherever_it_is() -> None:
    long, short = "y" * (reader.MAX_TEXT + 1), "ok"
    plain, count = reader._cut(pa.array([long, short, None]))
    assert plain.to_pylist() == ["y" * reader.MAX_TEXT, short, None] and count == 1
    coded, count = reader._cut(pa.array([long, long, short]).dictionary_encode())
    assert coded.to_pylist() == ["y" * reader.MAX_TEXT] * 2 + [short] and count == 2
    assert pa.types.is_dictionary(coded.type)
    frames, count = reader._cut(pa.array([[long, short], None, []], pa.list_(pa.string())))
    assert frames.to_pylist() == [["y" * reader.MAX_TEXT, short], None, []] and count == 1
    kind = pa.struct([("syscall", pa.string()), ("count", pa.int64())])
    errors, count = reader._cut(pa.array([{"syscall": long, "count": 1}, None], kind))
    assert errors.to_pylist() == [{"syscall": "y" * reader.MAX_TEXT, "count": 1}, None] and count == 1


def test_impossible_values_are_left_out_and_named() -> None:
    data = pa.table({"ts_ns": pa.array([1, 2, 3, 4]), "time": pa.array([1, -1, 1 << 62, 2], pa.int64()).cast(
        pa.timestamp("ns", tz="UTC")), "ringbuf_full": pa.array([0, -10**15, 5, None]),
        "ringbuf_full_total": pa.array([0, 1, 1 << 62, 6])})
    notes: list[str] = []
    sane = reader._sane("losses", data, Path("p"), notes)
    assert sane["ts_ns"].to_pylist() == [1, 4]
    assert sane["ringbuf_full"].to_pylist() == [0, None] and sane["ringbuf_full_total"].to_pylist() == [0, 6]
    assert notes == ["p: 2 of 4 rows left out (time missing or impossible (2); times must be from 1970 to 2116)",
                     "p: 2 impossible values read as missing (ringbuf_full 1, ringbuf_full_total 1; counts cannot be "
                     "negative, nor any number 2^62 or more)"]


def test_a_chunk_over_its_budget_is_not_read(tmp_path: Path) -> None:
    part = tmp_path / "part-000001.parquet"
    source = pq.read_table(next((EMFILE / "events").glob("host=vm/part-000002.parquet")))
    source = source.set_column(source.column_names.index("comm"), "comm",
                               pa.array(["z" * (2 << 20)] + ["emfile-child"] * (source.num_rows - 1)))
    pq.write_table(source, part, row_group_size=4)
    notes: list[str] = []
    with reader.open_part(part) as opened:
        assert set(reader.oversized(opened, "events", ["comm", "pid"])) == {0}
        assert reader.doubts(opened, "events", 6) == "a column chunk larger than its rows can need"
        data = reader.read_part(opened, "events", 1, None, notes)
    assert data["comm"].to_pylist() == [reader.NOT_READ] * 4 + ["emfile-child"] * 4
    assert len(notes) == 1 and notes[0].startswith(f"{part}: comm of 4 rows not read (")


def summary_of_emfile() -> dict[str, object]:
    return {"version": 1, "kinds": [["socket", 3, 10, 20], ["fd_error", 1, 15, 15]],
            "failed": [[7, "c", "fd_error", "EMFILE", "pipe2", None, None, None, 1, 15]], "connects": []}


def test_a_summary_is_checked_for_its_shape_and_against_its_part() -> None:
    good = summary_of_emfile()
    assert summary_problem(good) == "" and disagreement(good, 4, (10, 20)) == ""
    assert disagreement(good, 5, (10, 20)) == "it counts 4 events, its part holds 5"
    assert disagreement(good, 4, (11, 20)) == "it names a time (10) outside its part's (11 to 20)"
    hidden = dict(good, failed=[])
    assert disagreement(hidden, 4, None) == "it counts 1 fd_error event but lists 0 among the failures"
    for broken, why in [({"version": 2}, "not a version 1 summary"),
                        (dict(good, kinds=[["socket", True, 1, 2]]), "the n of a row of kinds is bool, not int"),
                        (dict(good, kinds=[["socket", 1, 3, 2]]), "a row of kinds has its last time before its first"),
                        (dict(good, connects=[[None] * 7]), "a row of connects is not a list of 8 values"),
                        (dict(good, kinds=[["a", 1, 1, 1], ["a", 1, 1, 1]]), "it counts a kind twice")]:
        assert summary_problem(json.loads(json.dumps(broken))) == why


def test_a_merged_part_is_believed_only_with_the_rows_of_what_it_covers(tmp_path: Path) -> None:
    rows = pa.table({"ts_ns": pa.array(range(6), pa.int64())})
    for name, count in (("part-000001.parquet", 2), ("part-000002.parquet", 3), ("part-000003.parquet", 1),
                        ("part-000001-000002.parquet", 5), ("part-000000-000009.parquet", 4)):
        pq.write_table(rows.slice(0, count), tmp_path / name)
    names = sorted(p.name for p in tmp_path.iterdir())
    skipped: list[str] = []
    notes: list[str] = []
    kept = reader._believed(tmp_path, names, skipped, notes)
    assert kept == ["part-000001-000002.parquet", "part-000003.parquet"] and skipped == []
    assert notes == [f"{tmp_path}/part-000000-000009.parquet: ignored: its name claims flushes 0 to 9, but it holds "
                     "4 rows, fewer than the 6 of the 2 parts it would cover (those are read instead)"]


def test_copies_of_a_host_are_read_once_the_fullest_kept() -> None:
    meta = {"started": 1.0, "boot_id": "b"}
    early = HostRecording(Path("/a"), "vm", {**meta, "ended": 5.0, "complete": False})
    late = HostRecording(Path("/b"), "vm", {**meta, "ended": 9.0, "complete": False})
    other = HostRecording(Path("/c"), "vm", {"started": 2.0, "boot_id": "b"})
    notes: list[str] = []
    assert without_copies([early, late, other], notes) == [late, other]
    assert notes == ["/a: host vm is a second copy of the recording in /b (the same host, boot and start): read once, "
                     "from there"]


def test_the_span_is_the_longest_run_of_rounds() -> None:
    start = 1_796_016_973 * SECOND
    rounds = [start + i * SECOND for i in range(100)] + [start + 10**17]  # a round three years on
    events = [start + 5 * SECOND, start + 99 * SECOND, start + 10**17 + 1]
    engine = DuckDBEngine.over_frames({
        "losses": pd.DataFrame({"host": "vm", "time": pd.to_datetime(rounds, unit="ns", utc=True)}),
        "events": pd.DataFrame({"host": "vm", "kind": "socket", "time": pd.to_datetime(events, unit="ns", utc=True)})})
    try:
        span = span_on(engine)
    finally:
        engine.close()
    assert (span.first_ns, span.last_ns) == (start - 60 * SECOND, start + 160 * SECOND)
    assert span.outliers.to_dict("records") == [{"kind": "socket", "n": 1, "first": start + 10**17 + 1,
                                                  "last": start + 10**17 + 1}]
    assert factor_for(Span(0, 250_000 * SECOND), SECOND, 100_000) == 5
    assert factor_for(Span(0, 90 * SECOND), SECOND, 100_000) == 1


def test_a_thousand_files_with_one_finding_are_a_few_lines_with_their_count() -> None:
    from fdtrace.analysis.summary import alike_grouped

    notes = [f"/r/events/host=a/part-{i}.parquet: {i + 1} impossible values read as missing (pid {i + 1})"
             for i in range(1000)]
    notes.insert(500, "/r/samples/host=a/part-9.parquet: 2 of 4 rows left out (time missing (2))")
    said = alike_grouped(notes)
    assert said == [*notes[:3],
                    "and 997 more files alike: impossible values read as missing (each with its own numbers)",
                    notes[500]]
