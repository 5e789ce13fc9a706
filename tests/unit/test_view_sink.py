"""The live view's sink: one update in flight, the rest merged behind it; an urgent one (a round
brought forward by a new failure) goes at once, ahead of those held back."""

from __future__ import annotations

from typing import Any

from fdtrace.pipeline.update import Update
from fdtrace.schema import arrow_schema
from fdtrace.tui.app import ViewSink


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
