"""Readers bounded by what they read (issue 27, item 4): one event three years after the others,
times at the ends of int64, a 300 MB task name in a 22 KB part, metadata nested 100,000 deep.
Each command runs in a memory cgroup of MEMORY_LIMIT (about twice what `report` of the fixture
needs): before, these made `report` allocate 722 MiB to 82 GiB, `info` 2 GB, and every command
end in a RecursionError. Now the outliers are named and left off the timelines, the long name is
named and not read, and the metadata is refused in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from fdtrace.errors import FdtraceError
from fdtrace.sources.replay import ReplaySource
from tests.helpers import memory_cgroup
from tests.hostile import mutations as damage

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="memory cgroups need root")

MEMORY_LIMIT = 512 << 20
ENGINES = ["pandas", "duckdb"]
SPAN = "2026-11-30 05:36:13.946 UTC to 2026-11-30 05:36:17.948 UTC (4.0 s)"
INFO_SPAN = "span: 2026-11-30 05:36:13.946 UTC .. 2026-11-30 05:36:17.948 UTC"


@pytest.fixture(scope="module")
def cgroup() -> Path:
    with memory_cgroup(MEMORY_LIMIT) as procs:
        yield procs


@pytest.fixture(scope="module")
def far(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.Timestamp]:
    """The emfile recording with its last socket() of part 5 three years later."""
    recording = damage.copy(damage.EMFILE, tmp_path_factory.mktemp("far") / "rec")
    part = damage.parts(recording)[3]
    times = pq.read_table(part, columns=["time", "kind"])
    assert str(times["kind"][15]) == "socket"
    moved = times["time"][15].value + damage.THREE_YEARS
    damage.set_times(part, 15, moved)
    return recording, pd.Timestamp(moved, unit="ns", tz="UTC")


@pytest.mark.parametrize("engine", ENGINES)
def test_an_event_three_years_later_is_named_and_left_off_the_timelines(
        engine: str, far: tuple[Path, pd.Timestamp], cgroup: Path, tmp_path: Path) -> None:
    recording, moved = far
    assert f"{moved:%Y-%m-%d %H:%M:%S}" == "2029-11-29 05:36:15"
    said = (f"1 event far outside the recorded span (socket 1), at {moved:%Y-%m-%d %H:%M:%S} UTC: left off the "
            "timelines (a clock step, or a damaged or planted file)")
    report = tmp_path / "report.md"
    damage.succeeded(damage.fdtrace("report", str(recording), "--engine", engine, "-o", str(report), procs=cgroup))
    text = report.read_text()
    assert f"- **span**: {SPAN}\n" in text and "- **events**: 76\n" in text
    assert f"- **outside the span**: {said}\n" in text
    timeline = text.split("## Timeline\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert timeline == ["| at | socket | EMFILE+ENFILE |", "|---|---|---|", "| 2026-11-30 05:36:13.000 UTC | 8 | 0 |",
                        "| 2026-11-30 05:36:14.000 UTC | 32 | 0 |", "| 2026-11-30 05:36:15.000 UTC | 23 | 4 |"]
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine, procs=cgroup))
    assert f"\n{INFO_SPAN}\n  {said}\nevents: 76\n" in info.stdout


@pytest.fixture(scope="module")
def ends(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two events of one part at the ends of int64."""
    recording = damage.copy(damage.EMFILE, tmp_path_factory.mktemp("ends") / "rec")
    part = damage.parts(recording)[2]
    damage.set_times(part, 0, (1 << 63) - 1)
    damage.set_times(part, 1, -(1 << 63))
    return recording, part


@pytest.mark.parametrize("engine", ENGINES)
def test_times_at_the_ends_of_int64_are_left_out_and_named(engine: str, ends: tuple[Path, Path], cgroup: Path,
                                                            tmp_path: Path) -> None:
    recording, part = ends
    note = (f"fdtrace: {part}: 2 of 16 rows left out (time missing or impossible (2); times must be from 1970 "
            "to 2116)")
    report = damage.succeeded(damage.fdtrace("report", str(recording), "--engine", engine,
                                             "-o", str(tmp_path / "r.md"), procs=cgroup))
    assert note in report.stderr.splitlines()
    text = (tmp_path / "r.md").read_text()
    assert f"- **span**: {SPAN}\n" in text and "- **events**: 74\n" in text and "outside the span" not in text
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine, procs=cgroup))
    assert f"\nread in part or once:\n  {note.removeprefix('fdtrace: ')}\n" in info.stdout
    assert f"\n{INFO_SPAN}\nevents: 74\n" in info.stdout


