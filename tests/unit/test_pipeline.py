"""The pipeline over a replay of tests/data/emfile (made by fdtrace's own recorder): every update
reaches every sink, a failing sink stops it (required) or is detached (optional), and it stops
where it is told to."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from fdtrace.errors import FdtraceError
from fdtrace.pipeline import Pipeline, SourceInfo, Stop, Update
from fdtrace.sinks.jsonl import JsonLinesSink
from fdtrace.sinks.parquet import ParquetSink
from fdtrace.sources.replay import ReplaySource

EMFILE = Path(__file__).parents[1] / "data" / "emfile"


class SteppingClock:
    """Moves 100 ms each time it is read."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        self.ns += 100_000_000
        return self.ns


class RecordingOfCalls:
    """A sink that keeps what it was given, and fails at the Nth update when told to."""

    name = "calls"

    def __init__(self, required: bool = True, fail_at: int | None = None) -> None:
        self.required = required
        self.fail_at = fail_at
        self.opened: SourceInfo | None = None
        self.updates: list[Update] = []
        self.closed: list[bool] = []

    def open(self, info: SourceInfo) -> None:
        self.opened = info

    def write(self, update: Update) -> None:
        if self.fail_at is not None and len(self.updates) == self.fail_at:
            raise FdtraceError("disk full")
        self.updates.append(update)

    def close(self, failed: bool = False) -> None:
        self.closed.append(failed)


def replay() -> ReplaySource:
    return ReplaySource(EMFILE, clock=SteppingClock())


def until_finished(source: ReplaySource) -> Stop:
    return Stop(condition=lambda: source.player.finished, signals=False)


def test_every_sink_gets_every_event_once_and_a_final_update() -> None:
    source = replay()
    out = io.StringIO()
    lines, calls = JsonLinesSink(out), RecordingOfCalls()
    pipeline = Pipeline(source, [lines, calls], poll_interval_s=0)
    pipeline.start()
    final = pipeline.run(until_finished(source))
    assert calls.opened is not None and calls.opened.host == "vm" and not calls.opened.live
    assert sum(u.events.num_rows for u in calls.updates) == 76
    assert calls.updates[-1] is final and final.final and calls.closed == [False]
    assert len(out.getvalue().splitlines()) == 76 == sum(lines.kinds.values())
    assert json.loads(out.getvalue().splitlines()[0])["host"] == "vm"
    assert sum(len(u.rounds) for u in calls.updates) > 0


def test_a_required_sink_that_fails_stops_the_pipeline_and_closes_the_others() -> None:
    source = replay()
    failing, other = RecordingOfCalls(fail_at=3), RecordingOfCalls()
    pipeline = Pipeline(source, [failing, other], poll_interval_s=0)
    pipeline.start()
    with pytest.raises(FdtraceError, match="disk full"):
        pipeline.run(until_finished(source))
    assert len(failing.updates) == 3 and failing.closed == [True]
    assert other.closed == [True]


def test_an_optional_sink_that_fails_is_detached_and_the_rest_goes_on() -> None:
    source = replay()
    failing, other = RecordingOfCalls(required=False, fail_at=2), RecordingOfCalls()
    pipeline = Pipeline(source, [failing, other], poll_interval_s=0)
    pipeline.start()
    pipeline.run(until_finished(source))
    assert len(failing.updates) == 2 and failing.closed == [True]
    assert [f.error for f in pipeline.failures] == ["disk full"]
    assert sum(u.events.num_rows for u in other.updates) == 76 and other.closed == [False]


def test_sinks_attached_and_detached_while_it_runs_see_only_their_updates() -> None:
    source = replay()
    always, late = RecordingOfCalls(), RecordingOfCalls()
    pipeline = Pipeline(source, [always], poll_interval_s=0)
    pipeline.start()
    for _ in range(5):
        pipeline.step()
    pipeline.attach(late)
    for _ in range(5):
        pipeline.step()
    pipeline.detach(late)
    pipeline.run(until_finished(source))
    assert len(late.updates) == 5 and late.closed == [False]
    assert late.updates == always.updates[5:10]


