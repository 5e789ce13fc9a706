"""The live view's sink: one update in flight, the rest merged behind it; an urgent one (a round
brought forward by a new failure) goes at once, ahead of those held back; what a live view holds
back stays within bounds, the failures kept first."""

from __future__ import annotations

from typing import Any

import pytest

from fdtrace.pipeline.update import SampleRound, SourceInfo, Update
from fdtrace.schema import SYSCALL_IDS, Kind, arrow_schema
from fdtrace.schema.records import ProcessSample
from fdtrace.tui import app as app_module
from fdtrace.tui.app import ViewSink
from fdtrace.tui.state import VIEW_SKIPPED, IncidentState
from tests.unit.test_decode import decode_table, record


class Posted:
    """Stands in for the app: keeps the updates posted to it, in order."""

    def __init__(self) -> None:
        self.updates: list[Update] = []

    def post_message(self, message: Any) -> None:
        self.updates.append(message.update)


def update(now_ns: int, urgent: bool = False) -> Update:
    return Update(now_ns=now_ns, events=arrow_schema().empty_table(), urgent=urgent)


def test_an_urgent_update_overtakes_those_held_back() -> None:
    app = Posted()
    sink = ViewSink(app)  # type: ignore[arg-type]
    sink.write(update(1))  # in flight
    sink.write(update(2))
    sink.write(update(3))  # 2 and 3 held back, merged
    assert [u.now_ns for u in app.updates] == [1]
    sink.write(update(4, urgent=True))
    assert [u.now_ns for u in app.updates] == [1, 4]
    sink.applied()  # 1 folded in: 4 is still in flight, nothing more yet
    assert [u.now_ns for u in app.updates] == [1, 4]
    sink.applied()  # 4 folded in: what was held back goes, as one
    assert [u.now_ns for u in app.updates] == [1, 4, 3]
    sink.applied()
    sink.write(update(5, urgent=True))  # nothing in flight: sent as any other
    sink.write(update(6))
    assert [u.now_ns for u in app.updates] == [1, 4, 3, 5]
    sink.applied()
    assert [u.now_ns for u in app.updates] == [1, 4, 3, 5, 6]


def test_merged_updates_stay_urgent() -> None:
    assert update(1).then(update(2, urgent=True)).urgent and not update(1).then(update(2)).urgent


def flood(first_ts: int, opens: int, failures: int, exits: int) -> Any:
    """An events table: ``opens`` socket() calls that worked, then ``failures`` that failed with
    EMFILE and ``exits`` ends, each kind of its own processes."""
    rows = [record(Kind.SOCKET, pid=1000 + i % 7, ts=first_ts + i, syscall=SYSCALL_IDS["socket"], ret=3, fd=3)
            for i in range(opens)]
    rows += [record(Kind.SOCKET, pid=9, ts=first_ts + opens + i, syscall=SYSCALL_IDS["socket"], ret=-24, errno=24)
             for i in range(failures)]
    rows += [record(Kind.PROCESS_EXIT, pid=2000 + i, ts=first_ts + opens + failures + i, extra=[1, 0, 0, 0])
             for i in range(exits)]
    return decode_table(*rows)


def sampled(time_ns: int, pids: range, open_fds: int) -> SampleRound:
    samples = [ProcessSample(pid=pid, start_ns=pid, comm=f"p{pid}", open_fds=open_fds, fd_soft_limit=1024,
                             fd_hard_limit=4096, threads=1, sockets=0) for pid in pids]
    return SampleRound(mono_ns=time_ns, time_ns=time_ns, samples=samples, system={"file_nr": time_ns})


def test_a_live_view_that_falls_behind_holds_back_a_bounded_update_that_keeps_the_failures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app_module, "MAX_HELD_EVENTS", 500)
    monkeypatch.setattr(app_module, "MAX_HELD_ROUNDS", 3)
    app = Posted()
    sink = ViewSink(app)  # type: ignore[arg-type]
    sink.open(SourceInfo(host="h", live=True))
    sink.write(update(0))  # in flight, and the app takes long to fold it in
    for i in range(1, 21):  # 20 polls of 100 calls that worked, 10 that failed, 2 ends; a round each
        events = flood(i * 1_000, opens=100, failures=10, exits=2)
        pids = range(i, i + 3)  # each round samples other processes
        sink.write(Update(now_ns=i, events=events, rounds=[sampled(i, pids, open_fds=i)],
                          losses={"ringbuf_full": 0}))
    sink.applied()
    held = app.updates[-1]
    skipped = 20 * 112 - held.events.num_rows
    assert 250 <= held.events.num_rows <= 500 and sink.skipped == skipped  # cut to 250 past 500
    assert held.losses == {"ringbuf_full": 0, VIEW_SKIPPED: skipped}
    rows = held.events.select(["ts_ns", "kind", "errno"]).to_pylist()
    assert sum(row["errno"] == "EMFILE" for row in rows) == 200  # every failed call, every end
    assert sum(row["kind"] == "process_exit" for row in rows) == 40
    assert [row["ts_ns"] for row in rows] == sorted(row["ts_ns"] for row in rows)
    # the newest of the calls that worked, as many as there was room for
    worked = [row["ts_ns"] for row in rows if row["kind"] == "socket" and not row["errno"]]
    every_worked = [i * 1_000 + j for i in range(1, 21) for j in range(100)]
    assert worked == every_worked[len(every_worked) - (held.events.num_rows - 240):]
    assert len(held.rounds) == 3 and [r.time_ns for r in held.rounds] == [18, 19, 20]
    merged = held.rounds[0]
    # each process its latest sample (round i samples pids i to i + 2 with i descriptors), at the
    # time of the newest round merged
    assert {s.pid: s.open_fds for s in merged.samples} == {p: min(p, 18) for p in range(1, 21)}
    assert merged.system == {"file_nr": 18}
    state = IncidentState()
    state.roll(1, held.losses)
    assert state.system.exact == "counts exact, event list incomplete"
    assert state.system.losses == skipped


def test_a_replay_is_held_back_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app_module, "MAX_HELD_EVENTS", 500)
    monkeypatch.setattr(app_module, "MAX_HELD_ROUNDS", 3)
    app = Posted()
    sink = ViewSink(app)  # type: ignore[arg-type]
    sink.open(SourceInfo(host="h", live=False))
    sink.write(update(0))
    for i in range(1, 13):
        sink.write(Update(now_ns=i, events=flood(i * 1_000, opens=100, failures=0, exits=0),
                          rounds=[sampled(i, range(1, 3), open_fds=i)]))
    sink.applied()
    held = app.updates[-1]
    assert held.events.num_rows == 12 * 100 and len(held.rounds) == 12 and sink.skipped == 0
    assert VIEW_SKIPPED not in held.losses
