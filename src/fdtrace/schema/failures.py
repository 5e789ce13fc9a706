"""The one rule for "is this a failure?", declared here once and rendered for each reader: SQL for
the analyses (``failures()``, ``incidents()``, info's headline), an Arrow mask for replay's n/N,
the flight recorder and the part summaries, and a row test for the live view.
tests/unit/test_failure_rule.py checks that the renderings agree on real recordings.

An event is, the first that applies:

- *EMFILE/ENFILE*: a call of any syscall failing with EMFILE or ENFILE;
- *OOM kill*, *Go thread limit*: an event of that kind;
- *killed by a signal*: a crash, a process_exit with a signal other than the ones below
  (SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE, a SIGKILL not sent by the OOM killer, ...). The
  SIGKILL exit of a process the OOM killer chose (an oom_kill of the same host and pid at most
  ``OOM_END_NS`` before it, ``oom_ends``) is the end of that OOM kill, not a failure of its own:
  the process is counted once, as an OOM kill;
- *ended on request*: a process_exit with SIGHUP, SIGINT, SIGTERM or SIGPIPE (``REQUESTED_SIGNALS``:
  a terminal closed, Ctrl-C, a service stopped, a pipeline's reader gone);
- *non-zero exit*: a process_exit with an exit code other than 0 (and no signal).

The first four are *incidents*: what the live view ranks first, replay stops at, the flight
recorder keeps the time around and info's headline names. Ends on request and non-zero exits
are failures too (``failures()`` lists them), but not incidents, and never a headline:
short-lived programs exit 1 all day, and a closed terminal is no failure of its shell.

The one order of harm (``HARM``, ``harm_order``), used by info's headline, the report's,
``incidents()``, the live view and the metrics: EMFILE/ENFILE and OOM kills first, then Go's
thread limit, then crashes, then ends on request and non-zero exits; within a class, the most
failures first, then who failed first.

A *failed call* is any call whose errno is not one of ``NOT_FAILURES`` (none, EAGAIN,
EINPROGRESS: the normal answers of non-blocking sockets), as the in-kernel counters count them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fdtrace.policy import FD_EXHAUSTION_ERRNOS
from fdtrace.schema.events import NOT_FAILURES

#: Failure classes, most severe first; the first four are incidents.
FAILURE_CLASSES: tuple[str, ...] = ("EMFILE/ENFILE", "OOM kill", "Go thread limit", "killed by a signal",
                                    "ended on request", "non-zero exit")
INCIDENT_CLASSES: tuple[str, ...] = FAILURE_CLASSES[:4]
#: Signals that end a process because someone asked: not a failure of the process.
REQUESTED_SIGNALS: tuple[str, ...] = ("SIGHUP", "SIGINT", "SIGTERM", "SIGPIPE")
#: The rank of harm of each class (lower: worse); a descriptor table full and an OOM kill alike.
HARM: dict[str, int] = {"EMFILE/ENFILE": 0, "OOM kill": 0, "Go thread limit": 1, "killed by a signal": 2,
                        "ended on request": 3, "non-zero exit": 4}


def harm_order(failure_class: str | None, count: int, first_ns: int) -> tuple[int, int, int]:
    """The sort key of a program's (or process's) failures by harm: its class's rank, the most
    failures first, then who failed first. Unknown classes come last."""
    return HARM.get(failure_class or "", len(FAILURE_CLASSES)), -count, first_ns


#: How long after an OOM kill the victim's SIGKILL exit is that kill's end (the kernel kills at
#: once; a victim stuck in uninterruptible sleep takes longer, never minutes).
OOM_END_NS = 60_000_000_000


def is_oom_end(kill_ns: int | None, exit_ns: int, signal: str | None) -> bool:
    """Whether a process_exit at ``exit_ns`` by ``signal`` is the end of the OOM kill of the same
    process at ``kill_ns`` (None: it had none): a SIGKILL at most ``OOM_END_NS`` after it."""
    return signal == "SIGKILL" and kill_ns is not None and 0 <= exit_ns - kill_ns <= OOM_END_NS


def oom_ends(pids: Any, times: Any, kinds: Any, signals: Any, hosts: Any = None) -> Any:
    """Which rows (numpy bool array) are the SIGKILL exit of a process the OOM killer chose: a
    process_exit by SIGKILL with an oom_kill of the same pid (and host, when given) at most
    ``OOM_END_NS`` before it, among the same rows. Arguments are sequences of equal length."""
    import numpy as np

    pids = np.asarray(pids, dtype=np.int64)
    times = np.asarray(times, dtype=np.int64)
    kinds = np.asarray(kinds, dtype=object)
    hosts = np.asarray(hosts if hosts is not None else [""] * len(pids), dtype=object)
    found = np.zeros(len(pids), dtype=bool)
    kills: dict[tuple[Any, int], list[int]] = {}
    for i in np.flatnonzero(kinds == "oom_kill"):
        kills.setdefault((hosts[i], int(pids[i])), []).append(int(times[i]))
    if not kills:
        return found
    ends = np.flatnonzero((kinds == "process_exit") & (np.asarray(signals, dtype=object) == "SIGKILL"))
    for i in ends:
        at = int(times[i])
        found[i] = any(is_oom_end(kill, at, "SIGKILL") for kill in kills.get((hosts[i], int(pids[i])), ()))
    return found


#: Event kinds that are a failure by themselves, and their class.
FAILURE_KINDS: dict[str, str] = {"oom_kill": "OOM kill", "go_thread_limit": "Go thread limit"}

_ERRNOS = sorted(FD_EXHAUSTION_ERRNOS)


def _text(value: Any) -> str:
    """A text column's value, None and NaN as ""."""
    return value if isinstance(value, str) else ""


