"""The shape of a rehearsal: how many connections, opened by whom, when and for how long."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fdtrace.errors import FdtraceError

#: What each connection sends once connected, so that a proxy really connects its backend (an
#: echo backend sends it back; any answer counts).
DEFAULT_PAYLOAD = b"fdtrace rehearse\n"


@dataclass(frozen=True)
class Shape:
    """A DDP job's connection pattern at a gradient sync or a checkpoint barrier.

    Attributes:
        ranks: workers opening connections at the same instant.
        per_rank: connections each rank opens at the largest step.
        bursts: how many times each step is opened, held and closed.
        hold_s: seconds the connections are held once answered.
        ramp: steps from ``total / ramp`` up to ``total`` (1: the whole shape at once).
        timeout_s: seconds a connection may take to connect and be answered.
        expect_reply: a connection counts as held once the target answers its bytes (else once
            it is connected).
        processes: each rank is a process of its own (else a thread of this one).
        payload: the bytes each connection sends.
    """

    ranks: int
    per_rank: int
    bursts: int = 1
    hold_s: float = 1.0
    ramp: int = 1
    timeout_s: float = 5.0
    expect_reply: bool = True
    processes: bool = False
    payload: bytes = DEFAULT_PAYLOAD

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.per_rank < 1:
            raise FdtraceError("--ranks and --connections-per-rank must be at least 1", exit_code=1)
        if self.bursts < 1 or self.ramp < 1:
            raise FdtraceError("--bursts and --ramp must be at least 1", exit_code=1)
        if self.hold_s < 0 or self.timeout_s <= 0:
            raise FdtraceError("--hold must be 0 or more and --timeout more than 0", exit_code=1)
        if self.ramp > self.total:
            raise FdtraceError(f"--ramp {self.ramp} has more steps than the shape has connections ({self.total})",
                               exit_code=1)

    @property
    def total(self) -> int:
        """Connections held at once at the largest step (ranks x connections per rank)."""
        return self.ranks * self.per_rank

    def levels(self) -> list[int]:
        """The concurrency of each step, growing evenly to ``total``."""
        return [math.ceil(self.total * step / self.ramp) for step in range(1, self.ramp + 1)]

    def split(self, level: int) -> list[int]:
        """How many connections each rank opens for a step of ``level`` connections (as even as
        can be, the first ranks taking one more)."""
        share, extra = divmod(level, self.ranks)
        return [share + (rank < extra) for rank in range(self.ranks)]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return {"ranks": self.ranks, "connections_per_rank": self.per_rank, "connections": self.total,
                "bursts": self.bursts, "hold_s": self.hold_s, "ramp": self.ramp, "timeout_s": self.timeout_s,
                "expect_reply": self.expect_reply, "processes": self.processes}
