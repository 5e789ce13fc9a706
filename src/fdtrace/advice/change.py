"""A change to advise, as a value: the resource, the number, where to set it, the command, and
why. The rules of this package return one; every command (doctor, info, the report, the live
view, rehearse) renders it and computes nothing of its own."""

from __future__ import annotations

from dataclasses import dataclass

from fdtrace.policy import USAGE_WARN, with_margin


@dataclass(frozen=True)
class Change:
    """One change.

    Attributes:
        resource: what is changed ("RLIMIT_NOFILE", "maxconn", "worker_connections", ...).
        value: the number to set.
        where: where to set it: the file and setting, or the unit, that set the value in force;
            else the generic places.
        command: the words (or command line) that make the change.
        reason: why, in words (what was needed and where that came from).
    """

    resource: str
    value: int
    where: str
    command: str
    reason: str = ""

    def text(self) -> str:
        """The change in one sentence: the command, then why."""
        return self.command + (f" ({self.reason})" if self.reason else "")


def near_limit(used: float | None, limit: float | None) -> bool:
    """The one "near the limit" rule of every command: ``used`` (a peak, or a need) at or above
    USAGE_WARN of ``limit``; never without a limit."""
    return used is not None and limit is not None and limit > 0 and used >= limit * USAGE_WARN


def raised(need: int, in_force: int | None) -> int | None:
    """The limit to advise for ``need``: the need with the margin, when that is above the limit
    in force; None when the limit in force already holds it (a limit is never advised lower),
    or when nothing is needed (a limit of 0 is no limit to advise)."""
    target = with_margin(need)
    if target < 1 or (in_force is not None and target <= in_force):
        return None
    return target


def soft_hard(soft: int, hard: int | None) -> str:
    """systemd's LimitNOFILE value: SOFT:HARD, or one number when they are equal (no hard limit:
    infinity)."""
    if hard is None:
        return f"{soft}:infinity"
    return str(soft) if soft == hard else f"{soft}:{hard}"


def fd_hard_to_set(target: int, hard: int | None) -> int | None:
    """The hard limit to go with a soft limit of ``target``: the one in force where it allows
    the target (None: unlimited), else the target itself."""
    return hard if hard is None or target <= hard else target


def fd_limit_ways(soft: int, hard: int | None) -> str:
    """The generic ways to set an RLIMIT_NOFILE of ``soft`` (and ``hard``) for good, where the
    process is started."""
    return (f"ulimit -n {soft} in its start script, LimitNOFILE={soft_hard(soft, hard)} in its systemd unit, "
            "or /etc/security/limits.conf for logins")


def fd_limit_fix(soft: int, hard: int | None, who: str = "the process") -> str:
    """The change where no unit or configuration is known to set the limit."""
    return f"raise it where {who} is started ({fd_limit_ways(soft, hard)})"


@dataclass(frozen=True)
class LimitPlace:
    """Where the FD limit in force was set, so that the change is made there.

    Attributes:
        kind: "haproxy" (its ulimit-n), "nginx" (worker_rlimit_nofile), "unit" (a systemd
            unit's LimitNOFILE), or "start" (not known: the generic places).
        name: the configuration file or the unit; empty for "start".
    """

    kind: str
    name: str = ""

    def where(self) -> str:
        """The place in words."""
        if self.kind == "haproxy":
            return f"ulimit-n in the global section of {self.name}"
        if self.kind == "nginx":
            return f"worker_rlimit_nofile in the main context of {self.name}"
        if self.kind == "unit":
            return f"LimitNOFILE in [Service] of {self.name}"
        return "where it is started (its start script, its systemd unit, limits.conf)"

    def command(self, soft: int, hard: int | None, who: str = "the process") -> str:
        """How to set a soft limit of ``soft`` (and ``hard``) there."""
        if self.kind == "haproxy":
            return (f"set ulimit-n {soft} in the global section of {self.name}, and let the service's "
                    "LimitNOFILE allow it")
        if self.kind == "nginx":
            return (f"set worker_rlimit_nofile {soft}; in the main context of {self.name}"
                    + ("" if hard is None or soft <= hard else
                       f", and raise the hard limit it starts under ({hard}) to {soft} (LimitNOFILE={soft} in its "
                       "unit): without CAP_SYS_RESOURCE its master cannot"))
        if self.kind == "unit":
            return (f"set LimitNOFILE={soft_hard(soft, hard)} in [Service] of {self.name}, "
                    f"then systemctl daemon-reload && systemctl restart {self.name}")
        return fd_limit_fix(soft, hard, who)


#: Where a limit is set when nothing says where the one in force came from.
AT_START = LimitPlace("start")


def fd_limit_change(need: int, basis: str, soft: int | None, hard: int | None,
                    place: LimitPlace = AT_START, who: str = "the process") -> Change | None:
    """The RLIMIT_NOFILE change for a need of ``need`` descriptors (``basis``: why): the need
    with the margin, set where the limit in force was set; None when the limit in force holds
    it (never lower)."""
    target = raised(need, soft)
    if target is None:
        return None
    # nginx's master sets its workers' soft and hard limits itself: the hard limit it starts under
    # is said only where it is lower
    hard_to_say = hard if place.kind == "nginx" else fd_hard_to_set(target, hard)
    return Change("RLIMIT_NOFILE", target, place.where(), place.command(target, hard_to_say, who),
                  f"needed: {need}, {basis}")


def fd_limit_places() -> str:
    """Where an RLIMIT_NOFILE is changed, in general (no process in view: a metric's help):
    where the process is started, or the program's own setting (HAProxy's, nginx's)."""
    return (f"set {AT_START.where()}; HAProxy: {LimitPlace('haproxy', 'its configuration').where()}; "
            f"nginx: {LimitPlace('nginx', 'its configuration').where()}")
