"""Readers that trust nothing (issue 27, items 5 to 7): footer summaries of the wrong shape or that
lie, pages that do not decode, a float pid, parts cut in half or all null, an odd schema version,
a planted part named to cover every flush, a host copied twice, negative losses, and one
unusable host in a fleet. Before, each was a traceback or a silently wrong answer ("nothing went
wrong", "events: 5", counts doubled, "lost -1000000000000000"); now each is read right, with what
was left out named, or refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fdtrace.analysis import load
from fdtrace.errors import FdtraceError
from fdtrace.recording.summaries import read_summary
from fdtrace.schema import SCHEMA_VERSION
from fdtrace.sources.replay import ReplaySource
from tests.hostile import mutations as damage

FAILED = "emfile-child [15007]: 4 calls failed (EMFILE socket 3, EMFILE pipe2 1), first at 2026-11-30 05:36:15.697 UTC"


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/data/emfile after `fdtrace compact`: one events part, with its footer summary."""
    return damage.compacted(damage.EMFILE, tmp_path_factory.mktemp("compacted") / "rec")


def summarized_copy(compacted: Path, to: Path) -> tuple[Path, Path]:
    recording = to / "rec"
    shutil.copytree(compacted, recording)
    [part] = damage.parts(recording)
    return recording, part


def test_an_honest_summary_is_used(compacted: Path) -> None:
    recording = load(compacted, engine="duckdb")
    try:
        found = recording.part_summaries()
        assert found is not None and int(found["kinds"]["n"].sum()) == damage.EMFILE_EVENTS
        assert recording.notes == [] and recording.skipped == []
    finally:
        recording.close()


def _without_failed(summary: dict[str, Any]) -> None:
    del summary["failed"]


def _n_as_text(summary: dict[str, Any]) -> None:
    summary["kinds"][0][1] = "many"


def _version_as_text(summary: dict[str, Any]) -> None:
    summary["version"] = "1"


def _no_failures(summary: dict[str, Any]) -> None:
    summary["failed"] = []  # hides every EMFILE


def _counts_doubled(summary: dict[str, Any]) -> None:
    for row in summary["kinds"]:
        row[1] *= 2


def _later(summary: dict[str, Any]) -> None:
    summary["kinds"][0][3] += 3_600_000_000_000


SUMMARIES = {
    "without failed": (_without_failed, "it has no list of failed"),
    "a count as text": (_n_as_text, "the n of a row of kinds is str, not int"),
    "a version as text": (_version_as_text, "not a version 1 summary"),
    "no failures": (_no_failures, "it counts 1 fd_error event but lists 0 among the failures"),
    "counts doubled": (_counts_doubled, "it counts 152 events, its part holds 76"),
}


@pytest.mark.parametrize("name", sorted(SUMMARIES))
def test_a_summary_of_the_wrong_shape_or_that_lies_is_named_and_not_used(name: str, compacted: Path,
                                                                         tmp_path: Path) -> None:
    recording, part = summarized_copy(compacted, tmp_path)
    change, why = SUMMARIES[name]
    summary = damage.read_summary_json(part)
    change(summary)
    damage.set_summary(part, summary)
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", "duckdb"))
    assert f"what went wrong:\n  {FAILED}\n" in info.stdout and "\nevents: 76\n" in info.stdout
    assert (f"\nread in part or once:\n  {part}: its footer summary is not used ({why}): its events are read "
            "instead\n") in info.stdout
    assert read_summary(part) is None
    damage.succeeded(damage.fdtrace("compact", str(recording)))  # it makes the summary again
    fresh = read_summary(part)
    assert fresh is not None and sum(row[1] for row in fresh["kinds"]) == damage.EMFILE_EVENTS


def test_a_summary_nested_deep_or_not_json_is_not_used(compacted: Path, tmp_path: Path) -> None:
    recording, part = summarized_copy(compacted, tmp_path)
    damage.set_summary(part, b"[" * 100_000)
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", "duckdb"))
    assert (f"  {part}: its footer summary is not used (unreadable: nested 100000 levels deep, more than the 32 "
            "fdtrace reads): its events are read instead\n") in info.stdout
    assert f"  {FAILED}\n" in info.stdout
    damage.set_summary(part, b"\xff{")
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", "duckdb"))
    assert f"  {part}: its footer summary is not used (unreadable: " in info.stdout and f"  {FAILED}\n" in info.stdout


