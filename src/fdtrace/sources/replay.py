"""Replay of a recording as a source: the same event batches the live source yields, in time
order, at real speed, faster, slower or paused, with seeking."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fdtrace.errors import FdtraceError
from fdtrace.recording import read_meta, read_parts
from fdtrace.schema import STATS, arrow_schema
from fdtrace.sources.base import EventBatch


def _with_host(events: pa.Table, host: str) -> pa.Table:
    """Put the partition's host back as the column the event model has. Nullable columns that
    a recording of an older fdtrace lacks come back as nulls."""
    schema = arrow_schema()
    host_column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(events.num_rows, dtype=np.int32)),
                                                 pa.array([host], type=pa.string()))
    present = set(events.column_names)
    columns = [host_column if field.name == "host"
               else events[field.name].cast(field.type) if field.name in present or not field.nullable
               else pa.nulls(events.num_rows, type=field.type)
               for field in schema]
    return pa.Table.from_arrays(columns, schema=schema)


class ReplaySource:
    """Plays a recording's events back on a virtual clock of wall time.

    ``poll()`` returns the events whose ``time`` the virtual clock has passed since the last poll,
    with the recording's cumulative losses at that time, exactly as the live source does.

    Args:
        paths: one recording directory or several (several hosts, merged on wall time).
        speed: virtual seconds per real second (0 < speed).
        clock: the real clock, in ns (tests pass a fake one).
    """

    def __init__(self, paths: str | Path | list[str | Path], speed: float = 1.0,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        roots = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
        self.skipped: list[str] = []
        events, losses = [], []
        for root in roots:
            for host in read_meta(root):
                part = read_parts(root, "events", host, self.skipped)
                if part is not None:
                    events.append(_with_host(part, host))
                loss = read_parts(root, "losses", host, self.skipped)
                if loss is not None:
                    losses.append(loss)
        if not events:
            raise FdtraceError(f"{', '.join(map(str, roots))}: the recording holds no events to replay")
        table = pa.concat_tables(events)
        self.events = table.take(pc.sort_indices(table, [("time", "ascending")]))
        self._times = self.events["time"].cast(pa.int64()).to_numpy()
        self._loss_times, self._loss_totals = self._loss_index(losses)
        self.start_ns = int(self._times[0])
        self.end_ns = int(self._times[-1])
        self._clock = clock
        self._speed = speed
        self._paused = False
        self._position = 0  # index of the next event to hand out
        self._anchor_virtual = self.start_ns
        self._anchor_real = clock()

    @staticmethod
    def _loss_index(losses: list[pa.Table]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if not losses:
            return np.zeros(0, dtype=np.int64), {}
        table = pa.concat_tables(losses, promote_options="default")
        table = table.take(pc.sort_indices(table, [("time", "ascending")]))
        times = table["time"].cast(pa.int64()).to_numpy()
        totals = {name: np.cumsum(table[name].to_numpy()) for name in STATS if name in table.column_names}
        return times, totals

    # The virtual clock

    @property
    def now_ns(self) -> int:
        """The wall time the replay has reached (it goes on past the last event, as time does)."""
        if self._paused:
            return self._anchor_virtual
        elapsed = self._clock() - self._anchor_real
        return self._anchor_virtual + int(elapsed * self._speed)

    @property
    def speed(self) -> float:
        """Virtual seconds per real second."""
        return self._speed

    @property
    def paused(self) -> bool:
        """Whether the virtual clock stands still."""
        return self._paused

    @property
    def finished(self) -> bool:
        """Whether every event has been handed out."""
        return self._position >= len(self._times)

    def _rebase(self, virtual_ns: int) -> None:
        self._anchor_virtual = virtual_ns
        self._anchor_real = self._clock()

    def set_speed(self, speed: float) -> None:
        """Play at ``speed`` times real time from now on."""
        if speed <= 0:
            raise ValueError("speed must be positive")
        self._rebase(self.now_ns)
        self._speed = speed

    def pause(self) -> None:
        """Stop the virtual clock."""
        self._rebase(self.now_ns)
        self._paused = True

    def resume(self) -> None:
        """Start the virtual clock again."""
        self._rebase(self._anchor_virtual)
        self._paused = False

    def seek(self, wall_ns: int) -> None:
        """Jump to a wall time: the next poll hands out the events from there on."""
        wall_ns = max(self.start_ns, min(wall_ns, self.end_ns))
        self._position = int(np.searchsorted(self._times, wall_ns, side="left"))
        self._rebase(wall_ns)

    def replay_until(self, wall_ns: int) -> None:
        """Jump to a wall time, and hand out every event from the start up to it at the next
        poll (for a view that rebuilds what it showed at that moment)."""
        wall_ns = max(self.start_ns, min(wall_ns, self.end_ns))
        self._position = 0
        self._rebase(wall_ns)

    def seek_next(self, kinds: set[str]) -> int | None:
        """Jump to the next event of one of ``kinds`` after the current time (e.g. the next
        fd_error or oom_kill). Returns its wall time, or None when there is none."""
        after = int(np.searchsorted(self._times, self.now_ns, side="right"))
        tail = self.events["kind"].slice(after).cast(pa.string())
        hits = np.flatnonzero(pc.is_in(tail, value_set=pa.array(sorted(kinds))).to_numpy(zero_copy_only=False))
        if not len(hits):
            return None
        target = int(self._times[after + int(hits[0])])
        self.seek(target)
        return target

    # The source interface

    def poll(self) -> EventBatch:
        """The events the virtual clock passed since the last poll."""
        now = self.now_ns
        end = int(np.searchsorted(self._times, now, side="right"))
        batch = self.events.slice(self._position, max(end - self._position, 0))
        self._position = max(end, self._position)
        return EventBatch(events=batch, mono_ns=now, losses=self.losses_at(now))

    def losses_at(self, wall_ns: int) -> dict[str, int]:
        """The recording's cumulative losses at a wall time."""
        index = int(np.searchsorted(self._loss_times, wall_ns, side="right")) - 1
        return {name: int(totals[index]) if index >= 0 else 0 for name, totals in self._loss_totals.items()}
