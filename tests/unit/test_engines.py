"""One fleet, three engines, the same answers: a small fleet written by fdtrace's own recording
writer (bench/fleet_data.py, the benchmark's generator at a small size) is analysed in pandas,
in DuckDB over its Parquet files and in Spark local[2], and every analysis gives the same
result, with the exact counts the generator wrote."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from fdtrace.analysis import destinations, failures, incidents, least_headroom, load, rates
from fdtrace.analysis.report import build, to_markdown
from fdtrace.analysis.summary import summary

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from fleet_data import HostTruth, generate_fleet  # noqa: E402

FDTRACE = str(Path(sys.executable).parent / "fdtrace")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[HostTruth]]:
    root = tmp_path_factory.mktemp("fleet")
    return root, generate_fleet(root, hosts=3, events_per_host=700_000, seconds=60)


@pytest.fixture(scope="module")
def recordings(fleet: tuple[Path, list[HostTruth]]) -> Any:
    root, _ = fleet
    duck = load(root, engine="duckdb")
    yield {"pandas": load(root), "duckdb": duck}
    duck.close()


def exact_counts(recording: Any) -> tuple[dict[str, int], Counter[tuple[str, int, str, str]]]:
    per_host = rates(recording, by="host", freq="1min").sum().to_dict()
    fd = failures(recording)
    fd = fd[fd["failure"].str.contains("EMFILE|ENFILE")]
    calls = Counter((str(r.host), int(r.pid), *str(r.failure).split(" ")) for r in fd.itertuples())
    return {str(h): int(n) for h, n in per_host.items()}, calls


def truth_counts(truths: list[HostTruth]) -> tuple[dict[str, int], Counter[tuple[str, int, str, str]]]:
    calls: Counter[tuple[str, int, str, str]] = Counter()
    for truth in truths:
        for (pid, syscall, errno), n in truth.fd_errors.items():
            calls[(truth.host, pid, syscall, errno)] += n
    return {t.host: t.events for t in truths}, calls


@pytest.mark.parametrize("engine", ["pandas", "duckdb"])
def test_exact_per_host_counts(engine: str, fleet: tuple[Path, list[HostTruth]], recordings: Any) -> None:
    _, truths = fleet
    assert sum(t.events for t in truths) > 2_000_000
    assert exact_counts(recordings[engine]) == truth_counts(truths)
    ooms = failures(recordings[engine]).query("failure == 'OOM kill'")
    assert [(str(r.host), int(r.pid)) for r in ooms.itertuples()] == \
        [(t.host, pid) for t in truths for pid in t.oom_kills]


def test_duckdb_gives_what_pandas_gives(recordings: Any) -> None:
    pandas, duck = recordings["pandas"], recordings["duckdb"]
    for analysis in (lambda r: rates(r, by="comm", freq="1s"), lambda r: rates(r, kind="accept", errno="EMFILE"),
                     failures, incidents, destinations, least_headroom,
                     lambda r: least_headroom(r, resource="threads")):
        pd.testing.assert_frame_equal(analysis(pandas), analysis(duck), check_dtype=False)
    assert summary(pandas) == summary(duck)
    assert to_markdown(build(pandas)) == to_markdown(build(duck))


def test_spark_gives_what_duckdb_gives(fleet: tuple[Path, list[HostTruth]], recordings: Any) -> None:
    root, truths = fleet
    spark = load(root, engine="spark")
    try:
        assert exact_counts(spark) == truth_counts(truths)
        duck = recordings["duckdb"]
        for analysis in (failures, least_headroom, destinations):
            pd.testing.assert_frame_equal(analysis(duck), analysis(spark), check_dtype=False)
        assert summary(spark) == summary(duck)
    finally:
        spark.close()


def test_info_of_a_fleet_lists_every_host(fleet: tuple[Path, list[HostTruth]]) -> None:
    root, truths = fleet
    shown = subprocess.run([FDTRACE, "info", str(root), "--engine", "duckdb"], capture_output=True, text=True,
                           check=True).stdout
    for truth in truths:
        lost = f", ringbuf_full {truth.ringbuf_full}" if truth.ringbuf_full else ""
        assert f"host {truth.host}: kernel synthetic" in shown
        assert f" {truth.events} events, {truth.ringbuf_full} lost{lost}\n" in shown
    assert shown.splitlines()[1].startswith("  haproxy [1000] on host-00: 1200 calls failed (EMFILE accept4 1200)")


def test_a_hostile_fleet_tree(tmp_path: Path, fleet: tuple[Path, list[HostTruth]]) -> None:
    """Links out of the tree, a link loop, a FIFO and a truncated file where parts belong: the
    walk neither follows nor hangs, the bad files are named, the rest is counted exactly."""
    root, truths = fleet
    tree = tmp_path / "tree"
    tree.mkdir()
    copy = tree / "racks" / "a"
    copy.parent.mkdir()
    subprocess.run(["cp", "-r", str(root / "host-01"), str(copy)], check=True)
    (tree / "outside").symlink_to(root / "host-00")  # not followed: host-00 is not in this fleet
    (tree / "loop").symlink_to(tree)
    os.mkfifo(copy / "events" / "host=host-01" / "part-900001.parquet")
    victim = sorted((copy / "samples" / "host=host-01").glob("part-*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    result = subprocess.run([FDTRACE, "info", str(tree), "--engine", "duckdb"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "host host-00" not in result.stdout and f"\nevents: {truths[1].events}\n" in result.stdout
    assert "part-900001.parquet: not a regular file" in result.stdout and f"{victim}:" in result.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = subprocess.run([FDTRACE, "info", str(empty), "--engine", "duckdb"], capture_output=True, text=True)
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1 and "no fdtrace recording" in refused.stderr
