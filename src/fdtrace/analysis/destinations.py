"""Where processes connected to: connect() calls by destination, with their failures."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fdtrace.schema import NOT_FAILURES

COLUMNS = ["host", "comm", "pid", "peer_addr", "peer_port", "calls", "failed", "errors", "first", "last"]


def destinations(recording: Any) -> pd.DataFrame:
    """One row per (process, destination address and port) of connect() calls, most failures
    first. See ``fdtrace.analysis.destinations`` for the columns."""
    events = recording.events if hasattr(recording, "events") else recording
    if events.empty:
        return pd.DataFrame(columns=COLUMNS)
    if "peer_port" not in events.columns:
        raise ValueError("destinations() needs the events' peer_addr and peer_port: load them (load(columns=...))")
    connects = events[(events["kind"] == "connect") & events["peer_port"].notna()].copy()
    if connects.empty:
        return pd.DataFrame(columns=COLUMNS)
    connects["errno"] = connects["errno"].astype(str)
    connects["failed"] = ~connects["errno"].isin(NOT_FAILURES)
    keys = ["host", "comm", "pid", "peer_addr", "peer_port"]
    for key in ("host", "comm", "peer_addr"):
        connects[key] = connects[key].astype(str)
    grouped = connects.groupby(keys, sort=False)
    table = grouped.agg(calls=("kind", "size"), failed=("failed", "sum"), first=("time", "min"),
                        last=("time", "max")).reset_index()
    failures = connects[connects["failed"]]
    errors = failures.groupby(keys, sort=False)["errno"].value_counts()
    by_key: dict[tuple[Any, ...], dict[str, int]] = {}
    for (*key, errno), count in errors.items():
        by_key.setdefault(tuple(key), {})[errno] = int(count)
    table["errors"] = [by_key.get(tuple(row), {}) for row in table[keys].itertuples(index=False)]
    table["peer_port"] = table["peer_port"].astype(int)
    table = table.sort_values(["failed", "calls"], ascending=False, kind="stable", ignore_index=True)
    return table[COLUMNS]