@pytest.mark.parametrize("engine", ["pandas", "duckdb"])
def test_pages_that_do_not_decode_are_skipped_and_named(engine: str, tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    part, _ = damage.first_of_kind(recording, "fd_error")
    damage.flip_page_bytes(part)
    try:
        pq.read_table(part)
    except (OSError, pa.ArrowException) as exc:
        why = " ".join(str(exc).split())[:200]
    else:
        pytest.fail("the damage left the part readable")
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine))
    assert f"\nskipped unreadable files:\n  {part}: {why}\n" in info.stdout + "\n"
    assert "\nevents: 59\n" in info.stdout  # the part's 17 events are gone, the rest counted
    report = damage.succeeded(damage.fdtrace("report", str(recording), "--engine", engine,
                                             "-o", str(tmp_path / "r.md")))
    assert f"fdtrace: skipped {part}: {why}" in report.stderr.splitlines()


@pytest.mark.parametrize("engine", ["pandas", "duckdb"])
def test_a_float_pid_is_read_when_whole_and_the_part_skipped_when_not(engine: str, tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    part, _ = damage.first_of_kind(recording, "fd_error")
    damage.float_pid(part)
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine))
    assert f"  {FAILED}\n" in info.stdout and "skipped" not in info.stdout
    damage.rewrite(part, lambda t: damage.set_column(t, "pid", pa.array([15007.5] * t.num_rows)))
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine))
    assert f"\nskipped unreadable files:\n  {part}: Float value 15007.500000 was truncated converting to int32\n" \
        in info.stdout + "\n"


@pytest.fixture(scope="module")
def halved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    recording = damage.copy(damage.EMFILE, tmp_path_factory.mktemp("halved") / "rec")
    every = sorted(recording.rglob("part-*.parquet"))
    for part in every:
        damage.truncate_half(part)
    return recording, every


@pytest.mark.parametrize("command", [["info"], ["info", "--engine", "duckdb"], ["report", "-o", "{out}/r.md"],
                                     ["trace-export", "-o", "{out}/t.json"], ["doctor", "--from"]],
                         ids=lambda c: " ".join(c[:3]))
def test_every_part_cut_in_half_is_named_or_counted_by_every_command(command: list[str],
                                                                     halved: tuple[Path, list[Path]],
                                                                     tmp_path: Path) -> None:
    recording, every = halved
    result = damage.fdtrace(*[c.format(out=tmp_path) for c in command], str(recording))
    assert "Traceback" not in result.stderr and result.returncode in (0, 1, 2)  # doctor: the system's own checks
    said = result.stdout + result.stderr
    why = "not a Parquet file (no PAR1 at its end: truncated?)"
    named = [part for part in every if f"{part}: {why}" in said]
    assert len(named) == 3  # the first few by name, the rest in one line with their count
    assert f"and {len(every) - 3:,} more files alike: {why}" in said


def test_replay_of_parts_all_null_or_cut_is_refused_in_one_line(halved: tuple[Path, list[Path]],
                                                                 tmp_path: Path) -> None:
    recording, _ = halved
    with pytest.raises(FdtraceError, match="the recording holds no events to replay"):
        ReplaySource(recording)
    nulls = damage.copy(damage.EMFILE, tmp_path / "nulls")
    for part in nulls.rglob("part-*.parquet"):
        damage.all_null(part)
    with pytest.raises(FdtraceError, match="the recording holds no events to replay"):
        ReplaySource(nulls)
    info = damage.succeeded(damage.fdtrace("info", str(nulls)))
    first = damage.parts(nulls)[0]
    assert (f"\n  {first}: 8 of 8 rows left out (comm missing (8), errno missing (8), kind missing (8), pid missing "
            "(8), syscall missing (8), tid missing (8), time missing or impossible (8), ts_ns missing or impossible "
            "(8); times must be from 1970 to 2116)\n") in info.stdout
    line = damage.one_line_error(damage.fdtrace("replay", str(nulls)))
    assert line == f"fdtrace: error: {nulls}: the recording holds no events to replay"


