"""What each process needed of its FD limit, from what it asked for: the one recommendation per
process that both ``fdtrace doctor --from`` and the report give.

Processes that no sample saw (they lived less than a round) are here from their events: a
failure of theirs (EMFILE, ENFILE, an OOM kill, Go's thread limit) puts them in.

A process that failed with EMFILE never shows its need: its open FDs stop at the limit. What it
asked for is known from the refused calls themselves (in its worst second, that many more
descriptors were wanted at once than the table held) and, for HAProxy, from ``show info``'s
Maxsock (the descriptors its maxconn and listeners take). The need is the largest of these and
the peak; the recommendation adds the usual margin to it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from fdtrace.advice.needs import need_of as need_of  # the one needs model, shared with the view and doctor
from fdtrace.analysis.engines import Engine
from fdtrace.analysis.engines.dataset import engine_for
from fdtrace.analysis.limits import ByProcess, limit_changes_on, limit_in_force, name_inherited_sources
from fdtrace.policy import with_margin

if TYPE_CHECKING:
    from fdtrace.analysis.engines.dataset import Analyzable

NEED_COLUMNS = ["host", "pid", "start_ns", "comm", "fd_soft_limit", "fd_hard_limit", "peak_fds", "emfile",
                "emfile_worst_second", "maxsock", "need", "basis", "recommended", "limit_source", "limit_config"]

# A process's name is the one it failed under when it failed, else its newest sample's (a sample
# may have been taken before it named itself: between its exec and its prctl). A process whose start
# time could not be read (gone before /proc was) is one by its NULL start_ns: joined as equal.
_PER_PROCESS = """
WITH named AS (SELECT host, pid, start_ns, comm, open_fds, fd_soft_limit, fd_hard_limit,
                      row_number() OVER (PARTITION BY host, pid, start_ns ORDER BY ts_ns DESC) AS newest
               FROM samples),
used AS (SELECT host, pid, start_ns, max(CASE WHEN newest = 1 THEN comm END) AS comm, max(open_fds) AS peak_fds,
                max(fd_soft_limit) AS fd_soft_limit, max(fd_hard_limit) AS fd_hard_limit
         FROM named GROUP BY host, pid, start_ns),
per_second AS (SELECT host, pid, start_ns, min(comm) AS comm, second, CAST(sum(n) AS BIGINT) AS n
               FROM FD_FAILURES WHERE errno = 'EMFILE' GROUP BY host, pid, start_ns, second),
refused AS (SELECT host, pid, start_ns, min(comm) AS comm, sum(n) AS emfile, max(n) AS emfile_worst_second
            FROM per_second GROUP BY host, pid, start_ns),
asked AS (SELECT host, haproxy_pid AS pid,
                 max(CASE WHEN source IS NULL OR source <> 'configuration' THEN maxsock END) AS info_maxsock,
                 max(CASE WHEN source = 'configuration' THEN maxsock END) AS config_maxsock,
                 max(CASE WHEN source = 'configuration' THEN ulimit_n END) AS config_ulimit_n,
                 max(CASE WHEN source = 'configuration' AND ulimit_n IS NOT NULL THEN socket END) AS config_path
          FROM haproxy WHERE haproxy_pid IS NOT NULL AND maxsock IS NOT NULL GROUP BY host, haproxy_pid),
failed AS (SELECT host, pid, start_ns, min(comm) AS comm
           FROM (SELECT host, pid, start_ns, comm FROM RARE_EVENTS WHERE kind IN ('go_thread_limit', 'oom_kill')
                 UNION ALL SELECT host, pid, start_ns, comm FROM FD_FAILURES WHERE errno = 'ENFILE') AS ended
           GROUP BY host, pid, start_ns),
known AS (SELECT host, pid, start_ns FROM used UNION SELECT host, pid, start_ns FROM refused
          UNION SELECT host, pid, start_ns FROM failed)
