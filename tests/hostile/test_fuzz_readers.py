"""Random damage to a recording (made by fdtrace's own recorder): whatever is broken, every
reader (load, info and report in pandas and in DuckDB over the files, trace-export, replay,
doctor --from) either carries on with the rest or stops with one FdtraceError, never another
exception, and none of them needs more memory than a bound that no value in the recording
moves. Seeded: the same cases every run. The damage is what corrupt disks, bad copies, clock
steps and local users were seen to do (tests/hostile/mutations.py has each kind)."""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fdtrace.analysis import load
from fdtrace.analysis.chrome_trace import chrome_trace
from fdtrace.analysis.report import build, to_html, to_markdown
from fdtrace.analysis.summary import summary
from fdtrace.doctor import report as doctor_report
from fdtrace.doctor.checks import Doctor
from fdtrace.errors import FdtraceError
from fdtrace.sources.replay import ReplaySource
from tests.hostile import mutations as damage

FIXTURES = [damage.EMFILE, damage.DDP]
CASES = 80  # seeded; each case runs every reader (about 3 s); bench/fuzz_readers.py runs more
#: What one case may add to the process's peak memory (its resident set), whatever it read.
MEMORY_BOUND = 512 << 20

META_VALUES: list[object] = [[], [1, 2], 3, "text", None, {}, {"host": "vm"}, {"schema_version": 2},
                             {"schema_version": [2], "host": "vm"}, {"schema_version": "2", "host": "vm"},
                             {"schema_version": 2, "host": ["vm"]}, {"schema_version": 2, "host": "elsewhere"},
                             {"schema_version": 2, "host": "vm", "options": "x", "rows": [], "rotated_out": 5},
                             {"schema_version": True, "host": "vm"}, {"schema_version": 6.0, "host": "vm"},
                             {"schema_version": 2, "host": "vm", "rotated_out": {"files": "x", "rows": 5}},
                             {"schema_version": 2, "host": "vm", "probes_skipped": [1, None]}]
#: Times that no clock gives, and one that a clock step gives.
EXTREME_TIMES = [-(1 << 63), (1 << 63) - 1, -1, 1 << 62, 1_796_016_978 * damage.SECOND + damage.THREE_YEARS]


def mutate_meta(meta: Path, rng: random.Random) -> str:
    choice = rng.randrange(5)
    if choice == 0:
        meta.write_text(json.dumps(rng.choice(META_VALUES)))
        return "meta replaced"
    data = meta.read_bytes()
    if choice == 1:
        meta.write_bytes(data[: rng.randrange(len(data))])
        return "meta truncated"
    if choice == 2:
        content = json.loads(data)
        key = rng.choice(sorted(content))
        content[key] = rng.choice([None, "x", -1, [], {}, 10**30, True, float("nan")])
        meta.write_text(json.dumps(content))
        return f"meta {key} retyped"
    if choice == 3:
        damage.nest_meta(meta.parents[1], rng.choice([40, 100_000]))
        return "meta nested"
    meta.unlink()
    os.mkfifo(meta)
    return "meta is a FIFO"


def mutate_summary(part: Path, rng: random.Random) -> str:
    """Damage to an events part's footer summary (it has one: the recording was compacted)."""
    try:
        summary_of = damage.read_summary_json(part)
    except (ValueError, KeyError, RecursionError):  # damaged already: a summary of nothing instead
        damage.set_summary(part, {})
        return "summary emptied"
    choice = rng.randrange(6)
    if choice == 0:
        del summary_of[rng.choice(["kinds", "failed", "connects", "version"])]
    elif choice == 1:
        rows = summary_of[rng.choice(["kinds", "failed"])]
        assert isinstance(rows, list)
        if rows:
            row = rng.choice(rows)
            row[rng.randrange(len(row))] = rng.choice(["many", None, -5, 1.5, [], True, 10**30])
    elif choice == 2:
        summary_of["failed"] = []  # a lie that hides the EMFILE
    elif choice == 3:
        kinds = summary_of["kinds"]
        assert isinstance(kinds, list)
        for row in kinds:
            row[1] *= 2
    elif choice == 4:
        damage.set_summary(part, b"[" * 100_000)
        return "summary nested"
    else:
        damage.set_summary(part, b"\xff not json")
        return "summary not JSON"
    damage.set_summary(part, summary_of)
    return f"summary changed ({choice})"


