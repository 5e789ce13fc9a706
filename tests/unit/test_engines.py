"""One fleet, three engines, the same answers: a small fleet written by fdtrace's own recording
writer (bench/fleet_data.py, the benchmark's generator at a small size) is analysed in pandas,
in DuckDB over its Parquet files and in Spark local[2], and every analysis gives the same
result, with the exact counts the generator wrote."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from fdtrace.analysis import destinations, failures, incidents, least_headroom, load, rates
from fdtrace.analysis.report import build, to_markdown
from fdtrace.analysis.summary import summary
from fdtrace.recording.compaction import compact_host
from fdtrace.recording.fleet import find_fleet
from tests.helpers import FDTRACE

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from fleet_data import HostTruth, generate_fleet  # noqa: E402

#: How far the generated hosts' wall clocks are off (host index -> ns ahead of true time).
CLOCK_ERRORS = {1: 2_000_000, 2: -1_500_000_000}


@pytest.fixture(scope="module", autouse=True)
def _spark_jvm_stopped() -> Iterator[None]:
    """Spark's ``session.stop()`` leaves the JVM that pyspark started (its py4j gateway) running
    until Python exits, and the rest of the suite ran beside it. After this module the gateway is
    shut down, the JVM ended (its stdin closed: PythonGatewayServer exits at end of file) and
    py4j's threads joined (its finalizer worker looks for its shutdown once a second)."""
    before = set(threading.enumerate())
    yield
    context = sys.modules.get("pyspark.core.context") or sys.modules.get("pyspark.context")
    gateway = getattr(getattr(context, "SparkContext", None), "_gateway", None)
    if gateway is None:
        return
    spark_context = context.SparkContext  # type: ignore[union-attr]
    if spark_context._active_spark_context is not None:
        spark_context._active_spark_context.stop()
    gateway.shutdown()
    jvm = getattr(gateway, "proc", None)
    spark_context._gateway = spark_context._jvm = None
    if jvm is None:
        return
    if jvm.stdin is not None:
        jvm.stdin.close()
    try:
        jvm.wait(timeout=60)
    except subprocess.TimeoutExpired:
        jvm.kill()
        jvm.wait()
        raise AssertionError("Spark's JVM did not end when its gateway's stdin closed") from None
    for thread in set(threading.enumerate()) - before:
        target = getattr(thread, "_target", None)
        if type(thread).__module__.startswith("py4j") or getattr(target, "__module__", "").startswith("py4j"):
            thread.join(timeout=30)
            assert not thread.is_alive(), f"py4j's thread {thread.name} outlived its gateway"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[HostTruth]]:
    root = tmp_path_factory.mktemp("fleet")
    truths = generate_fleet(root, hosts=3, events_per_host=700_000, seconds=60, clock_errors_ns=CLOCK_ERRORS)
    for host in find_fleet(root).hosts:  # as after copying a fleet: merged parts, with their summaries
        compact_host(host)
    return root, truths


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


@pytest.mark.parametrize("engine", ["pandas", "duckdb"])
def test_one_clock_for_the_fleet(engine: str, fleet: tuple[Path, list[HostTruth]], recordings: Any) -> None:
    """The connections between the hosts give each host's clock error (the generator's
    handshakes take 30 µs each way, so that is the uncertainty), and the failures line up on
    the corrected clock: every host's first failure at its true time."""
    _, truths = fleet
    offsets = recordings[engine].clock_offsets.set_index("host")
    for index, truth in enumerate(truths):
        row = offsets.loc[truth.host]
        assert abs(row["offset_ns"] - CLOCK_ERRORS.get(index, 0)) <= row["uncertainty_ns"]
        assert row["uncertainty_ns"] == (0 if row["reference"] else 30_000) and (row["reference"] or row["pairs"] == 12)
    firsts = failures(recordings[engine]).groupby("host", observed=True)["time"].min()
    for index, truth in enumerate(truths):
        assert firsts[truth.host].value == truth.first_failure_ns - CLOCK_ERRORS.get(index, 0)
    plain = load(fleet[0], engine=engine, clock_correction=False)
    try:
        assert failures(plain).groupby("host", observed=True)["time"].min()["host-02"].value == \
            truths[2].first_failure_ns
    finally:
        getattr(plain, "close", lambda: None)()


