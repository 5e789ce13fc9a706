"""What to change, said once: the rules that turn a recording's figures into advice and the
words of each fix, used by the report (its "What to change"), ``info`` and doctor, so that one
rule has one wording wherever it is read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from fdtrace.advice.change import LimitPlace, fd_hard_to_set, fd_limit_ways, near_limit
from fdtrace.advice.fixes import GO_THREAD_LIMITS, file_max_change, go_exceeded_change, listen_fix, thread_change
from fdtrace.advice.threads import GO_THREADS_ADVICE
from fdtrace.analysis import headroom_series as headroom_module
from fdtrace.analysis.engines import Engine
from fdtrace.analysis.engines.dataset import engine_for
from fdtrace.analysis.memory import memory_advice_lines, memory_needs_on, oom_victims_on
from fdtrace.analysis.needs import fd_needs_on
from fdtrace.policy import THREADS_COUNTED, USAGE_WARN

if TYPE_CHECKING:
    from fdtrace.analysis.engines.dataset import Dataset

# The words of each fix live in the advice layer (``fdtrace.advice``), read here by the report's
# lines below and by doctor's checks (doctor/checks.py), so that the two never say one change in
# two ways.


def go_said(limit: Any) -> str:
    """The Go runtime's message with the N its event holds, as an integer; in words when none is held."""
    if limit is None or pd.isna(limit):
        return "it exceeded its thread limit (the number was not recorded)"
    return f"'program exceeds {int(limit)}-thread limit'"


# The rules over a recording: the report's "What to change" (and ``info``'s, for the FD and
# memory lines).


def recommendations(recording: Dataset, least: pd.DataFrame, engine: Engine | None = None,
                    memory: pd.DataFrame | None = None, victims: pd.DataFrame | None = None,
                    needs: pd.DataFrame | None = None, fullest_threads: pd.DataFrame | None = None) -> list[str]:
    """The configuration values to change, with the numbers the recording justifies (``memory``,
    ``victims``, ``needs`` and ``fullest_threads``: computed by the caller already, else here)."""
    if engine is None:
        with engine_for(recording) as own:
            return recommendations(recording, least, own, memory, victims, needs, fullest_threads)
    several = least["host"].nunique() > 1 if len(least) else False
    needs = fd_needs_on(engine) if needs is None else needs
    advice = fd_advice(needs, several=several)
    advice += memory_advice_lines(memory_needs_on(engine, needs) if memory is None else memory,
                                  oom_victims_on(engine) if victims is None else victims, several=several)
    advice += system_advice(engine)
    advice += thread_advice(engine, fullest_threads)
    if not advice:
        advice.append("No limit was approached in this recording: nothing to change.")
    return advice


def fd_advice(needs: pd.DataFrame, several: bool = False) -> list[str]:
    """One line per process that failed with EMFILE or came near its FD limit: the soft limit to
    set, from what it needed (``fd_needs()``), never from a peak its limit capped."""
    advice = []
    for row in needs.itertuples():
        soft = None if pd.isna(row.fd_soft_limit) else int(row.fd_soft_limit)
        if not row.emfile and not near_limit(row.need, soft):
            continue
        where = f" on {row.host}" if several else ""
        failed = f", failed {row.emfile:,} times with EMFILE" if row.emfile else ""
        if not row.need:  # no sample of it (none, or none possible: see the reader's notes): no figure to give
            advice.append(f"RLIMIT_NOFILE of {row.comm} [{row.pid}]{where}{failed}; no sample of it holds a limit or "
                          "a peak fdtrace can believe, so no figure is advised (fdtrace doctor --pid while it runs "
                          "gives one).")
            continue
        limit = soft if soft is not None else "unlimited"
        hard = None if pd.isna(row.fd_hard_limit) else int(row.fd_hard_limit)
        config = getattr(row, "limit_config", None)
        hard_to_set = fd_hard_to_set(row.recommended, hard)
        ways = (LimitPlace("haproxy", config).command(row.recommended, hard_to_set) if isinstance(config, str)
                else fd_limit_ways(row.recommended, hard_to_set))
        text = (f"RLIMIT_NOFILE of {row.comm} [{row.pid}]{where}: soft limit {limit}{failed}; it needed at least "
                f"{row.need} ({row.basis}); set it to {row.recommended} ({ways}).")
        if not pd.isna(row.maxsock) and soft is not None and row.maxsock > soft:
            text += (f" HAProxy sized itself for {int(row.maxsock)} descriptors (Maxsock) but was given {soft}: "
                     "raise the limit, or lower maxconn until Maxsock fits.")
        advice.append(text)
    return advice


