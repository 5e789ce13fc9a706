"""Which code holds the descriptors and makes the threads (recordings made with --stacks)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fdtrace.schema.site_names import site_name, thread_reason, to_thread_start

LEAK_COLUMNS = ["host", "pid", "comm", "site", "open", "opened", "closed", "oldest_age_s", "growth_per_min",
                "stack_id", "frames", "truncated"]
LEAK_TYPES = {"host": "string", "pid": "Int64", "comm": "string", "site": "string", "open": "Int64", "opened": "Int64",
              "closed": "Int64", "oldest_age_s": "Float64", "growth_per_min": "Float64", "stack_id": "Int64"}


def _host_column(frame: pd.DataFrame) -> pd.Series:
    if "host" in frame.columns:
        return frame["host"].astype(str)
    return pd.Series([""] * len(frame), index=frame.index)


def leaks(fd_sites: pd.DataFrame, stacks: pd.DataFrame | None, end_ns: int | None = None, window_s: float = 60.0,
          pid: int | None = None) -> pd.DataFrame:
    """Open descriptors per process and call site at the end of a recording.

    Args:
        fd_sites: the ``fd_sites`` table (rows written when a site's figures changed).
        stacks: the ``stacks`` table.
        end_ns: CLOCK_MONOTONIC ns of the end (the last row's time when None).
        window_s: growth is the change of the open count over this much time before the end (or
            since the first row, when the recording is shorter), per minute.
        pid: only this process.

    Returns:
        One row per site still holding descriptors, most open first: ``site`` (its first frame
        outside libc), ``open``, ``opened`` and ``closed`` since tracing began, ``oldest_age_s``,
        ``growth_per_min``, ``frames`` and ``truncated``. Descriptors older than the tracing are
        one row whose site is "(from before tracing)". Sites whose descriptors were all closed
        (they balance out) are not listed.
    """
    if fd_sites is None or not len(fd_sites):
        return pd.DataFrame(columns=LEAK_COLUMNS)
    sites = fd_sites.copy()
    sites["host"] = _host_column(sites)
    if pid is not None:
        sites = sites[sites["pid"] == pid]
        if not len(sites):
            return pd.DataFrame(columns=LEAK_COLUMNS)
    end = int(end_ns if end_ns is not None else sites["ts_ns"].max())
    start = int(sites["ts_ns"].min())
    window_ns = int(min(window_s * 1e9, max(end - start, 0)))
    sites["stack_key"] = sites["stack_id"].astype("Int64").fillna(0).astype("int64")
    sites = sites.sort_values("ts_ns", kind="stable")
    keys = ["host", "pid", "origin", "stack_key"]
    last = sites.groupby(keys, sort=False).tail(1).set_index(keys)
    earlier = sites[sites["ts_ns"] <= end - window_ns].groupby(keys, sort=False).tail(1).set_index(keys)
    before = earlier["open"].reindex(last.index).fillna(0)
    minutes = window_ns / 60e9
    growth = (last["open"] - before) / minutes if minutes > 0 else pd.Series(float("nan"), index=last.index)
    out = last.assign(growth_per_min=growth).reset_index()
    out = out[out["open"] > 0]
    frames: dict[tuple[str, int], tuple[Any, Any]] = {}
    if stacks is not None and len(stacks):
        stack_rows = stacks.assign(host=_host_column(stacks))
        for row in stack_rows.itertuples(index=False):
            frames[(row.host, int(row.stack_id))] = (list(row.frames), row.truncated)
    rows = []
    for row in out.itertuples(index=False):
        stack, truncated = frames.get((row.host, int(row.stack_key)), (None, None))
        if row.origin == "before_tracing":
            site = "(from before tracing)"
        elif stack is None:
            site = "(stack not kept)"
        else:
            site = site_name(stack)
        oldest = None if pd.isna(row.oldest_ns) else (end - int(row.oldest_ns)) / 1e9
        rows.append({"host": row.host, "pid": int(row.pid), "comm": row.comm, "site": site, "open": int(row.open),
                     "opened": None if pd.isna(row.opened) else int(row.opened),
                     "closed": None if pd.isna(row.closed) else int(row.closed),
                     "oldest_age_s": oldest, "growth_per_min": None if pd.isna(row.growth_per_min)
                     else float(row.growth_per_min),
                     "stack_id": None if row.origin == "before_tracing" else int(row.stack_key) or None,
                     "frames": stack or [], "truncated": truncated if isinstance(truncated, str) and truncated
                     else None})
    # Counts and stack ids stay integers where some are unknown (a stack id is 64 bits: through a
    # float it would lose its last digits); a stack that is whole, or none, is None, never NaN.
    result = pd.DataFrame({column: pd.array([row[column] for row in rows], dtype=LEAK_TYPES.get(column, "object"))
                           for column in LEAK_COLUMNS})
    before_tracing = result["site"] == "(from before tracing)"
    return pd.concat([result[~before_tracing].sort_values(["open", "pid"], ascending=[False, True], kind="stable"),
                      result[before_tracing]], ignore_index=True)


def thread_sites(events: pd.DataFrame, stacks: pd.DataFrame | None, pid: int | None = None) -> pd.DataFrame:
    """Threads started per process and creating call site (thread_start events with a stack).

    Returns one row per (host, pid, creating stack up to the creating thread's own start:
    ``schema.site_names.to_thread_start``): ``site``, the runtime's ``reason`` in words where its frames say
    (Go: a goroutine blocked in a syscall, a cgo call, ...), ``threads`` started there, ``first``
    and ``last`` start times, and the ``frames``; most threads first."""
    columns = ["host", "pid", "comm", "site", "reason", "threads", "first", "last", "stack_id", "frames"]
    if events is None or not len(events) or "stack_id" not in events.columns:
        return pd.DataFrame(columns=columns)
    started = events[(events["kind"] == "thread_start") & events["stack_id"].notna()]
    if pid is not None:
        started = started[started["pid"] == pid]
    if not len(started):
        return pd.DataFrame(columns=columns)
    started = started.assign(host=_host_column(started), stack_key=started["stack_id"].astype("Int64").astype("int64"))
    grouped = started.groupby(["host", "pid", "stack_key"], sort=False, observed=True).agg(
        comm=("comm", "last"), threads=("tid", "size"), first=("time", "min"), last=("time", "max")).reset_index()
    frames: dict[tuple[str, int], list[str]] = {}
    if stacks is not None and len(stacks):
        for row in stacks.assign(host=_host_column(stacks)).itertuples(index=False):
            frames[(row.host, int(row.stack_id))] = list(row.frames)
    grouped["frames"] = [to_thread_start(frames.get((h, int(s)), [])) for h, s in
                         zip(grouped["host"], grouped["stack_key"], strict=True)]
    # stacks that differ only past the creating thread's start (stale words) are one site
    grouped["key"] = [tuple(f) for f in grouped["frames"]]
    grouped = grouped.groupby(["host", "pid", "key"], sort=False, observed=True).agg(
        comm=("comm", "last"), threads=("threads", "sum"), first=("first", "min"), last=("last", "max"),
        stack_key=("stack_key", "first"), frames=("frames", "first")).reset_index()
    grouped["site"] = [site_name(f) if f else "(stack not kept)" for f in grouped["frames"]]
    grouped["reason"] = [thread_reason(f) for f in grouped["frames"]]
    grouped = grouped.rename(columns={"stack_key": "stack_id"})
    return grouped[columns].sort_values(["threads", "pid"], ascending=[False, True], kind="stable",
                                        ignore_index=True)


def thread_census(census: pd.DataFrame, pid: int | None = None) -> pd.DataFrame:
    """The ``thread_census`` table over time: one row per (time, process, syscall, fd kind, site)."""
    columns = ["time", "host", "pid", "comm", "syscall", "fd_kind", "site", "threads"]
    if census is None or not len(census):
        return pd.DataFrame(columns=columns)
    rows = census.assign(host=_host_column(census))
    if "site" not in rows.columns:
        rows = rows.assign(site=None)
    if pid is not None:
        rows = rows[rows["pid"] == pid]
    return rows[columns].sort_values(["time", "pid", "threads"], ascending=[True, True, False], kind="stable",
                                     ignore_index=True)
