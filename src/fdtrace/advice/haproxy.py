"""HAProxy 2.6's own arithmetic: the descriptors it demands for a maxconn (its Maxsock, which
``strict-limits`` refuses to start without), the most connections a limit lets it hold, and the
maxconn / ulimit-n pair to advise for a number of connections, one it accepts.

From haproxy 2.6's src/haproxy.c (``compute_ideal_maxsock``), src/listener.c, src/cli.c and
src/check.c: Maxsock starts at 10 reserved descriptors, gains one per listener (each address or
port of a bind line, each stats socket), the CLI frontend's maxconn when a stats socket exists
(``stats maxconn``, 10 by default), one per server with health checks, then two per connection,
two per pipe (a quarter of maxconn when a proxy splices) and three per thread (its poller and a
wake-up pipe). Checked against `show info`'s Maxsock and the "Cannot raise FD limit to N" of the
Debian haproxy 2.6.12 for maxconn 5 to 7680, 1 to 4 threads, 1 to 4 binds, 0 to 2 stats sockets,
0 to 3 checked servers and splicing (tests/unit/test_advice_models.py)."""

from __future__ import annotations

from dataclasses import dataclass

from fdtrace.advice.change import Change, raised
from fdtrace.policy import with_margin

#: Descriptors HAProxy reserves before counting anything (``global.maxsock = 10``).
RESERVED_FDS = 10
#: The CLI frontend's maxconn when a stats socket is declared and ``stats maxconn`` is not.
CLI_MAXCONN = 10
#: The largest maxconn (and other count) the model takes: HAProxy keeps maxconn in an int and a
#: descriptor limit is an int too; a value past this is not a configuration but a mistake.
MAX_COUNT = 1 << 30
#: Threads at most (HAProxy 2.6's MAX_THREADS is 64; a larger nbthread is refused by it).
MAX_THREADS = 4096
#: Where HAProxy's maxconn is set, in general (a metric's help): with the FD limit it demands.
MAXCONN_PLACE = ("maxconn in the global section of its configuration, with the ulimit-n HAProxy demands for it "
                 "(its Maxsock) under strict-limits")


class ModelError(ValueError):
    """A value the model refuses (zero, negative or absurd): it is not used in any arithmetic."""