def mutate_part(part: Path, rng: random.Random, others: list[Path]) -> str:
    choice = rng.randrange(14)
    data = part.read_bytes()
    if choice == 0:
        part.write_bytes(data[: rng.randrange(len(data))])
        return "part truncated"
    if choice == 1:
        damaged = bytearray(data)
        for _ in range(rng.randrange(1, 20)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        part.write_bytes(bytes(damaged))
        return "part bytes flipped"
    if choice == 2:
        table = pq.read_table(part)
        name = rng.choice(table.column_names)
        index = table.column_names.index(name)
        table = table.set_column(index, name, pa.array(["x"] * table.num_rows))
        pq.write_table(table, part)
        return f"part {name} as strings"
    if choice == 3:
        table = pq.read_table(part)
        name = rng.choice(table.column_names)
        pq.write_table(table.drop_columns([name]), part)
        return f"part without {name}"
    if choice == 4:
        shutil.copyfile(rng.choice(others), part)
        return "part of another table"
    if choice == 5:
        part.unlink()
        os.mkfifo(part)
        return "part is a FIFO"
    if choice == 6:
        part.write_bytes(b"")
        return "part empty"
    if choice == 7:
        damage.truncate_half(part)
        return "part cut in half"
    if choice == 8:
        damage.flip_page_bytes(part)
        return "part pages inverted"
    if choice == 9:
        damage.all_null(part)
        return "part all null"
    if choice == 10 and "time" in pq.read_schema(part).names and pq.read_metadata(part).num_rows:
        damage.set_times(part, rng.randrange(pq.read_metadata(part).num_rows), rng.choice(EXTREME_TIMES))
        return "part with an extreme time"
    if choice == 11 and "comm" in pq.read_schema(part).names and pq.read_metadata(part).num_rows:
        damage.huge_comm(part, size=rng.choice([5000, 2 << 20]))
        return "part with a long comm"
    if choice == 12:
        table = pq.read_table(part)
        numbers = [n for n in table.column_names if pa.types.is_integer(table[n].type)]
        if numbers:
            name = rng.choice(numbers)
            value = rng.choice([-(1 << 63), -10**15, (1 << 63) - 1])
            pq.write_table(damage.set_column(table, name, pa.array([value] * table.num_rows, pa.int64())), part)
            return f"part {name} extreme"
    if choice == 13 and "pid" in pq.read_schema(part).names:
        damage.float_pid(part)
        return "part pid as float"
    recording = part.parents[2]
    if damage.parts(recording):
        damage.plant_wide_part(recording, rows=1)
        return "wide part planted"
    return "nothing"


def compacted_fixtures(base: Path) -> dict[Path, Path]:
    """Each fixture compacted once (its events parts then carry summaries), to copy from."""
    return {fixture: damage.compacted(fixture, base / fixture.name) for fixture in FIXTURES}


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Path]:
    return compacted_fixtures(tmp_path_factory.mktemp("compacted"))


def readers(path: Path) -> list[tuple[str, Callable[[], object]]]:
    loaded: list[object] = []

    def pandas() -> object:
        if not loaded:
            loaded.append(load(path))
        return loaded[0]

    def duckdb() -> None:
        recording = load(path, engine="duckdb")
        try:
            summary(recording)
            content = build(recording)
            to_html(content)
            to_markdown(content)
        finally:
            recording.close()

    def replay() -> None:
        source = ReplaySource(path, clock=iter(range(0, 10**15, 10**9)).__next__)
        for _ in range(20):
            source.poll()
        source.next_problem()
        source.status()

    def doctor_from() -> None:
        checker = Doctor()
        doctor_report.apply_recording(path, checker, [])

    return [("load", pandas),
            ("info", lambda: summary(pandas())),
            ("report", lambda: (lambda content: (to_html(content), to_markdown(content)))(build(pandas()))),
            ("trace-export", lambda: chrome_trace(pandas())),
            ("duckdb info and report", duckdb),
            ("replay", replay),
            ("doctor --from", doctor_from)]


def _peak_rss() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) << 10


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak resident set becomes the current one


@pytest.mark.parametrize("case", range(CASES))
def test_damaged_recordings_are_read_or_refused_in_one_line(case: int, tmp_path: Path,
                                                            compacted: dict[Path, Path]) -> None:
    run_case(case, tmp_path, compacted)


def run_case(case: int, tmp_path: Path, compacted: dict[Path, Path]) -> None:
    """Damage a copy of a fixture as seed ``case`` says, and run every reader over it; fails (a
    pytest failure) when one raises anything but a one-line FdtraceError or needs more memory
    than MEMORY_BOUND."""
    rng = random.Random(case)
    fixture = FIXTURES[case % len(FIXTURES)]
    summarized = rng.random() < 0.3
    fleet = tmp_path / "fleet"
    copy = fleet / "rec"
    shutil.copytree(compacted[fixture] if summarized else fixture, copy)
    parts = sorted(copy.rglob("part-*.parquet"))
    damage_done = []
    for _ in range(rng.randrange(1, 4)):
        if rng.random() < 0.2:
            damage_done.append(mutate_meta(damage.meta_file(copy), rng))
            break
        if summarized and rng.random() < 0.4:
            events = [p for p in parts if p.parent.parent.name == "events" and p.is_file()]
            damage_done.append(mutate_summary(rng.choice(events), rng))
            continue
        part = rng.choice(parts)
        if part.is_file() and not part.is_symlink():
            others = [p for p in parts if p.parent != part.parent and p.is_file()]
            try:
                damage_done.append(mutate_part(part, rng, others))
            except (OSError, pa.ArrowException):  # damaged already, past what this damage reads
                damage_done.append("part left as it was")
    if rng.random() < 0.15:  # the same host twice (FIFOs left out: copying one would wait for a writer)
        shutil.copytree(copy, fleet / "copy", symlinks=True, ignore=lambda folder, names: [
            n for n in names if not (Path(folder) / n).is_dir() and not (Path(folder) / n).is_file()])
        damage_done.append("copied twice")
    for name, read in readers(fleet):
        _reset_peak_rss()
        before = _peak_rss()
        try:
            read()
        except FdtraceError as error:
            assert "\n" not in str(error), (damage_done, name, str(error))
        except Exception as exc:  # noqa: BLE001 - what the test is looking for
            pytest.fail(f"{name} after {damage_done}: {type(exc).__name__}: {exc}")
        grew = _peak_rss() - before
        assert grew < MEMORY_BOUND, f"{name} after {damage_done}: its peak memory grew by {grew >> 20} MiB"
