"""Recordings crafted to change fdtrace's answer or to reach the reader's page (issue 37, K and O):
a process name holding escape sequences and HTML, parts copied under other names or named
outside the layout, and values no kernel gives (a pid of -1, a soft limit of -1 or 2^62-1,
-5 open descriptors, an anon RSS of 2^61 kB, an errno no kernel has). Each is made by the test
from a copy of tests/data/emfile (fdtrace's own recording of a process reaching EMFILE) and each
finding must be one warning line with its count, the answer the honest recording gives, and no
advice made from an impossible value."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fdtrace.display import shown
from tests.hostile import mutations as damage

#: An OSC title change, a bell and HTML that would run in the report's page.
NAME = "\x1b]0;PWNED\x07</script><svg onload=alert(1)>"


def _renamed(table: pa.Table) -> pa.Table:
    comm = table["comm"].cast(pa.string())
    names = pa.array([NAME if value == "emfile-child" else value for value in comm.to_pylist()], pa.string())
    return damage.set_column(table, "comm", names.cast(table["comm"].type))


def test_the_html_report_shows_a_hostile_name_as_text(tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    for table in ("events", "samples", "counters"):
        for part in damage.parts(recording, table):
            damage.rewrite(part, _renamed)
    page = tmp_path / "report.html"
    damage.succeeded(damage.fdtrace("report", str(recording), "-o", str(page)))
    text = page.read_text()
    for raw in ("\x1b", "\x07", "<svg onload", "</script><svg"):
        assert raw not in text, raw
    assert html.escape(shown(NAME)) in text  # the name is there, as text
    assert len(re.findall(r"<script\b", text)) == text.count("</script>")  # every script is plotly's own


ENGINES = ["pandas", "duckdb"]


def advice_and_failures(stdout: str) -> str:
    """What `info` says went wrong and what to change (the answer a mutation must not change)."""
    return stdout.split("\nhost ", 1)[0]


@pytest.fixture(scope="module")
def honest() -> dict[str, str]:
    return {engine: advice_and_failures(damage.succeeded(damage.fdtrace("info", str(damage.EMFILE), "--engine",
                                                                        engine)).stdout) for engine in ENGINES}


def noted(stdout: str) -> list[str]:
    """The lines `info` prints under "read in part or once" and "skipped unreadable files"."""
    lines = stdout.splitlines()
    found = []
    for heading in ("read in part or once:", "skipped unreadable files:"):
        if heading in lines:
            at = lines.index(heading) + 1
            while at < len(lines) and lines[at].startswith("  "):
                found.append(lines[at].strip())
                at += 1
    return found


@pytest.mark.parametrize("engine", ENGINES)
def test_a_part_copied_under_another_flushs_name_is_read_once(engine: str, honest: dict[str, str],
                                                              tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    last = damage.parts(recording)[-1]
    (last.parent / "part-000099.parquet").write_bytes(last.read_bytes())
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine)).stdout
    assert "\nevents: 76\n" in info and advice_and_failures(info) == honest[engine]
    assert noted(info) == [f"{last.parent}: 1 part holding the same rows at the same times as another part, read "
                           f"once: part-000099.parquet (of {last.name})"]


@pytest.mark.parametrize("engine", ENGINES)
def test_parts_named_outside_the_layout_are_named_and_not_read(engine: str, honest: dict[str, str],
                                                               tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    last = damage.parts(recording)[-1]
    for name in ("part-10.parquet", "part-0000010.parquet", "part-000010 (copy).parquet"):
        (last.parent / name).write_bytes(last.read_bytes())
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine)).stdout
    assert "\nevents: 76\n" in info and advice_and_failures(info) == honest[engine]
    assert noted(info) == [f"{last.parent}: 3 files named outside the layout (part-NNNNNN.parquet, "
                           "part-NNNNNN-NNNNNN.parquet) not read: part-0000010.parquet, part-000010 (copy).parquet, "
                           "part-10.parquet"]


def _set_sample(recording: Path, column: str, value: int, pid: int = 15007) -> Path:
    """``column`` of the first sample of ``pid`` (not its peak) set to ``value``; its part."""
    for part in damage.parts(recording, "samples"):
        table = pq.read_table(part)
        pids = table["pid"].to_pylist()
        if pid in pids:
            values = table[column].to_pylist()
            values[pids.index(pid)] = value
            damage.rewrite(part, lambda t, v=values: damage.set_column(t, column, pa.array(v, t[column].type)))
            return part
    raise AssertionError(f"no sample of {pid}")


BOUNDS = {"fd_soft_limit": "1 to 2,147,483,647", "open_fds": "0 to 2,147,483,647", "pid": "1 to 4,194,304"}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("column", "value"), [("fd_soft_limit", 0), ("fd_soft_limit", -1),
                                               ("fd_soft_limit", (1 << 62) - 1), ("open_fds", -5), ("pid", -1)],
                         ids=lambda v: str(v))
def test_an_impossible_sample_is_left_out_and_named_and_changes_no_answer(
        engine: str, column: str, value: int, honest: dict[str, str], tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    part = _set_sample(recording, column, value)
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine)).stdout
    assert advice_and_failures(info) == honest[engine]  # still "reached its FD limit, 64 of 64"; no "set it to 6"
    rows = pq.read_metadata(part).num_rows
    assert noted(info) == [f"{part}: 1 of {rows} rows left out ({column} missing or impossible (1); {column} from "
                           f"{BOUNDS[column]})"]


@pytest.mark.parametrize("engine", ENGINES)
def test_every_sample_of_a_process_impossible_gives_no_figure(engine: str, tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    for part in damage.parts(recording, "samples"):
        damage.rewrite(part, lambda t: damage.set_column(t, "fd_soft_limit", pa.array(
            [-1 if p == 15007 else v for p, v in zip(t["pid"].to_pylist(), t["fd_soft_limit"].to_pylist(),
                                                     strict=True)], t["fd_soft_limit"].type)))
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine)).stdout
    advice = [line for line in info.splitlines() if "emfile-child [15007]" in line and "RLIMIT_NOFILE" in line]
    assert advice == ["  RLIMIT_NOFILE of emfile-child [15007], failed 4 times with EMFILE; no sample of it holds a "
                      "limit or a peak fdtrace can believe, so no figure is advised (fdtrace doctor --pid while it "
                      "runs gives one)."]
    assert "soft limit -1" not in info and "set it to 0" not in info


@pytest.mark.parametrize("engine", ENGINES)
def test_a_pid_of_minus_one_is_never_shown(engine: str, tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    part, index = damage.first_of_kind(recording, "fd_error")
    pids = pq.read_table(part)["pid"].to_pylist()
    pids[index] = -1
    damage.rewrite(part, lambda t: damage.set_column(t, "pid", pa.array(pids, t["pid"].type)))
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine)).stdout
    assert "[-1]" not in info and "\nevents: 75\n" in info
    assert noted(info) == [f"{part}: 1 of {len(pids)} rows left out (pid missing or impossible (1); pid from "
                           f"{BOUNDS['pid']})"]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_anon_rss_of_2_61_kb_is_never_shown(engine: str, tmp_path: Path) -> None:
    recording = damage.copy(damage.DATA / "newcomer", tmp_path / "rec")  # recorded with memory figures
    pid = pq.read_table(damage.parts(recording, "samples")[0], columns=["pid"])["pid"][0].as_py()
    part = _set_sample(recording, "rss_anon_kb", 1 << 61, pid)
    report = tmp_path / "r.md"
    result = damage.succeeded(damage.fdtrace("report", str(recording), "--engine", engine, "-o", str(report)))
    text = report.read_text()
    for figure in (1 << 61, 1 << 51, (1 << 61) * 1024):  # kB, MiB, bytes
        assert str(figure) not in text.replace(",", "")
    assert (f"fdtrace: {part}: 1 impossible value read as missing (rss_anon_kb 1; counts cannot be negative, nor any "
            "number 2^62 or more, rss_anon_kb from 0 to 140,737,488,355,328)") in result.stderr.splitlines()


@pytest.mark.parametrize("engine", ENGINES)
def test_an_unknown_errno_is_counted_and_shown_by_number(engine: str, tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    changed = []
    for part in damage.parts(recording):
        errnos = pq.read_table(part, columns=["errno"])["errno"].cast(pa.string()).to_pylist()
        if "EMFILE" in errnos:
            changed.append((part, errnos.count("EMFILE")))
            damage.rewrite(part, lambda t: damage.set_column(t, "errno", pa.array(
                ["E4000" if e == "EMFILE" else e for e in t["errno"].cast(pa.string()).to_pylist()],
                pa.string()).cast(t["errno"].type)))
    info = damage.succeeded(damage.fdtrace("info", str(recording), "--engine", engine)).stdout
    assert "\nevents: 76\n" in info
    assert noted(info) == [f"{part}: {n} call{'s' if n > 1 else ''} with an errno no kernel names, counted as failed "
                           f"calls and shown by number (errno 4000 {n})" for part, n in changed]
    assert sum(n for _, n in changed) == damage.EMFILE_FAILURES
