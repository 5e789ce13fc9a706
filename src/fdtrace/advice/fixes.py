"""The changes that are not a process's FD limit, each a ``Change``: thread limits (Go's
SetMaxThreads, LimitNPROC, TasksMax/pids.max, kernel.threads-max and pid_max), listen queues
(net.core.somaxconn) and fs.file-max. doctor, info, the report and the live view render what
these return; none words a change of its own."""

from __future__ import annotations

from fdtrace.advice.change import Change, near_limit
from fdtrace.advice.threads import GO_THREADS_ADVICE
from fdtrace.policy import THREADS_COUNTED, with_margin

#: Thread limits of the whole system: the number advised lets the peak double (as fs.file-max).
SYSTEM_THREAD_LIMITS = ("threads-max", "pid_max")
#: Go's thread limits (the runtime's; debug.SetMaxThreads sets one).
GO_THREAD_LIMITS = ("Go default", "Go SetMaxThreads")

#: Where each kind of thread limit is set, when its unit is not known.
THREAD_PLACES = {
    "Go default": "runtime/debug.SetMaxThreads, called by the program (Go's default limit is in force)",
    "Go SetMaxThreads": "runtime/debug.SetMaxThreads, where the program calls it (it set the limit in force)",
    "RLIMIT_NPROC": "LimitNPROC= in its systemd unit (ulimit -u, or nproc in /etc/security/limits.conf, for the user)",
    "cgroup pids.max": "TasksMax= in its systemd unit (pids.max of its cgroup)",
    "threads-max": "kernel.threads-max (sysctl, and /etc/sysctl.d/)",
    "pid_max": "kernel.pid_max (sysctl, and /etc/sysctl.d/)",
}


def thread_limit_places(kinds: tuple[str, ...] = ("Go default", "RLIMIT_NPROC", "cgroup pids.max")) -> str:
    """Where each of these kinds of thread limit is changed, in general (a metric's help)."""
    return "; ".join(f"{kind}: {THREAD_PLACES[kind]}" for kind in kinds)


def thread_limit_value(kind: str, used: int, limit: int | None) -> int | None:
    """The thread limit to advise when ``used`` (what the limit counts) nears ``limit``: the
    peak with the margin, doubled for the system's limits; None when the limit in force already
    holds it (a limit is never advised lower, nor at its own value)."""
    target = with_margin(max(used, 0)) * (2 if kind in SYSTEM_THREAD_LIMITS else 1)
    if target < 1 or (limit is not None and target <= limit):
        return None
    return target


def _thread_command(kind: str, value: int, unit: str | None) -> tuple[str, str]:
    """(where, command) for a thread limit of ``kind`` set to ``value``."""
    if kind in GO_THREAD_LIMITS:
        return THREAD_PLACES[kind], f"{GO_THREADS_ADVICE}({value})"
    if kind == "RLIMIT_NPROC":
        return THREAD_PLACES[kind], f"set LimitNPROC={value} in its systemd unit (or ulimit -u {value}) for the user"
    if kind == "cgroup pids.max":
        if unit and unit.endswith(".service"):
            return (f"TasksMax= in [Service] of {unit} (pids.max of its cgroup)",
                    f"set TasksMax={value} in [Service] of {unit} (or pids.max of its cgroup)")
        return THREAD_PLACES[kind], f"set TasksMax={value} in its unit (or pids.max of its cgroup)"
    if kind in SYSTEM_THREAD_LIMITS:
        return THREAD_PLACES[kind], f"sysctl -w kernel.{kind}={value} (and in /etc/sysctl.d/)"
    return f"where {kind} is set", f"raise {kind} to {value}"


def thread_change(kind: str, used: int, limit: int | None, unit: str | None = None) -> Change | None:
    """The change of a thread limit of ``kind`` ("Go default", "Go SetMaxThreads",
    "RLIMIT_NPROC", "cgroup pids.max", "threads-max", "pid_max") whose count is ``used`` (what
    that limit counts: THREADS_COUNTED) against ``limit``: ``thread_limit_value``, set where that
    kind is set (TasksMax in [Service] of ``unit`` when it names a service); None when the
    limit in force holds it."""
    value = thread_limit_value(kind, used, limit)
    if value is None:
        return None
    where, command = _thread_command(kind, value, unit)
    counted = THREADS_COUNTED.get(kind, "tasks on the system" if kind in SYSTEM_THREAD_LIMITS else "threads")
    of = f" of {limit}" if limit is not None else ""
    resource = "Go SetMaxThreads" if kind in GO_THREAD_LIMITS else kind
    return Change(resource, value, where, command, f"peak {used} {counted}{of}, with the margin")