def _checked(name: str, value: int, low: int, high: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ModelError(f"{name} {value!r} is not a count HAProxy takes ({low} to {high})")
    return value


@dataclass(frozen=True)
class HaproxyShape:
    """What decides HAProxy's Maxsock besides maxconn: its threads, its listeners (bind
    addresses and ports, and stats sockets), its stats sockets, the CLI's maxconn, its checked
    servers and whether a proxy splices. Every value is range-checked (``ModelError``)."""

    nbthread: int = 1
    binds: int = 1
    stats_sockets: int = 0
    cli_maxconn: int = CLI_MAXCONN
    checks: int = 0
    splice: bool = False

    def __post_init__(self) -> None:
        _checked("nbthread", self.nbthread, 1, MAX_THREADS)
        _checked("listeners", self.binds, 0)
        _checked("stats sockets", self.stats_sockets, 0)
        _checked("stats maxconn", self.cli_maxconn, 1)
        _checked("checked servers", self.checks, 0)

    @property
    def listeners(self) -> int:
        """The listening sockets: bind addresses and stats sockets."""
        return self.binds + self.stats_sockets

    @property
    def fixed(self) -> int:
        """Maxsock's terms that do not grow with maxconn."""
        cli = self.cli_maxconn if self.stats_sockets else 0
        return RESERVED_FDS + self.listeners + cli + self.checks + 3 * self.nbthread

    def pipes(self, maxconn: int) -> int:
        """Pipes HAProxy sizes for (``compute_ideal_maxpipes``): a quarter of maxconn when a
        proxy splices (maxconn itself below 4), else none."""
        if not self.splice:
            return 0
        return maxconn // 4 if maxconn >= 4 else maxconn

    def maxsock(self, maxconn: int) -> int:
        """HAProxy's Maxsock for ``maxconn``: the FD limit it demands (``strict-limits``)."""
        _checked("maxconn", maxconn, 1)
        return self.fixed + 2 * maxconn + 2 * self.pipes(maxconn)

    def maxsock_sum(self, maxconn: int) -> str:
        """``maxsock`` written out term by term: "2 x 4096 connections + 3 x 2 threads + 2
        listeners + 10 of the stats CLI + 10 reserved = 8220"."""
        terms = [f"2 x {maxconn} connections"]
        if self.pipes(maxconn):
            terms.append(f"2 x {self.pipes(maxconn)} splice pipes")
        terms.append(f"3 x {self.nbthread} thread{'s' * (self.nbthread != 1)}")
        terms.append(f"{self.listeners} listener{'s' * (self.listeners != 1)}")
        if self.stats_sockets:
            terms.append(f"{self.cli_maxconn} of the stats CLI")
        if self.checks:
            terms.append(f"{self.checks} checked server{'s' * (self.checks != 1)}")
        terms.append(f"{RESERVED_FDS} reserved")
        return " + ".join(terms) + f" = {self.maxsock(maxconn)}"

    def maxconn_for(self, limit: int) -> int:
        """The largest maxconn whose Maxsock fits in an FD limit of ``limit`` (0: none does)."""
        _checked("FD limit", limit, 0)
        room = limit - self.fixed
        if room < 2:
            return 0
        maxconn = room // 2 if not self.splice else (2 * room) // 5  # 2 + 2/4 per connection
        while maxconn > 0 and self.maxsock(maxconn) > limit:
            maxconn -= 1
        while self.maxsock(maxconn + 1) <= limit:
            maxconn += 1
        return maxconn

    def pair(self, connections: int, fd_need: int = 0) -> tuple[int, int]:
        """(maxconn, ulimit-n) for ``connections`` at once: maxconn with the margin, and the FD
        limit that HAProxy demands for that maxconn (its Maxsock) or what was measured
        (``fd_need``), whichever is larger, with the margin. The pair starts under
        ``strict-limits``: the limit is never below Maxsock."""
        _checked("connections", connections, 1)
        maxconn = with_margin(connections)
        return maxconn, fd_limit_for(maxconn, self, fd_need)


def fd_limit_for(maxconn: int, shape: HaproxyShape, fd_need: int = 0) -> int:
    """The FD limit to advise for a haproxy with ``maxconn``: the larger of its Maxsock and a
    measured need, with the margin (never below Maxsock, so ``strict-limits`` accepts it)."""
    return with_margin(max(shape.maxsock(maxconn), fd_need))


def accepts(maxconn: int, limit: int, shape: HaproxyShape) -> bool:
    """Whether HAProxy with ``strict-limits`` starts with this maxconn under an FD limit of
    ``limit`` (its Maxsock fits)."""
    return shape.maxsock(maxconn) <= limit



def maxconn_change(connections: int, maxconn: int | None, shape: HaproxyShape, fd_in_force: int | None,
                   path: str) -> Change | None:
    """The maxconn to set for a haproxy holding ``connections`` at once under ``maxconn``: the
    connections with the margin, above the maxconn in force (None when that holds them: never
    lower), named with the ulimit-n HAProxy demands for it (``fd_limit_for``) unless the FD limit
    in force (``fd_in_force``; None: unlimited) holds that already, so the pair starts under
    ``strict-limits`` and no FD limit is advised below the one in force."""
    value = raised(connections, maxconn)
    if value is None:
        return None
    value = min(value, MAX_COUNT)
    demanded, fd_target = shape.maxsock(value), fd_limit_for(value, shape)
    if fd_in_force is None or fd_in_force >= fd_target:
        with_fd = (f", within its FD limit {fd_in_force if fd_in_force is not None else 'unlimited'} (HAProxy "
                   f"demands {demanded} for it)")
    else:
        with_fd = f", and ulimit-n {fd_target} with it (its Maxsock {demanded}, with the margin)"
    return Change("maxconn", value, f"maxconn in the global section of {path}",
                  f"set maxconn {value} in the global section of {path}{with_fd}",
                  f"{connections} connections at once" + (f" of its maxconn {maxconn}" if maxconn is not None else ""))
