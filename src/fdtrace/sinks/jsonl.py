"""Events as JSON lines, one object per event."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import IO, Any

from fdtrace.sources.base import EventBatch, keep_comms


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
        table = keep_comms(batch.events, self.comms)
        for row in table.to_pylist():
            self.stream.write(json.dumps({k: _plain(v) for k, v in row.items()}, separators=(",", ":")))
            self.stream.write("\n")
        self.written += table.num_rows
        self.stream.flush()

