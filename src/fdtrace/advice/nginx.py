"""nginx's own arithmetic: a worker holds at most ``worker_connections`` connections, its
listening sockets among them, and a proxied connection takes two (the client's and the
upstream's); each worker's descriptor limit is ``worker_rlimit_nofile`` when set, else the limit
it was started under. The master holds the listening sockets but accepts nothing: only the
workers' limits matter for connections.

Checked on Debian's nginx 1.22.1 with the stream module: ``worker_connections 64`` with one
listener proxies 31 connections and resets the 32nd ("worker_connections are not enough")."""

from __future__ import annotations

from dataclasses import dataclass

from fdtrace.advice.change import Change, LimitPlace, fd_limit_change
from fdtrace.advice.haproxy import MAX_COUNT, ModelError
from fdtrace.policy import with_margin

#: Connection slots a proxied connection takes in a worker: the client's and the upstream's.
SLOTS_PER_PROXIED = 2
#: nginx's default worker_connections (when its events block does not say).
DEFAULT_WORKER_CONNECTIONS = 512


def _checked(name: str, value: int | None, low: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_COUNT:
        raise ModelError(f"{name} {value!r} is not a value nginx takes ({low} to {MAX_COUNT})")
    return value


@dataclass(frozen=True)
class NginxShape:
    """An nginx configuration's limits (every value range-checked: ``ModelError``).

    Attributes:
        path: the configuration file.
        worker_connections: per worker (the events block's), DEFAULT_WORKER_CONNECTIONS unset.
        worker_processes: the workers (None: "auto", one per CPU).
        worker_rlimit_nofile: each worker's RLIMIT_NOFILE, None when unset.
        listeners: listen directives (each a slot in every worker).
    """

    path: str
    worker_connections: int = DEFAULT_WORKER_CONNECTIONS
    worker_processes: int | None = 1
    worker_rlimit_nofile: int | None = None
    listeners: int = 1

    def __post_init__(self) -> None:
        _checked("worker_connections", self.worker_connections, 1)
        _checked("worker_processes", self.worker_processes, 1)
        _checked("worker_rlimit_nofile", self.worker_rlimit_nofile, 1)
        _checked("listeners", self.listeners, 0)

    def proxied_per_worker(self) -> int:
        """Proxied connections one worker holds before "worker_connections are not enough"."""
        return max(self.worker_connections - self.listeners, 0) // SLOTS_PER_PROXIED

    def worker_connections_for(self, connections: int) -> int:
        """The worker_connections for ``connections`` proxied at once, with the margin: any one
        worker may accept them all (nginx does not spread accepts evenly)."""
        _checked("connections", connections, 1)
        return with_margin(SLOTS_PER_PROXIED * connections + self.listeners)

    def connections_change(self, connections: int) -> Change | None:
        """worker_connections for ``connections``; None when the one set holds them (never lower)."""
        value = self.worker_connections_for(connections)
        if value <= self.worker_connections:
            return None
        return Change("worker_connections", value, f"worker_connections in the events block of {self.path}",
                      f"set worker_connections {value}; in the events block of {self.path}",
                      f"{connections} proxied connections take {SLOTS_PER_PROXIED * connections} connection slots "
                      f"and the {self.listeners} listener{'s' * (self.listeners != 1)} one each; "
                      f"{self.worker_connections} hold {self.proxied_per_worker()}")

    def fd_change(self, need: int, basis: str, soft: int | None, hard: int | None) -> Change | None:
        """A worker's RLIMIT_NOFILE for a need of ``need``, set with worker_rlimit_nofile; None
        when the limit in force holds it (never lower)."""
        return fd_limit_change(need, basis, soft, hard, LimitPlace("nginx", self.path), "nginx")
