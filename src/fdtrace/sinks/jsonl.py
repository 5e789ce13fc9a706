"""Events as JSON lines, one object per event, and the per-process totals file of `trace`."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from fdtrace.errors import FdtraceError
from fdtrace.pipeline.update import SourceInfo, Update
from fdtrace.safe_files import PRIVATE_FILE, SHARED_FILE, write_text_atomically
from fdtrace.schema import iso_utc, plain_rows


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


def count_kinds(events: Any) -> dict[str, int]:
    """Rows of an events table by kind."""
    import pyarrow.compute as pc

    return {str(item["values"]): int(item["counts"]) for item in pc.value_counts(events["kind"]).to_pylist()}


def stream_summary(kinds: dict[str, int], losses: dict[str, int]) -> str:
    """The last line of `trace`: events by kind and losses."""
    counted = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"
    lost = sum(losses.values())
    detail = ", ".join(f"{k} {v}" for k, v in losses.items() if v)
    return f"{sum(kinds.values())} events ({counted}); lost {lost}" + (f" ({detail})" if detail else "")


#: Stacks a stream sink keeps for the events that name them (a stack is given once, before them).
MAX_STACKS = 100_000


class JsonLinesSink:
    """Writes each event as one JSON object per line, and counts them by kind.

    Attributes:
        kinds: events written, by kind.
        losses: the source's cumulative losses at the last update.
    """

    name = "JSON lines"
    required = True

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.kinds: Counter[str] = Counter()
        self.losses: dict[str, int] = {}
        self.stacks: dict[int, tuple[str, ...]] = {}  # the latest MAX_STACKS

    def open(self, info: SourceInfo) -> None:
        """Nothing to prepare."""

    def write(self, update: Update) -> None:
        self.losses = update.losses
        for stack in update.stacks:
            self.stacks[stack.stack_id] = stack.frames
        while len(self.stacks) > MAX_STACKS:
            del self.stacks[next(iter(self.stacks))]
        events = update.events
        if not events.num_rows:
            return
        self.kinds.update(count_kinds(events))
        for row in plain_rows(events):
            if row.get("stack_id") is not None:
                row["stack"] = list(self.stacks.get(row["stack_id"], ()))
            self.stream.write(self.format(row) + "\n")
        self.stream.flush()

    def format(self, row: dict[str, Any]) -> str:
        """One event as one line (``time`` in ISO 8601, UTC)."""
        return json.dumps({k: iso_utc(v) if k == "time" and isinstance(v, int) else _plain(v) for k, v in row.items()},
                          separators=(",", ":"))

    def close(self, failed: bool = False) -> None:
        """The stream belongs to the caller."""

    def summary(self) -> str:
        """The last line of `trace`: events by kind and losses."""
        return stream_summary(self.kinds, self.losses)


class TotalsSink:
    """At the end, writes the exact per-process counts of the final update as JSON.

    Args:
        path: the file written.
        comms: only processes with these names (all when empty).
    """

    name = "totals"
    required = True

    def __init__(self, path: str, comms: tuple[str, ...] = (), shared: bool = False) -> None:
        self.path = path
        self.comms = comms
        self.mode = SHARED_FILE if shared else PRIVATE_FILE
        self._totals: list[dict[str, Any]] | None = None

    def open(self, info: SourceInfo) -> None:
        """Nothing to prepare: the file is written at the end."""

    def write(self, update: Update) -> None:
        if update.final and update.counters is not None:
            self._totals = [t.as_dict() for t in update.counters.all() if not self.comms or t.comm in self.comms]

    def close(self, failed: bool = False) -> None:
        if self._totals is None:
            return
        totals, self._totals = self._totals, None
        try:
            write_text_atomically(Path(self.path), json.dumps(totals), self.mode)
        except OSError as exc:
            raise FdtraceError(f"{self.path}: cannot write the totals ({exc.strerror})", exit_code=1) from None
