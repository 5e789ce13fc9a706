"""A process that failed with EMFILE is judged by the soft limit it had in its worst second: its
last sample before the first failure of that second (issue 38 found them one process at a time;
they are found for all at once now, so a fleet's thousands are judged as one is)."""

from __future__ import annotations

import pandas as pd

from fdtrace.analysis.engines.dataset import Recording
from fdtrace.analysis.needs import fd_needs

START = pd.Timestamp("2026-11-30 04:00:00", tz="UTC")
SECOND = 1_000_000_000


Failure = tuple[int, int | None, int]
Sample = tuple[int, int | None, int, int]


def _recording(failures: list[Failure], samples: list[Sample]) -> Recording:
    """``failures``: (pid, start_ns, ts_ns) of each accept4 refused with EMFILE; ``samples``:
    (pid, start_ns, ts_ns, soft limit), a quarter of it open."""
    events = pd.DataFrame({
        "host": "h", "pid": [pid for pid, _, _ in failures], "tid": [pid for pid, _, _ in failures],
        "start_ns": pd.array([start for _, start, _ in failures], dtype="Int64"), "comm": "worker", "kind": "accept",
        "syscall": "accept4", "errno": "EMFILE", "ret": -24, "ts_ns": [ts for _, _, ts in failures]})
    events["time"] = START + pd.to_timedelta(events["ts_ns"], unit="ns")
    sampled = pd.DataFrame({
        "host": "h", "pid": [pid for pid, *_ in samples],
        "start_ns": pd.array([start for _, start, _, _ in samples], dtype="Int64"), "comm": "worker",
        "ts_ns": [ts for _, _, ts, _ in samples], "open_fds": [soft // 4 for *_, soft in samples],
        "fd_soft_limit": [soft for *_, soft in samples], "fd_hard_limit": 4096, "threads": 4})
    sampled["time"] = START + pd.to_timedelta(sampled["ts_ns"], unit="ns")
    return Recording(events=events, samples=sampled, system=pd.DataFrame(), losses=pd.DataFrame(),
                     counters=pd.DataFrame(), clock=pd.DataFrame(), haproxy=pd.DataFrame(), phases=pd.DataFrame())


def test_each_failing_process_is_judged_by_the_limit_it_had_in_its_worst_second() -> None:
    failures = [(10, 7, 1 * SECOND + 5), (10, 7, 3 * SECOND + 10), (10, 7, 3 * SECOND + 20), (10, 7, 3 * SECOND + 30),
                (11, None, 1 * SECOND + 1), (11, None, 1 * SECOND + 2),
                (12, 7, 2 * SECOND)]
    samples = [(10, 7, 0, 1024), (10, 7, 2 * SECOND, 512), (10, 7, 4 * SECOND, 256),  # lowered twice
               (11, None, 0, 100)]
    needs = fd_needs(_recording(failures, samples)).set_index("pid")
    assert int(needs.loc[10, "fd_soft_limit"]) == 512  # not 1024 (its highest) nor 256 (after the failures)
    assert int(needs.loc[10, "need"]) == 512 + 3  # its worst second refused 3
    assert int(needs.loc[11, "fd_soft_limit"]) == 100 and int(needs.loc[11, "need"]) == 102
    assert pd.isna(needs.loc[12, "fd_soft_limit"])  # never sampled: no limit to judge it by
    assert needs["limit_source"].isna().all()  # no change of a limit was traced


def test_a_thousand_failing_processes_are_each_judged_by_their_own_samples() -> None:
    pids = range(1000, 2000)
    failures = [(pid, 7, 5 * SECOND + pid) for pid in pids for _ in range(pid % 3 + 1)]
    samples = [(pid, 7, second * SECOND, 2000 - pid + second) for pid in pids for second in range(8)]
    needs = fd_needs(_recording(failures, samples)).set_index("pid")
    # each failed just after second 5's sample
    assert [int(needs.loc[pid, "fd_soft_limit"]) for pid in pids] == [2000 - pid + 5 for pid in pids]
    assert [int(needs.loc[pid, "need"]) for pid in pids] == [2000 - pid + 5 + pid % 3 + 1 for pid in pids]
