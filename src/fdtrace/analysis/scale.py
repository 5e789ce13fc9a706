"""What a distributed job will need at a world size it has not run at, from its ledgers at the
world sizes it ran at (``fdtrace scale``, and the report of a ``run --record`` recording).

Each owner of the ledger (``fdtrace.analysis.rank_ledger``) grows by one law with the world size
N: constant, per peer (``a + b (N - 1)``: the collectives' full mesh) or per rank on the store's
host (``a + b N``: the store's connections). With two world sizes or more the law is fitted; with one,
it comes from the structure: the pairs a rank holds per peer it reaches (N - 1 of them), the
store's connections per rank, the rest constant. The store's host (rank 0 where it hosts the
store) is projected apart from the other ranks. Against the limits the recordings saw (each
rank's RLIMIT_NOFILE, the host's somaxconn, threads-max and file-max) the projection says which
limit breaks first, at which world size, and the largest world size that fits them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fdtrace.analysis.rank_ledger import JobLedger
from fdtrace.errors import FdtraceError
from fdtrace.policy import with_margin
from fdtrace.schema.owners import OWNERS, SOCKET_OWNERS

#: Linux's default net.ipv4.ip_local_port_range (32768-60999): recordings do not hold the host's own.
EPHEMERAL_PORTS = 60999 - 32768 + 1
#: The largest world size searched for a limit's break.
WORLD_CAP = 10_000_000
#: What the laws are called.
CONSTANT, PER_PEER, PER_RANK = "constant", "per peer", "per rank"
HOST, OTHERS = "store host", "other ranks"


@dataclass(frozen=True)
class Law:
    """How one figure of one kind of rank grows with the world size N: ``base + per * x``, x being
    N - 1 (per peer, and constant) or N (per rank)."""

    role: str
    figure: str
    kind: str
    base: float
    per: float
    basis: str

    def at(self, world: int) -> int:
        """The figure at world size ``world``."""
        x = world if self.kind == PER_RANK else world - 1
        return max(int(round(self.base + self.per * x)), 0)

    def words(self) -> str:
        """The law as a formula in N."""
        if self.kind == CONSTANT:
            return f"{_num(self.base)}"
        x = "N" if self.kind == PER_RANK else "(N-1)"
        base = f"{_num(self.base)} + " if round(self.base, 2) else ""
        return f"{base}{_num(self.per)}·{x}"


def _num(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 0.005 else f"{value:.2f}"


@dataclass(frozen=True)
class Limit:
    """One limit the projection is held against: ``need(N)`` must stay at or under ``value``."""

    name: str
    value: int
    need: Callable[[int], int] = field(compare=False)
    at_world: int | None = None  # the first world size whose need passes it (None: none under WORLD_CAP)


@dataclass
class Projection:
    """The job at world size ``world``.

    Attributes:
        world: the world size projected to.
        ranks_per_host: ranks on each host.
        seen: the world sizes the recordings held.
        store_rank: the rank hosting the store (None: no rank does).
        laws: every law (role, figure, kind, base, per, basis).
        roles: per role, the figures at ``world`` (fds, sockets, threads, limit, connects, by_owner).
        hosts: per host kind, its connections, ephemeral ports, descriptors and threads.
        limits: every limit with the world size at which it breaks.
        first_limit: the limit that breaks first (None: none does).
        max_world: the largest world size that fits every limit (None: no limit breaks).
        advice: what to change, in words.
    """

    world: int
    ranks_per_host: int
    seen: list[int]
    store_rank: int | None
    laws: list[Law]
    roles: dict[str, dict[str, Any]]
    hosts: dict[str, dict[str, int]]
    limits: list[Limit]
    first_limit: Limit | None
    max_world: int | None
    advice: list[str]

    def role_of(self, rank: int) -> str:
        """The role of ``rank``: the store's host, or one of the others."""
        return HOST if rank == self.store_rank and HOST in self.roles else OTHERS

    def to_json(self) -> dict[str, Any]:
        """What ``fdtrace scale --json`` prints."""
        ranks = []
        for rank in range(self.world):
            figures = self.roles[self.role_of(rank)]
            ranks.append({"rank": rank, "fds": figures["fds"], "sockets": figures["sockets"],
                          "threads": figures["threads"], "limit": figures["limit"],
                          "by_owner": dict(figures["by_owner"])})
        first = None if self.first_limit is None else {"name": self.first_limit.name,
                                                        "at_world": self.first_limit.at_world,
                                                        "limit": self.first_limit.value}
        return {"world": self.world, "ranks_per_host": self.ranks_per_host, "seen_worlds": self.seen,
                "store_rank": self.store_rank, "ranks": ranks, "hosts": self.hosts,
                "laws": [{"role": law.role, "figure": law.figure, "kind": law.kind, "base": round(law.base, 3),
                          "per": round(law.per, 3), "formula": law.words(), "basis": law.basis}
                         for law in self.laws],
                "limits": [{"name": lim.name, "limit": lim.value, "need": lim.need(self.world),
                            "at_world": lim.at_world} for lim in self.limits],
                "first_limit": first, "max_world": self.max_world, "advice": self.advice}

    def laws_frame(self) -> pd.DataFrame:
        """The laws as a frame: role, figure, kind, formula, basis."""
        return pd.DataFrame([{"role": law.role, "figure": law.figure, "kind": law.kind, "formula": law.words(),
                              "basis": law.basis} for law in self.laws])

    def curve(self, worlds: list[int]) -> pd.DataFrame:
        """Each owner's descriptors per role at each of ``worlds`` (the report's chart)."""
        rows = [{"world": w, "role": law.role, "owner": law.figure, "descriptors": law.at(w)}
                for law in self.laws if law.figure in OWNERS for w in worlds]
        return pd.DataFrame(rows, columns=["world", "role", "owner", "descriptors"])


