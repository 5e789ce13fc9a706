"""Policy shared by the live view, doctor and the report: when usage is a warning or critical,
the margin a recommended limit gets, which errors are exhaustion, the room a probe needs and
which uids are the system's. (How a call site is named lives in ``schema.site_names``, the
thread and DNS advice texts in ``advice.threads``, byte formatting in ``units``.)"""

from __future__ import annotations

import math

#: Usage of a limit (count / limit) that turns amber, and red.
USAGE_WARN = 0.80
USAGE_CRITICAL = 0.95

#: A recommended limit is the need times this margin.
LIMIT_MARGIN = 1.2

#: The errno names that mean a descriptor table is full (the process's, or the system's).
FD_EXHAUSTION_ERRNOS: frozenset[str] = frozenset({"EMFILE", "ENFILE"})

#: What each kind of thread limit counts (``thread_count`` in the headroom series): only Go's
#: count the program's own threads; the others are shared with the user, the cgroup or the system.
THREADS_COUNTED = {"Go default": "threads", "Go SetMaxThreads": "threads", "RLIMIT_NPROC": "threads of its user",
                   "cgroup pids.max": "tasks in its cgroup", "threads-max": "tasks on the system"}


def with_margin(value: int) -> int:
    """A limit that leaves room above ``value`` (x LIMIT_MARGIN, rounded up)."""
    return math.ceil(value * LIMIT_MARGIN)


#: Descriptors a watched process must have free, read just before fdtrace does something that
#: costs it one (a connection to HAProxy's stats socket): at least this many, and this share of
#: its soft limit. fdtrace connects a few microseconds after the read, and the process takes the
#: connection at its next turn of its event loop; until then it goes on accepting. HAProxy 2.6
#: accepts at most tune.maxaccept (4 by default) connections in a row per listener and thread,
#: and gives each a server-side socket: one turn on two threads takes 2 x 4 x 2 = 16. The share
#: covers bigger processes (more threads and listeners, faster bursts): 5 % of 65,536 is 3,277.
#: (A connection fdtrace makes while the process is full costs it more than one failure: HAProxy
#: tries the accept4 again every 100 ms until a descriptor is free.)
PROBE_ROOM_MIN = 16
PROBE_ROOM_SHARE = 0.05


def probe_room(soft_limit: int) -> int:
    """Descriptors that must be free in a process whose soft limit is ``soft_limit`` before
    fdtrace makes it take one (``PROBE_ROOM_MIN``, or ``PROBE_ROOM_SHARE`` of the limit)."""
    return max(PROBE_ROOM_MIN, math.ceil(soft_limit * PROBE_ROOM_SHARE))


#: The first uid of a person's account (Debian's and most distributions' FIRST_UID): below it,
#: root and the system services, whose programs come first for what fdtrace shares out (the
#: flight recorder's incident budget).
FIRST_USER_UID = 1000


def is_system_uid(uid: int | None) -> bool:
    """Whether a process of this real uid is root's or a system service's; an unknown uid is a
    user's (a process cannot rank itself up by exiting before it is looked at)."""
    return uid is not None and 0 <= uid < FIRST_USER_UID
