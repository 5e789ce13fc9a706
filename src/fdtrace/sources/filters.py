"""Selecting rows of an events table."""

from __future__ import annotations

from typing import Any


def keep_comms(events: Any, comms: set[str] | tuple[str, ...]) -> Any:
    """The rows of an events table whose ``comm`` is one of ``comms`` (all rows when empty)."""
    if not comms or not events.num_rows:
        return events
    import pyarrow as pa
    import pyarrow.compute as pc

    wanted = pa.array(sorted(comms), type=pa.string())
    return events.filter(pc.is_in(events["comm"].cast(pa.string()), value_set=wanted))