@pytest.fixture(scope="module")
def long_name(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The first events part: one event, whose task name is 300 MB long (zstd keeps it small)."""
    recording = damage.copy(damage.EMFILE, tmp_path_factory.mktemp("long") / "rec")
    part = damage.parts(recording)[0]
    damage.huge_comm(part, 300_000_000)
    return recording, part


@pytest.mark.parametrize("engine", ["auto", "duckdb"])
def test_a_300_mb_name_in_a_small_part_is_not_read_and_is_named(engine: str, long_name: tuple[Path, Path],
                                                                 cgroup: Path, tmp_path: Path) -> None:
    recording, part = long_name
    assert part.stat().st_size < 64 << 10
    metadata = pq.read_metadata(part)
    taken = next(metadata.row_group(0).column(i).total_uncompressed_size for i in range(metadata.num_columns)
                 if metadata.row_group(0).column(i).path_in_schema == "comm")
    assert taken > 300_000_000
    note = (f"{part}: comm of 1 row not read ({taken:,} bytes decompressed, more than fdtrace reads for 1 row): "
            "read as '(too long to read)'")
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine, procs=cgroup))
    assert f"\nread in part or once:\n  {note}\n" in info.stdout and "\nevents: 69\n" in info.stdout
    report = damage.succeeded(damage.fdtrace("report", str(recording), "--engine", engine,
                                             "-o", str(tmp_path / "r.md"), procs=cgroup))
    assert f"fdtrace: {note}" in report.stderr.splitlines()
    assert "- **events**: 69\n" in (tmp_path / "r.md").read_text()


@pytest.fixture(scope="module")
def nested(tmp_path_factory: pytest.TempPathFactory) -> Path:
    recording = damage.copy(damage.EMFILE, tmp_path_factory.mktemp("nested") / "rec")
    damage.nest_meta(recording, 100_000)
    return recording


COMMANDS = [["info"], ["info", "--engine", "duckdb"], ["report", "-o", "{out}/r.html"],
            ["trace-export", "-o", "{out}/t.json"], ["doctor", "--from"], ["compact"], ["leaks", "--from"],
            ["threads", "--from"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:3]))
def test_metadata_nested_100000_deep_is_refused_in_one_line(command: list[str], nested: Path, cgroup: Path,
                                                            tmp_path: Path) -> None:
    argv = [part.format(out=tmp_path) for part in command]
    line = damage.one_line_error(damage.fdtrace(*argv, str(nested), procs=cgroup))
    assert line == (f"fdtrace: error: {nested}/meta/host=vm.json: unreadable recording metadata (nested 100001 "
                    "levels deep, more than the 32 fdtrace reads)")


def test_replay_of_metadata_nested_deep_is_refused_and_a_fleet_reads_its_other_hosts(nested: Path,
                                                                                     tmp_path: Path) -> None:
    with pytest.raises(FdtraceError, match="nested 100001 levels deep"):
        ReplaySource(nested)
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    (fleet / "bad").symlink_to(nested)  # a link is not followed: the copy below is what the fleet has
    damage.copy(nested, fleet / "deep")
    damage.copy(damage.DDP, fleet / "ddp")
    info = damage.succeeded(damage.fdtrace("info", str(fleet)))
    assert "\nevents: 19287\n" in info.stdout
    assert (f"\nskipped unreadable files:\n  {fleet}/deep/meta/host=vm.json: unreadable recording metadata (nested "
            "100001 levels deep, more than the 32 fdtrace reads)\n") in info.stdout + "\n"
    replay = ReplaySource(fleet, clock=lambda: 0)
    assert replay.player.events.num_rows == 19287 and len(replay.skipped) == 1