def _points(jobs: list[JobLedger]) -> dict[str, dict[str, dict[int, list[int]]]]:
    """Per role, per figure (each owner, threads, connects, limit), the values at each world size:
    the most any rank of that role held."""
    points: dict[str, dict[str, dict[int, list[int]]]] = {}
    for job in jobs:
        owners = job.by_owner()
        for role in (HOST, OTHERS):
            if role == HOST:
                chosen = [job.store_rank] if job.store_rank is not None else []
            else:
                chosen = [r for r in job.ranks["rank"] if r != job.store_rank]
            if not chosen:
                continue
            ranks = job.ranks.set_index("rank").loc[chosen]
            figures = {o: int(owners.loc[chosen, o].max()) for o in OWNERS}
            figures["threads"] = int(ranks["threads"].max())
            figures["connects"] = int(round(float(ranks["connects"].mean())))  # connected or accepted: both sides
            for figure, value in figures.items():
                points.setdefault(role, {}).setdefault(figure, {}).setdefault(job.world_size, []).append(value)
    return points


def _law(role: str, figure: str, values: dict[int, list[int]], store_client: float) -> Law:
    worlds = sorted(values)
    means = [float(np.mean(values[w])) for w in worlds]
    per_rank = figure == "store_server"
    if len(worlds) >= 2:
        xs = np.array([w if per_rank else w - 1 for w in worlds], dtype=float)
        ys = np.array(means)
        slope = float(np.polyfit(xs, ys, 1)[0])
        if abs(slope - round(slope * 2) / 2) < 0.15:  # whole or half connections per peer
            slope = round(slope * 2) / 2
        base = float(np.mean(ys - slope * xs))
        if abs(base - round(base)) < 0.15:
            base = float(round(base))
        kind = CONSTANT if slope == 0 else (PER_RANK if per_rank else PER_PEER)
        return Law(role, figure, kind, base, slope, "fitted from world sizes " + ", ".join(map(str, worlds)))
    world, value = worlds[0], means[0]
    basis = f"from the structure of world size {world}"
    if figure == "pairs" and world > 1:
        return Law(role, figure, PER_PEER if value else CONSTANT, 0.0, value / (world - 1), basis)
    if figure == "store_server":
        return Law(role, figure, PER_RANK if value else CONSTANT, 0.0, value / world, basis)
    if figure == "connects" and world > 1:  # the store's client connects, and the pairs it connected
        per = max(value - store_client, 0) / (world - 1)
        return Law(role, figure, PER_PEER if per else CONSTANT, min(store_client, value), per, basis)
    return Law(role, figure, CONSTANT, value, 0.0, basis)


