"""The words and numbers of the fixes that are not a process's FD limit: thread limits (Go's
SetMaxThreads, LimitNPROC, TasksMax, pids.max, threads-max), listen queues and fs.file-max."""

from __future__ import annotations

from collections.abc import Callable

from fdtrace.advice.change import near_limit
from fdtrace.policy import GO_THREADS_ADVICE, with_margin

#: How to raise each kind of thread limit (see ``headroom()``), given the number to set.
THREAD_FIXES: dict[str, Callable[[int], str]] = {
    "Go default": lambda need: f"{GO_THREADS_ADVICE}({need})",
    "Go SetMaxThreads": lambda need: f"{GO_THREADS_ADVICE}({need})",
    "RLIMIT_NPROC": lambda need: f"set LimitNPROC={need} in its systemd unit (or ulimit -u {need}) for the user",
    "cgroup pids.max": lambda need: f"set TasksMax={need} in its unit (or pids.max of its cgroup)",
    "threads-max": lambda need: f"sysctl -w kernel.threads-max={need}",
}


def thread_fix(kind: str, need: int | None = None) -> str:
    """How to raise a thread limit of ``kind`` to ``need``; a Go limit without a number (its
    program's threads are not known) is the advice alone."""
    if need is None:
        if kind.startswith("Go "):
            return GO_THREADS_ADVICE
        return f"raise {kind}"
    return THREAD_FIXES[kind](need) if kind in THREAD_FIXES else f"raise {kind} to {need}"


def listen_fix(refused: str | None) -> str:
    """What to do about a listen queue that overflowed: when listeners (``refused``, named) were
    failing accept() with EMFILE meanwhile, the overflow was their symptom and their FD limit the
    fix; otherwise somaxconn and the backlog."""
    if refused:
        return (f"a symptom: accept() failed with EMFILE in {refused} during the recording, so the queue filled "
                "while the listener could not take connections; raise its FD limit (its RLIMIT_NOFILE change), "
                "not somaxconn")
    return "a listen queue overflowed: raise somaxconn (65535) and the listener's backlog, or accept faster"


def file_max_needed(file_nr: int, file_max: int) -> int | None:
    """The fs.file-max to set once the system's file table (file-nr) reached USAGE_WARN of it: twice
    the peak, with the limits' margin, so the peak can double before ENFILE; None below that."""
    if not near_limit(file_nr, file_max):
        return None
    return with_margin(file_nr) * 2


def file_max_fix(needed: int) -> str:
    """The command that sets fs.file-max to ``needed`` (``file_max_needed``), now and at boot."""
    return f"sysctl -w fs.file-max={needed} (and in /etc/sysctl.d/)"
