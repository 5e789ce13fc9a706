"""Random damage to a recording (made by fdtrace's own recorder): whatever is broken, every
reader (load, replay, info, report, doctor --from) either carries on with the rest or stops
with one FdtraceError, never another exception. Seeded: the same cases every run."""

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

from fdtrace.analysis.report import build, to_html, to_markdown
from fdtrace.analysis.summary import summary
from fdtrace.doctor import report as doctor_report
from fdtrace.doctor.checks import Doctor
from fdtrace.errors import FdtraceError
from fdtrace.recording import load
from fdtrace.sources.replay import ReplaySource

FIXTURES = [Path(__file__).parents[1] / "data" / name for name in ("emfile", "ddp")]
CASES = 100  # seeded; each case runs every reader (about 2 s), so the suite stays under its 20 minutes

META_VALUES: list[object] = [[], [1, 2], 3, "text", None, {}, {"host": "vm"}, {"schema_version": 2},
                             {"schema_version": [2], "host": "vm"}, {"schema_version": "2", "host": "vm"},
                             {"schema_version": 2, "host": ["vm"]}, {"schema_version": 2, "host": "elsewhere"},
                             {"schema_version": 2, "host": "vm", "options": "x", "rows": [], "rotated_out": 5}]


def mutate_meta(meta: Path, rng: random.Random) -> str:
    choice = rng.randrange(4)
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
        content[key] = rng.choice([None, "x", -1, [], {}, 10**30])
        meta.write_text(json.dumps(content))
        return f"meta {key} retyped"
    meta.unlink()
    os.mkfifo(meta)
    return "meta is a FIFO"


def mutate_part(part: Path, rng: random.Random, others: list[Path]) -> str:
    choice = rng.randrange(7)
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
    part.write_bytes(b"")
    return "part empty"


def readers(path: Path) -> list[tuple[str, Callable[[], object]]]:
    def replay() -> None:
        source = ReplaySource(path, clock=iter(range(0, 10**15, 10**9)).__next__)
        for _ in range(20):
            source.poll()
        source.next_problem()

    def doctor_from() -> None:
        checker = Doctor()
        doctor_report.apply_recording(path, checker, [])

    return [("load", lambda: load(path)),
            ("info", lambda: summary(load(path))),
            ("report", lambda: (lambda content: (to_html(content), to_markdown(content)))(build(load(path)))),
            ("replay", replay),
            ("doctor --from", doctor_from)]


@pytest.mark.parametrize("case", range(CASES))
def test_damaged_recordings_are_read_or_refused_in_one_line(case: int, tmp_path: Path) -> None:
    rng = random.Random(case)
    fixture = FIXTURES[case % len(FIXTURES)]
    copy = tmp_path / "rec"
    shutil.copytree(fixture, copy)
    parts = sorted(copy.rglob("part-*.parquet"))
    damage = []
    for _ in range(rng.randrange(1, 4)):
        if rng.random() < 0.25:
            damage.append(mutate_meta(next((copy / "meta").glob("host=*.json")), rng))
            break
        part = rng.choice(parts)
        if part.is_file() and not part.is_symlink():
            damage.append(mutate_part(part, rng, [p for p in parts if p.parent != part.parent and p.is_file()]))
    for name, read in readers(copy):
        try:
            read()
        except FdtraceError as error:
            assert "\n" not in str(error), (damage, name, str(error))
        except Exception as exc:  # noqa: BLE001 - what the test is looking for
            pytest.fail(f"{name} after {damage}: {type(exc).__name__}: {exc}")