@pytest.mark.parametrize("version", [True, 6.0, "6", [6]])
def test_a_schema_version_of_another_type_is_refused(version: object, tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    damage.set_meta(recording, schema_version=version)
    line = damage.one_line_error(damage.fdtrace("info", str(recording)))
    assert line == (f"fdtrace: error: {recording}/meta/host=vm.json: recording schema version {version!r}, this "
                    f"fdtrace reads versions 1 to {SCHEMA_VERSION}")
    with pytest.raises(FdtraceError, match="recording schema version"):
        ReplaySource(recording)


@pytest.mark.parametrize("engine", ["pandas", "duckdb"])
def test_a_planted_part_named_for_every_flush_does_not_hide_the_others(engine: str, tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    planted = damage.plant_wide_part(recording, rows=5)
    note = (f"{planted}: ignored: its name claims flushes 0 to 999999, but it holds 5 rows, fewer than the 76 of "
            "the 7 parts it would cover (those are read instead)")
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine))
    assert "\nevents: 76\n" in info.stdout and f"\nread in part or once:\n  {note}\n" in info.stdout + "\n"
    assert ReplaySource(recording).player.events.num_rows == damage.EMFILE_EVENTS


@pytest.mark.parametrize("engine", ["pandas", "duckdb"])
def test_a_host_copied_twice_is_read_once(engine: str, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    damage.copy(damage.EMFILE, fleet / "a")
    damage.copy(damage.EMFILE, fleet / "b")
    note = f"{fleet}/b: host vm is a second copy of the recording in {fleet}/a (the same host, boot and start): " \
           "read once, from there"
    info = damage.succeeded(damage.fdtrace("info", str(fleet), "--engine", engine))
    assert "\nevents: 76\n" in info.stdout and f"  {FAILED}\n" in info.stdout
    assert f"\nread in part or once:\n  {note}\n" in info.stdout + "\n"
    report = damage.succeeded(damage.fdtrace("report", str(fleet), "--engine", engine, "-o", str(tmp_path / "r.md")))
    assert f"fdtrace: {note}" in report.stderr.splitlines() and "- **events**: 76\n" in (tmp_path / "r.md").read_text()


@pytest.mark.parametrize("engine", ["pandas", "duckdb"])
def test_negative_losses_are_refused_and_named(engine: str, tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    part = damage.negative_losses(recording)
    note = (f"{part}: 1 impossible value read as missing (ringbuf_full 1; counts cannot be negative, nor any number "
            "2^62 or more)")
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine))
    assert "\nlosses: 0\n" in info.stdout and f"\nread in part or once:\n  {note}\n" in info.stdout + "\n"
    report = damage.succeeded(damage.fdtrace("report", str(recording), "--engine", engine,
                                             "-o", str(tmp_path / "r.md")))
    assert "- **events lost**: 0\n" in (tmp_path / "r.md").read_text() and f"fdtrace: {note}" in report.stderr


def test_doctor_from_names_the_parts_it_skipped(tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    part, _ = damage.first_of_kind(recording, "fd_error")
    damage.truncate_half(part)
    result = damage.fdtrace("doctor", "--from", str(recording), "--comm", "emfile-child")
    assert "Traceback" not in result.stderr and "emfile-child" in result.stdout
    assert f"fdtrace: skipped {part}: not a Parquet file (no PAR1 at its end: truncated?)" in result.stderr.splitlines()


FLEET_COMMANDS = [[command, "--engine", engine] for command in ("info", "report") for engine in
                  ("auto", "pandas", "duckdb")] + [["trace-export"]]


@pytest.mark.parametrize("command", FLEET_COMMANDS, ids=" ".join)
def test_one_unusable_host_does_not_stop_a_fleet(command: list[str], tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    damage.copy(damage.EMFILE, fleet / "a")
    bad = damage.copy(damage.DDP, fleet / "b")
    damage.set_meta(bad, schema_version=99)
    output = {"report": ["-o", str(tmp_path / "r.md")], "trace-export": ["-o", str(tmp_path / "t.json")]}
    result = damage.succeeded(damage.fdtrace(*command, *output.get(command[0], []), str(fleet)))
    why = f"{bad}/meta/host=vm.json: recording schema version 99, this fdtrace reads versions 1 to {SCHEMA_VERSION}"
    if command[0] == "info":
        assert f"\nskipped unreadable files:\n  {why}\n" in result.stdout + "\n" and "\nevents: 76\n" in result.stdout
    else:
        assert f"fdtrace: skipped {why}" in result.stderr.splitlines()