#: The system table's extremes the advice reads, per host (its counters count since its own boot,
#: its limits are its own): the engine adds each host's rows up, only a row a host comes back.
#: Absent columns are NULL in every engine's view.
SYSTEM_EXTREMES = ("SELECT host, max(file_nr) AS file_nr, min(file_max) AS file_max, "
                   "max(listen_overflows) - min(listen_overflows) AS listen_overflows, "
                   "max(listen_drops) - min(listen_drops) AS listen_drops, min(somaxconn) AS somaxconn "
                   "FROM system GROUP BY host ORDER BY host")


def system_advice(engine: Engine) -> list[str]:
    """The system's lines: fs.file-max (``advice.fixes.file_max_change``) of the host whose file
    table came fullest, and the listen queues (``listen_advice``), the same in the report and
    ``info``. A fleet's line names its host."""
    extremes = engine.query(SYSTEM_EXTREMES)
    several = len(extremes) > 1
    advice = []
    tables = extremes[extremes["file_nr"].notna() & extremes["file_max"].notna() & (extremes["file_max"] > 0)]
    if len(tables):
        fullest = tables.loc[(tables["file_nr"] / tables["file_max"]).idxmax()]
        change = file_max_change(int(fullest["file_nr"]), int(fullest["file_max"]))
        if change is not None:
            on = f" on {fullest['host']}" if several else ""
            advice.append(f"fs.file-max{on}: {change.reason}; set it to at least {change.value:,}: {change.command}.")
    listen = listen_advice(extremes, engine)
    if listen:
        advice.append(listen)
    return advice


def thread_advice(engine: Engine, fullest: pd.DataFrame | None = None) -> list[str]:
    """The thread limits' lines (``advice.fixes``' changes): each process near the limit binding
    its threads, then each Go program that exceeded its own (said once: by the runtime's message,
    not again by its peak at that limit); the same in the report and ``info``. ``fullest``: the
    processes' least thread headroom (``least_headroom_on(engine, resource="threads")``) when the
    caller has it already."""
    said = engine.query(f"SELECT DISTINCT host, pid FROM {engine.derived('rare_events')} "
                        "WHERE kind = 'go_thread_limit'")
    exceeded = {(str(r.host), int(r.pid)) for r in said.itertuples()}
    return _thread_advice(engine, exceeded, fullest) + go_limit_advice(engine)


def listen_advice(extremes: pd.DataFrame, engine: Engine) -> str | None:
    """One line when a listen queue overflowed during the recording (``extremes``: the rows of
    :data:`SYSTEM_EXTREMES`, each host's counters grown on their own and added up); when a
    listener was failing accept() with EMFILE then, the overflow was its symptom and the FD limit
    is the fix."""
    grew = {name: int(extremes[column].sum()) for column, name in (("listen_overflows", "ListenOverflows"),
                                                                   ("listen_drops", "ListenDrops"))
            if extremes[column].notna().any() and extremes[column].sum() > 0}
    if not grew:
        return None
    hosts = extremes[(extremes["listen_overflows"].fillna(0) > 0) | (extremes["listen_drops"].fillna(0) > 0)]
    on = f" on {', '.join(str(h) for h in hosts['host'])}" if len(extremes) > 1 else ""
    moved = " and ".join(f"TcpExt {name} grew by {count:,}" for name, count in grew.items()) + on
    refused = engine.query(f"SELECT comm, pid, CAST(sum(n) AS BIGINT) AS n FROM {engine.derived('fd_failures')} "
                           "WHERE kind = 'accept' GROUP BY comm, pid ORDER BY n DESC, pid LIMIT 3")
    somaxconn = int(extremes["somaxconn"].min()) if extremes["somaxconn"].notna().any() else None
    if len(refused):
        who = ", ".join(f"{r.comm} [{r.pid}] ({r.n:,} times)" for r in refused.itertuples())
        return f"Listen queues: {moved} during the recording; {listen_fix(who, somaxconn)}."
    return f"net.core.somaxconn: {moved} during the recording; {listen_fix(None, somaxconn)}."


