"""The one rule for "is this a failure?", declared here once and rendered for each reader: SQL for
the analyses (``failures()``, ``incidents()``, info's headline), an Arrow mask for replay's n/N,
the flight recorder and the part summaries, and a row test for the live view.
tests/unit/test_failure_rule.py checks that the renderings agree on real recordings.

An event is, the first that applies:

- *EMFILE/ENFILE*: a call of any syscall failing with EMFILE or ENFILE;
- *OOM kill*, *Go thread limit*: an event of that kind;
- *killed by a signal*: a process_exit with a signal;
- *non-zero exit*: a process_exit with an exit code other than 0 (and no signal).

The first four are *incidents*: what the live view ranks first, replay stops at, the flight
recorder keeps the time around and info's headline names. A non-zero exit is a failure too
(``failures()`` lists it), but not an incident: short-lived programs exit 1 all day.

A *failed call* is any call whose errno is not one of ``NOT_FAILURES`` (none, EAGAIN,
EINPROGRESS: the normal answers of non-blocking sockets), as the in-kernel counters count them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fdtrace.policy import FD_EXHAUSTION_ERRNOS
from fdtrace.schema.events import NOT_FAILURES

#: Failure classes, most severe first; all but the last are incidents.
FAILURE_CLASSES: tuple[str, ...] = ("EMFILE/ENFILE", "OOM kill", "Go thread limit", "killed by a signal",
                                    "non-zero exit")
INCIDENT_CLASSES: tuple[str, ...] = FAILURE_CLASSES[:4]
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
    if _text(row.get("signal")):
        return FAILURE_CLASSES[3]
    code = row.get("exit_code")
    return FAILURE_CLASSES[4] if code is not None and code == code and int(code) != 0 else None


def is_failed_call(errno: Any) -> bool:
    """Whether a call with this errno failed (not one of ``NOT_FAILURES``)."""
    return _text(errno) not in NOT_FAILURES


def _quoted(values: Any) -> str:
    return ", ".join("'" + v + "'" for v in values)


#: SQL (DuckDB's dialect, over the events view) of each class.
FD_SQL = f"errno IN ({_quoted(_ERRNOS)})"
KILLED_SQL = "kind = 'process_exit' AND signal IS NOT NULL AND signal <> ''"
BAD_EXIT_SQL = "kind = 'process_exit' AND coalesce(exit_code, 0) <> 0"
INCIDENT_SQL = f"(({FD_SQL}) OR kind IN ({_quoted(FAILURE_KINDS)}) OR ({KILLED_SQL}))"
FAILURE_SQL = f"({INCIDENT_SQL} OR ({BAD_EXIT_SQL}))"


def failed_call_sql(alias: str = "") -> str:
    """SQL: the call failed (its errno, of table ``alias``, not one of ``NOT_FAILURES``)."""
    column = f"{alias}.errno" if alias else "errno"
    return f"(coalesce({column}, '') NOT IN ({_quoted(NOT_FAILURES)}))"


def incident_mask(events: Any, exits: bool = False) -> Any:
    """Which rows of an events table (pyarrow) are incidents; with ``exits``, failures (non-zero
    exits too)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def text(name: str) -> Any:
        column = events[name] if name in events.column_names else pa.nulls(events.num_rows, pa.string())
        return pc.fill_null(column.cast(pa.string()), "")

    kind = text("kind")
    ended = pc.equal(kind, "process_exit")
    found = pc.or_(pc.is_in(text("errno"), value_set=pa.array(_ERRNOS)),
                   pc.is_in(kind, value_set=pa.array(list(FAILURE_KINDS))))
    found = pc.or_(found, pc.and_(ended, pc.not_equal(text("signal"), "")))
    if exits and "exit_code" in events.column_names:
        code = pc.fill_null(events["exit_code"].cast(pa.int64()), 0)
        found = pc.or_(found, pc.and_(ended, pc.not_equal(code, 0)))
    return found