def _same_job(jobs: list[JobLedger]) -> None:
    """Refuse ledgers of different jobs: one hosts the store in a rank and another does not, or
    their ranks hold different numbers of collective connections per peer."""
    def shape(job: JobLedger) -> tuple[bool, float]:
        owners = job.by_owner()
        others = [r for r in job.ranks["rank"] if r != job.store_rank] or list(job.ranks["rank"])
        pairs = float(owners.loc[others, "pairs"].max()) if job.world_size > 1 else 0.0
        return job.store_rank is not None, round(pairs / max(job.world_size - 1, 1), 1)

    first = shape(jobs[0])
    for job in jobs[1:]:
        this = shape(job)
        if this[0] != first[0]:
            raise FdtraceError(f"the recordings are of different jobs: {_name(jobs[0])} "
                               f"{'hosts' if first[0] else 'does not host'} the rendezvous store in a rank, "
                               f"{_name(job)} {'does' if this[0] else 'does not'}")
        if this[1] != first[1]:
            raise FdtraceError(f"the recordings are of different jobs: {_name(jobs[0])} holds {_num(first[1])} "
                               f"collective connections per peer, {_name(job)} {_num(this[1])}")


def _name(job: JobLedger) -> str:
    return f"{job.source or 'the recording'} ({job.world_size} ranks)"


def _break(need: Callable[[int], int], limit: int) -> int | None:
    """The smallest world size (2 and up) whose need passes ``limit`` (needs grow with N)."""
    if need(WORLD_CAP) <= limit:
        return None
    low, high = 2, WORLD_CAP
    if need(low) > limit:
        return low
    while high - low > 1:
        middle = (low + high) // 2
        if need(middle) > limit:
            high = middle
        else:
            low = middle
    return high


def project(jobs: list[JobLedger], world: int, ranks_per_host: int | None = None) -> Projection:
    """The job of ``jobs`` (ledgers of one job at one or more world sizes) at ``world`` ranks,
    ``ranks_per_host`` to a host (default: the most ranks one recording's host held).

    Raises:
        FdtraceError: no job, jobs of different shapes, or a world size below 1.
    """
    if not jobs:
        raise FdtraceError("no distributed job in the recordings: record one with fdtrace run --record "
                           "(its phases name the ranks)")
    if world < 1:
        raise FdtraceError(f"--world must be 1 or more, not {world}")
    _same_job(jobs)
    per_host = ranks_per_host or max(len(j.ranks) for j in jobs)
    if per_host < 1:
        raise FdtraceError(f"--ranks-per-host must be 1 or more, not {per_host}")
    store_rank = next((j.store_rank for j in jobs if j.store_rank is not None), None)
    points = _points(jobs)
    laws: list[Law] = []
    laws_by: dict[tuple[str, str], Law] = {}
    for role, figures in points.items():
        clients = figures.get("store_client", {})
        store_client = float(np.mean([v for vs in clients.values() for v in vs])) if clients else 0.0
        for figure in (*OWNERS, "threads", "connects"):
            if figure in figures:
                law = _law(role, figure, figures[figure], store_client)
                laws.append(law)
                laws_by[(role, figure)] = law
    fd_limits = {role: _role_limit(jobs, role) for role in points}
    roles: dict[str, dict[str, Any]] = {}
    for role in points:
        by_owner = {o: laws_by[(role, o)].at(world) for o in OWNERS}
        roles[role] = {"fds": sum(by_owner.values()), "sockets": sum(by_owner[o] for o in SOCKET_OWNERS),
                       "threads": laws_by[(role, "threads")].at(world),
                       "connects": laws_by[(role, "connects")].at(world), "limit": fd_limits[role],
                       "by_owner": by_owner}

    def need(role: str, figure: str) -> Callable[[int], int]:
        if figure == "fds":
            return lambda n: sum(laws_by[(role, o)].at(n) for o in OWNERS)
        return lambda n: laws_by[(role, figure)].at(n)

    def per_host_need(figure: str) -> Callable[[int], int]:
        """On the busiest host: the store's host and R - 1 other ranks, or R other ranks."""
        def total(n: int) -> int:
            r = min(per_host, n)
            others = need(OTHERS, figure)(n) if OTHERS in roles else 0
            candidates = [r * others]
            if HOST in roles:
                candidates.append(need(HOST, figure)(n) + (r - 1) * others)
            return max(candidates)
        return total

    system = _system(jobs)
    limits: list[Limit] = []
    for role in roles:
        fd_limit = fd_limits[role]
        if fd_limit is not None:
            who = f"rank {store_rank}" if role == HOST else "each other rank"
            limits.append(Limit(f"RLIMIT_NOFILE of {who}", fd_limit, need(role, "fds")))
    if HOST in roles and "somaxconn" in system:
        limits.append(Limit("net.core.somaxconn (the store's listen backlog: every rank connects at once)",
                            system["somaxconn"], need(HOST, "store_server")))
    if "threads_max" in system:
        limits.append(Limit(f"kernel.threads-max ({per_host} ranks to a host)", system["threads_max"],
                            per_host_need("threads")))
    if "file_max" in system:
        limits.append(Limit(f"fs.file-max ({per_host} ranks to a host)", system["file_max"], per_host_need("fds")))
    limits = [Limit(lim.name, lim.value, lim.need, _break(lim.need, lim.value)) for lim in limits]
    broken = [lim for lim in limits if lim.at_world is not None]
    first = min(broken, key=lambda lim: lim.at_world or 0) if broken else None
    max_world = None if first is None or first.at_world is None else first.at_world - 1
    hosts = {"busiest host": {"ranks": min(per_host, world), "connections": _host_connections(roles, per_host, world),
                              "ephemeral_ports": per_host_need("connects")(world), "ephemeral_range": EPHEMERAL_PORTS,
                              "fds": per_host_need("fds")(world), "threads": per_host_need("threads")(world)}}
    projection = Projection(world, per_host, sorted({j.world_size for j in jobs}), store_rank, laws, roles, hosts,
                            limits, first, max_world, [])
    projection.advice = _advice(projection)
    return projection


