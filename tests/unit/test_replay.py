"""Replaying a recording made by fdtrace's own recorder (tests/data/emfile)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from fdtrace.analysis import load
from fdtrace.errors import FdtraceError
from fdtrace.schema import arrow_schema
from fdtrace.sources.replay import EventPlayer, ReplaySource

EMFILE = Path(__file__).parents[1] / "data" / "emfile"


class FakeClock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def replay(speed: float = 1.0) -> tuple[EventPlayer, FakeClock]:
    clock = FakeClock()
    return EventPlayer(EMFILE, speed=speed, clock=clock), clock


def test_replay_yields_every_event_once_in_time_order_with_the_live_schema() -> None:
    source, clock = replay()
    seen: list[pa.Table] = []
    while not source.finished:
        clock.ns += 100_000_000
        batch = source.poll()
        assert batch.events.schema.equals(arrow_schema())
        seen.append(batch.events)
    events = pa.concat_tables(seen)
    recorded = load(EMFILE).events
    assert events.num_rows == len(recorded) == 76
    times = events["time"].cast(pa.int64()).to_pylist()
    assert times == sorted(times)
    assert events["kind"].cast(pa.string()).to_pylist() == recorded["kind"].astype(str).tolist()
    assert set(events["host"].cast(pa.string()).to_pylist()) == {"vm"}


def test_speed_scales_the_virtual_clock() -> None:
    source, clock = replay(speed=4.0)
    clock.ns = 250_000_000
    assert source.now_ns == source.start_ns + 1_000_000_000
    source.set_speed(0.5)
    clock.ns += 1_000_000_000
    assert source.now_ns == source.start_ns + 1_500_000_000


def test_pause_freezes_time_and_resume_goes_on_from_there() -> None:
    source, clock = replay()
    clock.ns = 500_000_000
    source.pause()
    first = source.poll()
    clock.ns += 5_000_000_000
    assert source.now_ns == source.start_ns + 500_000_000
    assert len(source.poll()) == 0 and len(first) > 0
    source.resume()
    clock.ns += 100_000_000
    assert source.now_ns == source.start_ns + 600_000_000


def test_seek_next_jumps_to_the_emfile_and_seek_back_replays_again() -> None:
    source, clock = replay()
    first_error = source.seek_next({"fd_error", "oom_kill"})
    recorded = load(EMFILE).events
    expected = recorded[recorded["kind"] == "fd_error"]["time"].iloc[0].value
    assert first_error == expected
    batch = source.poll()
    assert batch.events["kind"].cast(pa.string()).to_pylist()[0] == "fd_error"
    assert source.seek_next({"oom_kill"}) is None
    source.seek(source.start_ns)
    clock.ns += 10**12
    assert len(source.poll()) == 76


def test_losses_come_with_each_batch() -> None:
    source, clock = replay()
    clock.ns = 10**12
    assert source.poll().losses == {"ringbuf_full": 0, "counters_full": 0, "exited_full": 0, "errors_full": 0}


def test_directory_that_is_not_a_recording_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FdtraceError, match="not an fdtrace recording"):
        EventPlayer(tmp_path)


def test_recording_reads_without_fdtrace_as_a_hive_partitioned_dataset() -> None:
    import pandas as pd

    events = pd.read_parquet(EMFILE / "events")
    assert len(events) == 76 and set(events["host"].astype(str)) == {"vm"}
    assert set(events["kind"].astype(str)) == {"socket", "thread_start", "thread_exit", "fd_error", "process_exit"}


def test_next_problem_finds_exhaustion_of_any_call_kind(tmp_path: Path) -> None:
    """socket() and accept() that fail with EMFILE are problems too, not only kind fd_error."""
    copy = tmp_path / "rec"
    shutil.copytree(EMFILE, copy)
    recorded = load(EMFILE).events
    socket_emfile = recorded[(recorded["kind"] == "socket") & (recorded["errno"] == "EMFILE")]
    # Keep every event but the fd_error ones: what is left to find are the sockets' EMFILE.
    for path in (copy / "events").rglob("part-*.parquet"):
        table = pq.read_table(path)
        pq.write_table(table.filter(pc.not_equal(table["kind"].cast(pa.string()), "fd_error")), path)
    source = ReplaySource(copy, clock=FakeClock())
    assert source.next_problem()
    assert source.player.now_ns == socket_emfile["time"].iloc[0].value


def test_the_replay_controls_move_the_player_and_say_where_it_is() -> None:
    from fdtrace.pipeline import Pipeline
    from fdtrace.sources.replay import ReplayControls

    clock = FakeClock()
    source = ReplaySource(EMFILE, clock=clock)
    controls = ReplayControls(Pipeline(source, source_started=True), source)
    player = source.player
    assert controls.playback and not controls.running and list(controls.skipped) == []
    assert controls.toggle_recording().text == "recording is for live views"
    where = controls.position()
    assert (where.start_ns, where.end_ns, where.now_ns) == (player.start_ns, player.end_ns, player.start_ns)
    assert list(where.problems_ns) == list(player.problem_times()) and len(player.problem_times())
    controls.faster()
    controls.faster()
    controls.slower()
    assert player.speed == 2.0 and controls.status().startswith("replay 2x, ")
    controls.toggle_pause()
    clock.ns += 5_000_000_000
    assert player.paused and player.now_ns == player.start_ns and controls.status().startswith("replay paused, ")
    assert controls.next_problem() and player.now_ns == int(player.problem_times()[0])
    assert not controls.previous_problem()  # nothing before the first
    controls.seek_by(-60)
    assert player.now_ns == player.start_ns and source.poll().reset


NEWCOMER = Path(__file__).parents[1] / "data" / "newcomer"


def _view_counts(state: object) -> dict[int, tuple[object, ...]]:
    """What the view counts per process since the start of a recording."""
    return {pid: (v.comm, dict(v.totals), dict(v.errors), v.fd_exhaustion_errors, v.emfile, v.emfile_worst_second,
                  sorted(v.failures), v.first_failure_ns, {k: list(t) for k, t in v.destinations.items()},
                  v.oom_killed, v.ended, v.go_thread_limit, list(v.history))
            for pid, v in state.processes.items()}  # type: ignore[attr-defined]


def _fold(state: object, update: object) -> None:
    state.apply_events(update.events)  # type: ignore[attr-defined]
    for sample_round in update.rounds:  # type: ignore[attr-defined]
        state.apply_samples(sample_round.samples, sample_round.time_ns)  # type: ignore[attr-defined]


def test_a_jump_counts_exactly_what_stepping_there_counts() -> None:
    """Issue 35: a jump rebuilds the view from a window 30 s before its target, with the totals
    before it from the player's cumulative index, not by replaying every event since the start.
    On the newcomer recording (40 s of fdtrace record: an EMFILE burst in its first seconds, a
    Go thread limit, 500 short processes, connects), jumping to its last seconds counts, for
    every process, what playing there 0.1 s at a time counts, and charts the same history (the
    rounds of the ten minutes before the window come with it)."""
    from fdtrace.sources.replay import JUMP_WINDOW_NS
    from fdtrace.tui.state import IncidentState

    clock = FakeClock()
    stepped_source = ReplaySource(NEWCOMER, clock=clock)
    player = stepped_source.player
    target = player.end_ns - 2_000_000_000
    stepping = IncidentState()
    while player.now_ns < target:
        clock.ns = min(clock.ns + 100_000_000, target - player.start_ns)
        _fold(stepping, stepped_source.poll())
    jumped_source = ReplaySource(NEWCOMER, clock=FakeClock())
    jumped_source.seek(target)
    update = jumped_source.poll()
    assert update.reset and update.baseline is not None
    assert target - update.baseline.until_ns >= JUMP_WINDOW_NS  # a window, not the whole recording:
    assert update.baseline.until_ns > player.start_ns  # the first events came from the index
    before = pc.less(update.events["time"].cast(pa.int64()), update.baseline.until_ns)
    assert not pc.any(before).as_py() and update.events.num_rows < player.events.num_rows
    jumped = IncidentState()
    jumped.apply_baseline(update.baseline)
    _fold(jumped, update)
    counted = _view_counts(stepping)
    assert _view_counts(jumped) == counted
    burst = [c for c in counted.values() if c[0] == "burst-64"]
    assert len(burst) == 1 and burst[0][3] > 0 and burst[0][7] < update.baseline.until_ns  # its EMFILE: from the index
    assert any(c[11] for c in counted.values())  # the Go thread limit, before the window too
    assert sum(len(c[12]) for c in counted.values()) > 100  # the charts' points compared


def test_every_recorded_sampling_round_is_replayed_even_one_before_the_first_event() -> None:
    """A round taken before the recording's first event (a quiet start, 0.3 s before it in
    tests/data/emfile) is replayed first, and those after its last event at the end: the live
    view's memory fit counts the samples the report's counts (a CI run found a process's first
    sample, at 0 sockets, missing from the replay)."""
    recorded = load(EMFILE).samples
    assert recorded["time"].min() < load(EMFILE).events["time"].min()
    clock = FakeClock()
    source = ReplaySource(EMFILE, clock=clock)
    replayed: list[int] = []
    while not source.player.finished:
        clock.ns += 100_000_000
        replayed += [r.time_ns for r in source.poll().rounds for _ in r.samples]
    assert len(replayed) == len(recorded) == 60
    assert replayed == sorted(recorded["time"].astype("int64").tolist())