def go_limit_advice(engine: Engine) -> list[str]:
    """A line per Go program that said it exceeded its thread limit (the runtime's own message:
    the only place a limit set by debug.SetMaxThreads shows)."""
    said = engine.query("SELECT host, pid, min(comm) AS comm, max(ret) AS thread_limit "
                        f"FROM {engine.derived('rare_events')} WHERE kind = 'go_thread_limit' "
                        "GROUP BY host, pid ORDER BY host, pid")
    lines = []
    for r in said.itertuples():
        change = None if pd.isna(r.thread_limit) else go_exceeded_change(int(r.thread_limit))
        lines.append(f"Go thread limit of {r.comm} [{r.pid}]: the runtime said {go_said(r.thread_limit)} and the "
                     "program exited 2 (its limit, from debug.SetMaxThreads or Go's default 10000, is read from that "
                     f"message only); {change.command if change is not None else GO_THREADS_ADVICE}.")
    return lines


def _thread_advice(engine: Engine, exceeded: set[tuple[str, int]] | None = None,
                   fullest: pd.DataFrame | None = None) -> list[str]:
    """A line per process whose threads came within 20 % of the limit binding them."""
    if fullest is None:
        fullest = headroom_module.least_headroom_on(engine, resource="threads")
    named = pd.Series([isinstance(k, str) for k in fullest["thread_limit_kind"]], index=fullest.index, dtype=bool)
    fullest = fullest[named & (fullest["thread_usage"] >= USAGE_WARN)]
    if exceeded:  # a Go program that said it exceeded its limit: go_limit_advice's line says it
        said = pd.Series([(str(h), int(p)) in exceeded and k in GO_THREAD_LIMITS for h, p, k in
                          zip(fullest["host"], fullest["pid"], fullest["thread_limit_kind"], strict=True)],
                         index=fullest.index, dtype=bool)
        fullest = fullest[~said]
    units = _units(engine, fullest[fullest["thread_limit_kind"] == "cgroup pids.max"])
    advice = []
    for row in fullest.itertuples():
        change = thread_change(row.thread_limit_kind, int(row.thread_count), int(row.thread_limit),
                               units.get((str(row.host), int(row.pid))))
        counted = THREADS_COUNTED[row.thread_limit_kind]
        advice.append(f"{row.thread_limit_kind} of {row.comm} [{row.pid}]: peak {row.thread_count:.0f} {counted} of "
                      f"{row.thread_limit:.0f}; " + (f"{change.command}." if change is not None else
                                                     "the limit in force holds it with the margin."))
    return advice


def _units(engine: Engine, rows: pd.DataFrame) -> dict[tuple[str, int], str]:
    """The systemd unit of each of these processes (host, pid), where its samples name one."""
    if rows.empty or "unit" not in engine.columns("samples"):
        return {}
    pids = ", ".join(str(int(p)) for p in sorted(set(rows["pid"])))
    found = engine.query(f"SELECT host, pid, max(unit) AS unit FROM samples WHERE pid IN ({pids}) AND unit IS NOT NULL "
                         "GROUP BY host, pid")
    return {(str(r.host), int(r.pid)): str(r.unit) for r in found.itertuples()}