def test_a_replay_cannot_be_recorded_again(tmp_path: Path) -> None:
    pipeline = Pipeline(replay(), [ParquetSink(tmp_path / "again", [])])
    with pytest.raises(FdtraceError, match="cannot be recorded again"):
        pipeline.start()
    assert not (tmp_path / "again").exists()


def test_the_duration_counts_from_the_start_of_the_run() -> None:
    stop = Stop(duration_s=0.05, signals=False)

    time.sleep(0.1)  # start-up time (compiling the programs) does not count
    assert not stop.reached()
    time.sleep(0.1)
    assert stop.reached()


def test_updates_merged_for_a_consumer_that_fell_behind_keep_every_event_and_round() -> None:
    source = replay()
    updates = [source.poll()]
    while not source.player.finished:
        updates.append(source.poll())
    merged = updates[0]
    for later in updates[1:]:
        merged = merged.then(later)
    assert merged.events.num_rows == sum(u.events.num_rows for u in updates) == 76
    assert len(merged.rounds) == sum(len(u.rounds) for u in updates)
    assert merged.now_ns == updates[-1].now_ns and merged.losses == updates[-1].losses
    source.seek(source.player.start_ns)  # a reset drops what came before it
    reset = source.poll()
    assert merged.then(reset) is reset


def test_a_poll_on_another_thread_ends_when_its_owner_closes_the_pipeline() -> None:
    """The live view polls on a worker and closes the pipeline when it quits: the poll ends at
    its next turn, and the sinks had the final update once."""
    import threading

    pipeline = Pipeline(replay(), source_started=True)
    sink = RecordingOfCalls()
    pipeline.attach(sink)
    polling = threading.Thread(target=pipeline.poll_until, args=(Stop(signals=False), 0.01))
    polling.start()
    deadline = time.monotonic() + 30
    while len(sink.updates) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    pipeline.close()
    polling.join(timeout=30)
    assert not polling.is_alive()
    assert sink.updates[-1].final and sum(u.final for u in sink.updates) == 1 and sink.closed == [False]


def test_the_view_quitting_alone_skips_the_final_poll_but_a_recorder_beside_it_gets_it() -> None:
    """Issue 34: `q` in `top` on a flooded host: the view is the only sink, nothing would take the
    final update, so the source stops without its last poll (its decode took seconds); with a
    recorder attached (R), the recorder has its final update as ever."""
    for with_recorder in (False, True):
        source = replay()
        pipeline = Pipeline(source, source_started=True)
        view, recorder = RecordingOfCalls(), RecordingOfCalls()
        pipeline.attach(view)
        if with_recorder:
            pipeline.attach(recorder)
        pipeline.step()
        polls = len(view.updates)
        pipeline.close(quitting=view)
        assert view.closed == [False]
        if with_recorder:
            assert recorder.updates[-1].final and recorder.closed == [False] and view.updates[-1].final
        else:
            assert len(view.updates) == polls and not any(u.final for u in view.updates)
        pipeline.close(quitting=view)  # a second close does nothing
        assert view.closed == [False]


def test_a_source_with_more_waiting_is_polled_again_without_a_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """A live source decodes a flood's backlog a bounded part per poll and says it has more: the
    pipeline then polls again at once, and pauses its interval only when the source is idle."""
    import fdtrace.pipeline.runner as runner

    source = replay()
    polls = []
    played = source.poll

    def poll() -> Update:
        update = played()
        update.more = len(polls) < 3
        polls.append(update.more)
        return update

    monkeypatch.setattr(source, "poll", poll)
    pauses: list[float] = []
    monkeypatch.setattr(runner.time, "sleep", pauses.append)
    pipeline = Pipeline(source, source_started=True)
    pipeline.poll_until(Stop(condition=lambda: len(polls) == 5, signals=False), interval_s=60)
    assert polls == [True, True, True, False, False]
    assert pauses[:3] == [0.0, 0.0, 0.0] and all(0.0 < pause <= 60 for pause in pauses[3:])
    pipeline.close()
