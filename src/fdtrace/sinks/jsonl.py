"""Events as JSON lines, one object per event."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import IO, Any

from fdtrace.sources.base import EventBatch


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


class JsonLinesSink:
    """Writes each event as one JSON object per line; ``comms`` keeps only those task names."""

    def __init__(self, stream: IO[str], comms: Iterable[str] = ()) -> None:
        self.stream = stream
        self.comms = set(comms)
        self.written = 0

    def write(self, batch: EventBatch) -> None:
        """Write a batch's events."""
        table = batch.events
        if self.comms and table.num_rows:
            import pyarrow.compute as pc

            table = table.filter(pc.is_in(table["comm"].cast("string"), value_set=_arrow_strings(self.comms)))
        for row in table.to_pylist():
            self.stream.write(json.dumps({k: _plain(v) for k, v in row.items()}, separators=(",", ":")))
            self.stream.write("\n")
        self.written += table.num_rows
        self.stream.flush()


def _arrow_strings(values: set[str]) -> Any:
    import pyarrow as pa

    return pa.array(sorted(values), type=pa.string())
