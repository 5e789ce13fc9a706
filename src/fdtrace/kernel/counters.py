"""Per-process totals from the in-kernel counters, kept after the processes exit."""

from __future__ import annotations

import errno as errno_module
from collections.abc import Iterable
from typing import Any

from fdtrace.schema import COUNTERS
from fdtrace.schema.records import ProcessTotals


class CounterStore:
    """Merges the live counter table, the exited processes' final counters and the error table.

    Feed it what the loader reads (``update``); exited instances stay here after the kernel side
    has forgotten them, up to ``max_exited`` (the oldest are dropped and counted in ``evicted``).
    ``newly_exited`` holds the instances that exited since the previous reading.
    """

    def __init__(self, max_exited: int = 100_000) -> None:
        self.max_exited = max_exited
        self.exited: dict[tuple[int, int], ProcessTotals] = {}
        self.live: dict[tuple[int, int], ProcessTotals] = {}
        self.evicted = 0
        self.newly_exited: list[ProcessTotals] = []

    def update(
        self,
        live_rows: Iterable[dict[str, Any]],
        exited_rows: Iterable[dict[str, Any]],
        error_rows: Iterable[dict[str, Any]],
    ) -> set[tuple[int, int]]:
        """Take a reading. Returns the exited instances whose errors the kernel may now forget."""
        self.live = {(row["pid"], row["first_ts"]): _totals(row) for row in live_rows}
        newly = {(row["pid"], row["first_ts"]): _totals(row) for row in exited_rows}
        for row in error_rows:
            key = (row["pid"], row["first_ts"])
            target = self.live.get(key) or newly.get(key)
            if target is not None:
                name = errno_module.errorcode.get(row["errno"], f"E{row['errno']}")
                target.errors[(row["syscall"], name)] = row["count"]
        self.newly_exited = list(newly.values())
        self.exited.update(newly)
        while len(self.exited) > self.max_exited:
            self.exited.pop(next(iter(self.exited)))
            self.evicted += 1
        return set(newly)

    def all(self) -> list[ProcessTotals]:
        """Every process instance seen, exited ones first in exit order, then live ones."""
        return list(self.exited.values()) + list(self.live.values())

    def for_pid(self, pid: int) -> list[ProcessTotals]:
        """The instances with this pid (more than one when the pid was reused)."""
        return [t for t in self.all() if t.pid == pid]


def _totals(row: dict[str, Any]) -> ProcessTotals:
    return ProcessTotals(
        pid=row["pid"], first_ts=row["first_ts"], comm=row["comm"], exit_ts=row["exit_ts"],
        counts={name: row[name] for name in COUNTERS},
    )
