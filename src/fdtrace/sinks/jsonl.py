"""Events as JSON lines, one object per event."""

from __future__ import annotations

import json
from datetime import datetime
from typing import IO, Any


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


class JsonLinesSink:
    """Writes each event of an events table as one JSON object per line."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.written = 0

    def write(self, events: Any) -> None:
        """Write the rows of an events table (``pyarrow.Table`` of ``schema.arrow_schema()``)."""
        for row in events.to_pylist():
            self.stream.write(json.dumps({k: _plain(v) for k, v in row.items()}, separators=(",", ":")))
            self.stream.write("\n")
        self.written += events.num_rows
        self.stream.flush()