SELECT k.host, k.pid, k.start_ns, coalesce(r.comm, f.comm, u.comm) AS comm, u.fd_soft_limit, u.fd_hard_limit,
       u.peak_fds, coalesce(r.emfile, 0) AS emfile, coalesce(r.emfile_worst_second, 0) AS emfile_worst_second,
       coalesce(a.info_maxsock, a.config_maxsock) AS maxsock,
       CASE WHEN a.info_maxsock IS NULL AND a.config_maxsock IS NOT NULL THEN 'configuration' END AS maxsock_from,
       a.config_ulimit_n, a.config_path
FROM known AS k
LEFT JOIN used AS u ON k.host = u.host AND k.pid = u.pid AND k.start_ns IS NOT DISTINCT FROM u.start_ns
LEFT JOIN refused AS r ON k.host = r.host AND k.pid = r.pid AND k.start_ns IS NOT DISTINCT FROM r.start_ns
LEFT JOIN failed AS f ON k.host = f.host AND k.pid = f.pid AND k.start_ns IS NOT DISTINCT FROM f.start_ns
LEFT JOIN asked AS a ON k.host = a.host AND k.pid = a.pid
"""


def fd_needs_on(engine: Engine) -> pd.DataFrame:
    """``fd_needs()`` computed by ``engine``."""
    sql = _PER_PROCESS.replace("FD_FAILURES", engine.derived("fd_failures"))
    sql = sql.replace("RARE_EVENTS", engine.derived("rare_events"))
    found = engine.query(sql).copy()  # written below: an engine's frame may be read-only (Spark's Arrow)
    if found.empty:
        return pd.DataFrame(columns=NEED_COLUMNS)
    found["limit_source"] = None
    # the configuration that set the limit in force: an haproxy's ulimit-n equal to its soft limit
    found["limit_config"] = [str(r.config_path) if isinstance(r.config_path, str) and not pd.isna(r.config_ulimit_n)
                             and not pd.isna(r.fd_soft_limit) and int(r.config_ulimit_n) == int(r.fd_soft_limit)
                             else None for r in found.itertuples()]
    changes = limit_changes_on(engine)  # read once: the limit in force and where each came from
    _judge_by_the_limit_in_force(engine, found, changes)
    name_inherited_sources(engine, found, changes)
    needs = [need_of(r.fd_soft_limit, r.peak_fds, int(r.emfile), int(r.emfile_worst_second), r.maxsock,
                     source=r.limit_source, maxsock_from=r.maxsock_from) for r in found.itertuples()]
    found["need"] = [n for n, _ in needs]
    found["basis"] = [b for _, b in needs]
    found["recommended"] = [with_margin(n) for n in found["need"]]
    for column in ("pid", "emfile", "emfile_worst_second", "need", "recommended"):
        found[column] = found[column].astype("int64")
    order = found.assign(share=found["need"] / found["fd_soft_limit"].astype("float64"))
    order = order.sort_values(["emfile", "share", "host", "pid"], ascending=[False, False, True, True],
                              na_position="last")
    return order[NEED_COLUMNS].reset_index(drop=True)


def _judge_by_the_limit_in_force(engine: Engine, found: pd.DataFrame, changes: pd.DataFrame) -> None:
    """For each process that failed with EMFILE, its soft limit as it was in its worst second (a
    process may have lowered its own limit, or had it lowered, after its first samples), and
    where that limit came from, in place of the highest limit its samples saw. The worst seconds
    and the last samples before them are found for all processes at once (a fleet has thousands
    that failed); only a process whose limit was changed is looked at on its own."""
    failing = found[found["emfile"] > 0]
    if failing.empty:
        return
    pids = ", ".join(str(int(p)) for p in sorted(set(failing["pid"])))
    seconds = engine.query(
        "SELECT host, pid, start_ns, second, CAST(sum(n) AS BIGINT) AS n, min(first_ns) AS first_ns "
        f"FROM {engine.derived('fd_failures')} WHERE errno = 'EMFILE' AND pid IN ({pids}) "
        "GROUP BY host, pid, start_ns, second")
    samples = engine.query(f"SELECT host, pid, time_ns, fd_soft_limit FROM samples WHERE pid IN ({pids})")
    if not len(changes) and seconds.empty:
        return
    worst = _worst_seconds(failing, seconds)
    last = _last_samples(samples, failing, worst)
    changed = {(str(r.host), int(r.target)) for r in changes.itertuples()} if len(changes) else set()
    samples_of = ByProcess(samples) if changed else None
    for index, at_ns in worst.items():
        host, pid = str(found.at[index, "host"]), int(found.at[index, "pid"])
        if samples_of is not None and (host, pid) in changed:
            soft, source = limit_in_force(changes, samples_of(host, pid), host, pid, at_ns)
        else:  # no change of its limit was traced: the last sample before its worst second says
            soft, source = last.get(index), None
        if soft is not None:
            found.at[index, "fd_soft_limit"] = soft
        found.at[index, "limit_source"] = source


def _worst_seconds(failing: pd.DataFrame, seconds: pd.DataFrame) -> dict[object, int]:
    """By row of ``failing``: the time of the first EMFILE of its worst second (the most, the
    earliest of equals), from the rows of ``seconds`` of its host and pid and, where it has one,
    its start time. Processes without such rows are left out."""
    keys = pd.DataFrame({"row": failing.index, "host": failing["host"].astype(str).to_numpy(),
                         "pid": failing["pid"].astype("int64").to_numpy(), "start_ns": failing["start_ns"].to_numpy()})
    rows = seconds.assign(host=seconds["host"].astype(str), pid=seconds["pid"].astype("int64"))
    both = keys.merge(rows, on=["host", "pid"], suffixes=("", "_failed"))
    both = both[both["start_ns"].isna() | (both["start_ns_failed"] == both["start_ns"])]
    both = both.sort_values(["row", "n", "second"], ascending=[True, False, True], kind="stable")
    first = both.drop_duplicates("row")
    return {row: int(at) for row, at in zip(first["row"], first["first_ns"], strict=True)}


def _last_samples(samples: pd.DataFrame, failing: pd.DataFrame, worst: dict[object, int]) -> dict[object, int]:
    """By row of ``failing`` in ``worst``: the soft limit of its host and pid's last sample at or
    before that time, where there is one and it says."""
    known = samples[samples["time_ns"].notna()]
    if not worst or known.empty:
        return {}
    rows = list(worst)
    probe = pd.DataFrame({"row": rows, "host": failing.loc[rows, "host"].astype(str).to_numpy(),
                          "pid": failing.loc[rows, "pid"].astype("int64").to_numpy(),
                          "at_ns": [worst[row] for row in rows]}).sort_values("at_ns", kind="stable")
    known = known.assign(host=known["host"].astype(str), pid=known["pid"].astype("int64"),
                         time_ns=known["time_ns"].astype("int64")).sort_values("time_ns", kind="stable")
    matched = pd.merge_asof(probe, known[["host", "pid", "time_ns", "fd_soft_limit"]], left_on="at_ns",
                            right_on="time_ns", by=["host", "pid"], direction="backward")
    return {row: int(soft) for row, soft in zip(matched["row"], matched["fd_soft_limit"], strict=True)
            if pd.notna(soft)}


def fd_needs(recording: Analyzable) -> pd.DataFrame:
    """Per process (host, pid, start_ns): its FD limits, peak, EMFILE failures (all, and in its
    worst second), HAProxy's Maxsock where recorded, the ``need`` and its ``basis``, and the
    ``recommended`` soft limit (the need with the margin). Processes that failed come first."""
    with engine_for(recording) as engine:
        return fd_needs_on(engine)


def rehearsed_need(idle_fds: int, fds_per_connection: float, connections: int) -> tuple[int, str]:
    """(descriptors needed, why) for a process to hold ``connections`` at once, from what
    ``fdtrace rehearse`` measured of it: the descriptors it held idle plus the descriptors each
    connection took (the slope of its open descriptors against the connections it held)."""
    need = idle_fds + math.ceil(fds_per_connection * connections - 1e-9)
    return need, (f"{connections} connections at {fds_per_connection:.2f} descriptors each and {idle_fds} held idle, "
                  "as rehearsed")