def go_exceeded_change(said: int) -> Change | None:
    """The change for a Go program that exceeded its thread limit (the runtime said "program
    exceeds ``said``-thread limit" and exited 2): SetMaxThreads above the limit it exceeded, with
    the margin, the goroutines bounded first; None for a number no Go limit can be."""
    if said < 1:
        return None
    value = with_margin(said)
    return Change("Go SetMaxThreads", value, THREAD_PLACES["Go SetMaxThreads"], f"{GO_THREADS_ADVICE}({value})",
                  f"the runtime said 'program exceeds {said}-thread limit': it needed more than {said}")


#: net.core.somaxconn below this is said to be low; a listen queue that overflowed gets SOMAXCONN_ADVISED.
SOMAXCONN_LOW = 4096
SOMAXCONN_ADVISED = 65535
SOMAXCONN_PLACE = "net.core.somaxconn (sysctl, and /etc/sysctl.d/), and the listener's backlog (its listen() call)"


def somaxconn_change(somaxconn: int | None, overflowed: bool = False) -> Change | None:
    """net.core.somaxconn to set: SOMAXCONN_ADVISED when the one in force (None: not known) is
    below SOMAXCONN_LOW, or below SOMAXCONN_ADVISED where a listen queue ``overflowed``; None
    when it is already at SOMAXCONN_ADVISED or more (never lower)."""
    if somaxconn is not None and somaxconn >= SOMAXCONN_ADVISED:
        return None
    if not overflowed and (somaxconn is None or somaxconn >= SOMAXCONN_LOW):
        return None
    command = f"sysctl -w net.core.somaxconn={SOMAXCONN_ADVISED} (and in /etc/sysctl.d/)"
    if overflowed:
        command += ", and raise the listener's backlog, or accept faster"
        reason = "a listen queue overflowed" + (f" under somaxconn {somaxconn}" if somaxconn is not None else "")
    else:
        reason = f"somaxconn {somaxconn} caps every listen backlog below {SOMAXCONN_LOW}"
    return Change("net.core.somaxconn", SOMAXCONN_ADVISED, SOMAXCONN_PLACE, command, reason)


def listen_fix(refused: str | None, somaxconn: int | None = None) -> str:
    """What to do about a listen queue that overflowed: when listeners (``refused``, named) were
    failing accept() with EMFILE meanwhile, the overflow was their symptom and their FD limit the
    fix; otherwise ``somaxconn_change``'s command, or, with somaxconn already high, the backlog."""
    if refused:
        return (f"a symptom: accept() failed with EMFILE in {refused} during the recording, so the queue filled "
                "while the listener could not take connections; raise its FD limit (its RLIMIT_NOFILE change), "
                "not somaxconn")
    change = somaxconn_change(somaxconn, overflowed=True)
    if change is None:
        return (f"a listen queue overflowed with somaxconn at {somaxconn}: raise the listener's backlog (its listen() "
                "call), or accept faster")
    return f"a listen queue overflowed: {change.command}"


def file_max_needed(file_nr: int, file_max: int) -> int | None:
    """The fs.file-max to set once the system's file table (file-nr) reached USAGE_WARN of it: twice
    the peak, with the limits' margin, so the peak can double before ENFILE; None below that (or
    where that is not above the fs.file-max in force)."""
    if not near_limit(file_nr, file_max):
        return None
    needed = with_margin(file_nr) * 2
    return needed if needed > file_max else None


def file_max_change(file_nr: int, file_max: int, basis: str = "") -> Change | None:
    """fs.file-max for a peak of ``file_nr`` handles (``file_max_needed``; ``basis``: whence the
    peak, file-nr's when empty); None when the one in force holds it."""
    needed = file_max_needed(file_nr, file_max)
    if needed is None:
        return None
    return Change("fs.file-max", needed, "fs.file-max (sysctl, and /etc/sysctl.d/)",
                  f"sysctl -w fs.file-max={needed} (and in /etc/sysctl.d/)",
                  basis or f"file-nr peaked at {file_nr:,} of {file_max:,}")
