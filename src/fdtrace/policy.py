"""Policy shared by the live view, doctor and the report: when usage is a warning or critical,
the margin a recommended limit gets, which errors are exhaustion, and the advice texts."""

from __future__ import annotations

import math

#: Usage of a limit (count / limit) that turns amber, and red.
USAGE_WARN = 0.80
USAGE_CRITICAL = 0.95

#: A recommended limit is the need times this margin.
LIMIT_MARGIN = 1.2

#: The errno names that mean a descriptor table is full (the process's, or the system's).
FD_EXHAUSTION_ERRNOS: frozenset[str] = frozenset({"EMFILE", "ENFILE"})

#: What to do when a Go program nears its thread limit.
GO_THREADS_ADVICE = ("bound the goroutines blocked in syscalls or cgo (e.g. DNS: the pure-Go resolver, "
                     "netgo), or raise the limit with runtime/debug.SetMaxThreads")


def with_margin(value: int) -> int:
    """A limit that leaves room above ``value`` (x LIMIT_MARGIN, rounded up)."""
    return math.ceil(value * LIMIT_MARGIN)