def _host_connections(roles: dict[str, dict[str, Any]], per_host: int, world: int) -> int:
    """TCP connections on the busiest host: its ranks' store, pair and other connections."""
    def conns(role: str) -> int:
        owners = roles[role]["by_owner"]
        return int(owners["store_server"] + owners["store_client"] + owners["pairs"])
    r = min(per_host, world)
    others = conns(OTHERS) if OTHERS in roles else 0
    return max([r * others] + ([conns(HOST) + (r - 1) * others] if HOST in roles else []))


def _role_limit(jobs: list[JobLedger], role: str) -> int | None:
    """The smallest soft RLIMIT_NOFILE the recordings saw on ranks of ``role``."""
    seen = []
    for job in jobs:
        ranks = job.ranks
        mine = ranks[ranks["rank"] == job.store_rank] if role == HOST else ranks[ranks["rank"] != job.store_rank]
        seen += [int(v) for v in mine["fd_limit"].dropna()]
    return min(seen) if seen else None


def _system(jobs: list[JobLedger]) -> dict[str, int]:
    """The host limits, the smallest any recording saw."""
    found: dict[str, int] = {}
    for job in jobs:
        for key, value in job.system.items():
            found[key] = min(found.get(key, value), value)
    return found


def _advice(projection: Projection) -> list[str]:
    """What to change for ``projection.world`` ranks, in the report's words."""
    from fdtrace.advice.change import fd_limit_ways

    lines = []
    world = projection.world
    for role, figures in projection.roles.items():
        limit, fds = figures["limit"], figures["fds"]
        who = f"rank {projection.store_rank}" if role == HOST else (
            "each rank" if HOST not in projection.roles else "each other rank")
        if limit is not None and fds > limit:
            target = with_margin(fds)
            lines.append(f"at {world:,} ranks {who} needs {fds:,} descriptors; its limit is {limit:,}: raise it to "
                         f"{target:,} ({fd_limit_ways(target, None)})")
    for lim in projection.limits:
        if lim.name.startswith("RLIMIT_NOFILE"):
            continue
        need = lim.need(world)
        if need > lim.value:
            lines.append(f"at {world:,} ranks {lim.name} is passed: {need:,} needed, {lim.value:,} in force")
    if projection.first_limit is not None and projection.max_world is not None:
        lines.append(f"the first limit to break is {projection.first_limit.name}, at "
                     f"{projection.first_limit.at_world:,} ranks: the job fits up to {projection.max_world:,}")
    return lines
