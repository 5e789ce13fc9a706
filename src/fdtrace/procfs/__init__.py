"""Reading /proc (and the cgroup tree): one reader with one error policy, and the samples of
FD and thread headroom taken from it."""

from fdtrace.procfs.reader import (
    CLOCK_TICKS,
    TICK_NS,
    Credentials,
    ProcessAccessDeniedError,
    ProcessGoneError,
    ProcFS,
    ProcStat,
    StartTimeResolver,
)

__all__ = ["CLOCK_TICKS", "TICK_NS", "Credentials", "ProcFS", "ProcStat", "ProcessAccessDeniedError",
           "ProcessGoneError", "StartTimeResolver"]