def test_duckdb_gives_what_pandas_gives(recordings: Any) -> None:
    pandas, duck = recordings["pandas"], recordings["duckdb"]
    for analysis in (lambda r: rates(r, by="comm", freq="1s"), lambda r: rates(r, kind="accept", errno="EMFILE"),
                     failures, incidents, destinations, least_headroom,
                     lambda r: least_headroom(r, resource="threads")):
        pd.testing.assert_frame_equal(analysis(pandas), analysis(duck), check_dtype=False)
    assert duck.part_summaries() is not None  # so `info` read the parts' summaries, not the events
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
        pd.testing.assert_frame_equal(spark.clock_offsets, duck.clock_offsets, check_dtype=False)
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
    assert "  clock: -1.500000 s from the reference (± 0.030 ms, 12 connection pairs), corrected\n" in shown
    wrong = shown.splitlines()
    # by harm (schema.failures.HARM): EMFILE and OOM kills are one class, the most failures first
    assert wrong[1].startswith("  haproxy [1000] on host-00: 1200 calls failed (EMFILE accept4 1200)")
    assert any(line.startswith("  python [1002] on host-00: OOM-killed at ") for line in wrong[2:])
    refused = subprocess.run([FDTRACE, "info", str(root), "--engine", "duckdb", "--memory-limit", "lots"],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1 and "Memory must have a number" in refused.stderr


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
    # the FIFO is no part of the recording (its manifest does not name it): never opened, nor named
    assert "part-900001.parquet" not in result.stdout and f"{victim}:" in result.stdout
    # A part whose footer reads but whose pages do not: the report leaves it out and names it.
    damaged = sorted((copy / "events" / "host=host-01").glob("part-*.parquet"))[0]
    data = bytearray(damaged.read_bytes())
    for i in range(len(data) // 5, len(data) * 3 // 5):
        data[i] ^= 0x5A
    damaged.write_bytes(bytes(data))
    report = subprocess.run([FDTRACE, "report", str(tree), "--engine", "duckdb", "-o", str(tmp_path / "r.md")],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert f"fdtrace: skipped {damaged}:" in report.stderr and "Traceback" not in report.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = subprocess.run([FDTRACE, "info", str(empty), "--engine", "duckdb"], capture_output=True, text=True)
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1 and "not an fdtrace recording" in refused.stderr


@pytest.mark.parametrize("engine", ["pandas", "duckdb"])
def test_the_rare_kinds_kept_once_give_what_the_events_give(engine: str) -> None:
    """tests/data/newcomer (process starts, a limit change, a Go thread limit, EMFILE from socket
    and accept): the analyses `info` runs over the rare kinds read the same rows from the small
    tables kept once (Engine.keep_derived) as from the events, and those tables hold every row of
    those kinds and every EMFILE/ENFILE call."""
    from fdtrace.analysis.engines.dataset import engine_for
    from fdtrace.analysis.limits import limit_changes_on
    from fdtrace.analysis.memory import memory_needs_on, oom_victims_on
    from fdtrace.analysis.needs import fd_needs_on
    from fdtrace.analysis.report.advice import thread_advice

    def analyses(runner: Any) -> list[Any]:
        needs = fd_needs_on(runner)
        memory = memory_needs_on(runner, needs)  # ordered by usage: its ties in any order
        memory = memory.sort_values(["host", "pid", "start_ns"], kind="stable").reset_index(drop=True)
        return [needs, limit_changes_on(runner), oom_victims_on(runner), memory, thread_advice(runner)]

    with load(ROOT / "tests" / "data" / "newcomer", engine=engine) as recording, engine_for(recording) as runner:
        from_events = analyses(runner)
        counted = runner.query("SELECT kind, count(*) AS n FROM events WHERE kind IN ('process_start', "
                               "'limit_change', 'go_thread_limit', 'oom_kill') OR errno IN ('EMFILE', 'ENFILE') "
                               "GROUP BY kind")
        runner.keep_derived()
        assert runner.derived("rare_events").startswith("_kept_")
        rare = runner.query(f"SELECT kind, count(*) AS n FROM {runner.derived('rare_events')} GROUP BY kind")
        failed = runner.query(f"SELECT kind, CAST(sum(n) AS BIGINT) AS n FROM {runner.derived('fd_failures')} "
                              "GROUP BY kind")
        kept = analyses(runner)
    assert dict(zip(counted["kind"], counted["n"], strict=True)) == {
        "process_start": 508, "limit_change": 1, "go_thread_limit": 1, "accept": 105, "socket": 183}
    assert dict(zip(rare["kind"], rare["n"], strict=True)) == {"process_start": 508, "limit_change": 1,
                                                               "go_thread_limit": 1}
    assert dict(zip(failed["kind"], failed["n"], strict=True)) == {"accept": 105, "socket": 183}
    for before, after in zip(from_events[:-1], kept[:-1], strict=True):
        pd.testing.assert_frame_equal(before, after)
    assert from_events[-1] == kept[-1] and kept[0]["emfile"].sum() == 288