def failure_class(row: Mapping[str, Any]) -> str | None:
    """The class of one event (a mapping of the event columns ``kind``, ``errno``, ``signal`` and
    ``exit_code``), or None when it is no failure."""
    if _text(row.get("errno")) in FD_EXHAUSTION_ERRNOS:
        return FAILURE_CLASSES[0]
    kind = _text(row.get("kind"))
    if kind in FAILURE_KINDS:
        return FAILURE_KINDS[kind]
    if kind != "process_exit":
        return None
    signal = _text(row.get("signal"))
    if signal:
        return FAILURE_CLASSES[4] if signal in REQUESTED_SIGNALS else FAILURE_CLASSES[3]
    code = row.get("exit_code")
    return FAILURE_CLASSES[5] if code is not None and code == code and int(code) != 0 else None


def is_failed_call(errno: Any) -> bool:
    """Whether a call with this errno failed (not one of ``NOT_FAILURES``)."""
    return _text(errno) not in NOT_FAILURES


def _quoted(values: Any) -> str:
    return ", ".join("'" + v + "'" for v in values)


#: SQL (DuckDB's dialect, over the events view) of each class.
FD_SQL = f"errno IN ({_quoted(_ERRNOS)})"
KILLED_SQL = ("kind = 'process_exit' AND signal IS NOT NULL AND signal <> '' AND "
              f"signal NOT IN ({_quoted(REQUESTED_SIGNALS)})")
REQUESTED_SQL = f"kind = 'process_exit' AND signal IN ({_quoted(REQUESTED_SIGNALS)})"
BAD_EXIT_SQL = "kind = 'process_exit' AND coalesce(exit_code, 0) <> 0"
INCIDENT_SQL = f"(({FD_SQL}) OR kind IN ({_quoted(FAILURE_KINDS)}) OR ({KILLED_SQL}))"
FAILURE_SQL = f"({INCIDENT_SQL} OR ({REQUESTED_SQL}) OR ({BAD_EXIT_SQL}))"


def failed_call_sql(alias: str = "") -> str:
    """SQL: the call failed (its errno, of table ``alias``, not one of ``NOT_FAILURES``)."""
    column = f"{alias}.errno" if alias else "errno"
    return f"(coalesce({column}, '') NOT IN ({_quoted(NOT_FAILURES)}))"


def incident_mask(events: Any, exits: bool = False) -> Any:
    """Which rows of an events table (pyarrow) are incidents; with ``exits``, failures (ends on
    request and non-zero exits too). The SIGKILL exit of an OOM kill's victim is neither when its
    oom_kill is in the same table (``oom_ends``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def text(name: str) -> Any:
        column = events[name] if name in events.column_names else pa.nulls(events.num_rows, pa.string())
        return pc.fill_null(column.cast(pa.string()), "")

    kind = text("kind")
    ended = pc.equal(kind, "process_exit")
    found = pc.or_(pc.is_in(text("errno"), value_set=pa.array(_ERRNOS)),
                   pc.is_in(kind, value_set=pa.array(list(FAILURE_KINDS))))
    signal = text("signal")
    requested = pc.is_in(signal, value_set=pa.array(REQUESTED_SIGNALS))
    found = pc.or_(found, pc.and_(ended, pc.and_(pc.not_equal(signal, ""), pc.invert(requested))))
    if exits:
        found = pc.or_(found, pc.and_(ended, requested))
        if "exit_code" in events.column_names:
            code = pc.fill_null(events["exit_code"].cast(pa.int64()), 0)
            found = pc.or_(found, pc.and_(ended, pc.not_equal(code, 0)))
    time_column = next((c for c in ("ts_ns", "time_ns") if c in events.column_names), None)
    if time_column is not None and "pid" in events.column_names and pc.any(pc.equal(kind, "oom_kill")).as_py():
        after_oom = oom_ends(events["pid"].to_numpy(zero_copy_only=False),  # rare: only then looked at twice
                             events[time_column].cast(pa.int64()).to_numpy(zero_copy_only=False),
                             kind.to_numpy(zero_copy_only=False), signal.to_numpy(zero_copy_only=False))
        found = pc.and_(found, pc.invert(pa.array(after_oom)))
    return found
