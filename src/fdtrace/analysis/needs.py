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
from typing import Any

import pandas as pd

from fdtrace.analysis.engines import Engine
from fdtrace.analysis.engines.dataset import engine_for
from fdtrace.policy import with_margin

NEED_COLUMNS = ["host", "pid", "start_ns", "comm", "fd_soft_limit", "fd_hard_limit", "peak_fds", "emfile",
                "emfile_worst_second", "maxsock", "need", "basis", "recommended"]

_PER_PROCESS = """
WITH used AS (SELECT host, pid, start_ns, min(comm) AS comm, max(open_fds) AS peak_fds,
                     max(fd_soft_limit) AS fd_soft_limit, max(fd_hard_limit) AS fd_hard_limit
              FROM samples GROUP BY host, pid, start_ns),
per_second AS (SELECT host, pid, start_ns, min(comm) AS comm, time_ns // 1000000000 AS second, count(*) AS n
               FROM events WHERE errno = 'EMFILE' GROUP BY host, pid, start_ns, time_ns // 1000000000),
refused AS (SELECT host, pid, start_ns, min(comm) AS comm, sum(n) AS emfile, max(n) AS emfile_worst_second
            FROM per_second GROUP BY host, pid, start_ns),
asked AS (SELECT host, haproxy_pid AS pid, max(maxsock) AS maxsock FROM haproxy
          WHERE haproxy_pid IS NOT NULL AND maxsock IS NOT NULL GROUP BY host, haproxy_pid),
failed AS (SELECT host, pid, start_ns, min(comm) AS comm FROM events
           WHERE kind IN ('go_thread_limit', 'oom_kill') OR errno = 'ENFILE' GROUP BY host, pid, start_ns),
known AS (SELECT host, pid, start_ns FROM used UNION SELECT host, pid, start_ns FROM refused
          UNION SELECT host, pid, start_ns FROM failed)
SELECT k.host, k.pid, k.start_ns, coalesce(u.comm, r.comm, f.comm) AS comm, u.fd_soft_limit, u.fd_hard_limit,
       u.peak_fds, coalesce(r.emfile, 0) AS emfile, coalesce(r.emfile_worst_second, 0) AS emfile_worst_second,
       a.maxsock
FROM known AS k
LEFT JOIN used AS u ON k.host = u.host AND k.pid = u.pid AND k.start_ns = u.start_ns
LEFT JOIN refused AS r ON k.host = r.host AND k.pid = r.pid AND k.start_ns = r.start_ns
LEFT JOIN failed AS f ON k.host = f.host AND k.pid = f.pid AND k.start_ns = f.start_ns
LEFT JOIN asked AS a ON k.host = a.host AND k.pid = a.pid
"""


def need_of(soft: Any, peak: Any, emfile: int, worst_second: int, maxsock: Any,
            config_need: int | None = None) -> tuple[int, str]:
    """(descriptors needed, why) from what one process used and asked for."""
    known = [] if pd.isna(peak) else [(int(peak), f"peak {int(peak)} open")]
    if emfile and not pd.isna(soft):
        known.append((int(soft) + int(worst_second), f"its limit {int(soft)} plus the {int(worst_second)} opens "
                                                     f"refused with EMFILE in its worst second"))
    if not pd.isna(maxsock):
        known.append((int(maxsock), f"HAProxy's Maxsock {int(maxsock)} (show info)"))
    if config_need is not None:
        known.append((config_need, f"its maxconn needs ~{config_need}"))
    if not known:
        return 0, "nothing recorded"
    return max(known, key=lambda item: item[0])


def fd_needs_on(engine: Engine) -> pd.DataFrame:
    """``fd_needs()`` computed by ``engine``."""
    found = engine.query(_PER_PROCESS)
    if found.empty:
        return pd.DataFrame(columns=NEED_COLUMNS)
    needs = [need_of(r.fd_soft_limit, r.peak_fds, int(r.emfile), int(r.emfile_worst_second), r.maxsock)
             for r in found.itertuples()]
    found["need"] = [n for n, _ in needs]
    found["basis"] = [b for _, b in needs]
    found["recommended"] = [with_margin(n) for n in found["need"]]
    for column in ("pid", "emfile", "emfile_worst_second", "need", "recommended"):
        found[column] = found[column].astype("int64")
    order = found.assign(share=found["need"] / found["fd_soft_limit"].astype("float64"))
    order = order.sort_values(["emfile", "share", "host", "pid"], ascending=[False, False, True, True],
                              na_position="last")
    return order[NEED_COLUMNS].reset_index(drop=True)


def fd_needs(recording: Any) -> pd.DataFrame:
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
