"""What every source yields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EventBatch:
    """Events read in one poll, in the column layout of ``schema.EVENT_FIELDS``.

    Attributes:
        events: a ``pyarrow.Table`` with the schema of ``schema.arrow_schema()``.
        mono_ns: the time of the poll: CLOCK_MONOTONIC live, the virtual wall clock in a replay.
        losses: cumulative loss and overflow counters (``schema.STATS``) at the poll.
    """

    events: Any
    mono_ns: int
    losses: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.events.num_rows)


def keep_comms(events: Any, comms: set[str] | tuple[str, ...]) -> Any:
    """The rows of an events table whose ``comm`` is one of ``comms`` (all rows when empty)."""
    if not comms or not events.num_rows:
        return events
    import pyarrow as pa
    import pyarrow.compute as pc

    wanted = pa.array(sorted(comms), type=pa.string())
    return events.filter(pc.is_in(events["comm"].cast(pa.string()), value_set=wanted))
