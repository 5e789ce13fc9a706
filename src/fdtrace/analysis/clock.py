"""One clock for a fleet: the offsets between the hosts' wall clocks, from the TCP connections
the recorded hosts made with each other.

A connection from host A to host B is recorded twice: A's ``client`` row when the SYN-ACK
arrived (A's clock), then B's ``server`` row when A's final ACK arrived (B's clock). The second
truly happened after the first, so B's clock minus A's is at most ``server_ns - client_ns``. A
connection from B to A bounds the same difference from below. The tightest bounds of each
direction give a pair of hosts an interval, its middle the offset and its half-width the
uncertainty; hosts are put on the clock of a reference host along the chain of pairs with the
least uncertainty, the uncertainties adding up along it.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
import pandas as pd

from fdtrace.analysis.engines import Engine

#: Pairs whose difference lies further than this from their host pair's median are another use
#: of the same addresses and ports (a port reused later), not the same connection.
SAME_CONNECTION_NS = 5_000_000_000

OFFSET_COLUMNS = ["host", "offset_ns", "uncertainty_ns", "pairs", "reference", "via"]

_PAIRS_SQL = """
SELECT c.host AS client_host, s.host AS server_host, c.time_ns AS client_ns, s.time_ns AS server_ns,
       c.local_addr AS client_addr, c.local_port AS client_port, s.local_addr AS server_addr,
       s.local_port AS server_port
FROM connections AS c JOIN connections AS s
  ON c.local_addr = s.remote_addr AND c.local_port = s.remote_port
 AND c.remote_addr = s.local_addr AND c.remote_port = s.local_port AND c.host <> s.host
WHERE c.role = 'client' AND s.role = 'server'
"""


def connection_pairs(engine: Engine) -> pd.DataFrame:
    """Each connection seen as a client on one recorded host and as a server on another:
    ``client_host``, ``server_host``, ``client_ns`` and ``server_ns`` (each on its own host's
    clock), ``difference_ns`` (server - client), and the addresses and ports."""
    if not {"role", "local_addr"} <= engine.columns("connections"):
        return pd.DataFrame(columns=["client_host", "server_host", "client_ns", "server_ns", "difference_ns"])
    pairs = engine.query(_PAIRS_SQL)
    pairs["difference_ns"] = pairs["server_ns"].astype("int64") - pairs["client_ns"].astype("int64")
    if pairs.empty:
        return pairs
    hosts = ["client_host", "server_host"]
    centre = pairs.groupby(hosts, sort=False)["difference_ns"].transform("median")
    distance = (pairs["difference_ns"] - centre).abs()
    near = pairs.assign(distance=distance)[distance < SAME_CONNECTION_NS]
    # A client row reused by several server rows (ports reused): its closest match only.
    near = near.sort_values([*hosts, "distance"], kind="stable")
    return near.drop_duplicates([*hosts, "client_ns", "client_addr", "client_port"]).drop(columns="distance") \
        .reset_index(drop=True)


def host_offsets(engine: Engine, reference: str | None = None) -> pd.DataFrame:
    """Each recorded host's clock offset from the reference host's.

    Returns:
        One row per host that connections tie to the reference (the reference first):
        ``offset_ns`` (how far its wall clock is ahead of the reference's: subtract it from its
        times), ``uncertainty_ns`` (the true offset is within this of ``offset_ns``), ``pairs``
        (the connection pairs the estimate rests on), ``reference`` and ``via`` (the hosts
        whose pairs chain it to the reference). Empty when no two hosts connected both ways.
        The reference is the host with the most pairs unless given.
    """
    pairs = connection_pairs(engine)
    if pairs.empty:
        return pd.DataFrame(columns=OFFSET_COLUMNS)
    bounds = pairs.groupby(["client_host", "server_host"]).agg(bound=("difference_ns", "min"),
                                                               n=("difference_ns", "size"))
    # edges[a][b] = (offset of b relative to a, half-width, pairs)
    edges: dict[str, dict[str, tuple[float, float, int]]] = {}
    for (a, b), row in bounds.iterrows():
        if (b, a) not in bounds.index or a > b:
            continue
        upper = float(row["bound"])  # clock(b) - clock(a) <= upper
        lower = -float(bounds.loc[(b, a), "bound"])  # clock(b) - clock(a) >= lower
        middle, half = (upper + lower) / 2, abs(upper - lower) / 2
        count = int(row["n"]) + int(bounds.loc[(b, a), "n"])
        edges.setdefault(a, {})[b] = (middle, half, count)
        edges.setdefault(b, {})[a] = (-middle, half, count)
    if not edges:
        return pd.DataFrame(columns=OFFSET_COLUMNS)
    if reference is None or reference not in edges:
        reference = max(sorted(edges), key=lambda h: sum(e[2] for e in edges[h].values()))
    found: dict[str, tuple[float, float, int, list[str]]] = {}
    queue: list[tuple[float, str, float, int, list[str]]] = [(0.0, reference, 0.0, 0, [])]
    while queue:
        half, host, offset, count, path = heapq.heappop(queue)
        if host in found:
            continue
        found[host] = (offset, half, count, path)
        for other, (step, step_half, step_count) in edges[host].items():
            if other not in found:
                heapq.heappush(queue, (half + step_half, other, offset + step, step_count, [*path, host]))
    rows = [{"host": host, "offset_ns": int(np.rint(offset)), "uncertainty_ns": int(np.ceil(half)), "pairs": count,
             "reference": host == reference, "via": " > ".join(path[1:])}
            for host, (offset, half, count, path) in found.items()]
    return pd.DataFrame(rows, columns=OFFSET_COLUMNS)


def corrections(offsets: pd.DataFrame | None) -> dict[str, int]:
    """What to subtract from each host's times: its offset (hosts without one: nothing)."""
    if offsets is None or offsets.empty:
        return {}
    return {str(r.host): int(r.offset_ns) for r in offsets.itertuples() if int(r.offset_ns)}


def time_shifts(hosts: Any, shifts: dict[str, int]) -> np.ndarray:
    """What to subtract from each row's times, from its host (``hosts``: a column of host names):
    the clock correction, written once for the loaded tables, the footer summaries and replay."""
    found: np.ndarray = pd.Series(hosts).astype(str).map(shifts).fillna(0).astype("int64").to_numpy()
    return found


def corrected(frames: dict[str, Any], shifts: dict[str, int]) -> dict[str, Any]:
    """DataFrames of a loaded recording with each host's ``time`` moved onto the reference clock."""
    if not shifts:
        return frames
    moved = {}
    for table, frame in frames.items():
        if isinstance(frame, pd.DataFrame) and "time" in frame.columns and "host" in frame.columns and len(frame):
            delta = time_shifts(frame["host"], shifts)
            frame = frame.assign(time=frame["time"] - pd.to_timedelta(delta, unit="ns"))
            frame = frame.sort_values("time", kind="stable", ignore_index=True)
        moved[table] = frame
    return moved


def corrected_part(table: Any, host: str, shifts: dict[str, int]) -> Any:
    """One host's rows as a ``pyarrow.Table`` (what replay reads) with ``time`` moved onto the
    reference clock, as ``corrected`` moves a loaded table's."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table is None or "time" not in table.column_names or not table.num_rows:
        return table
    delta = int(time_shifts([host], shifts)[0])
    if not delta:
        return table
    column = table["time"]
    moved = pc.subtract(column.cast(pa.int64()), pa.scalar(delta, pa.int64())).cast(column.type)
    return table.set_column(table.column_names.index("time"), "time", moved)
