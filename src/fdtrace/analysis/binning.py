"""Event counts per time bin."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fdtrace.analysis.engines import Engine, quote
from fdtrace.analysis.engines.dataset import engine_for


def events_of(recording_or_events: Any) -> pd.DataFrame:
    """The events DataFrame of a Recording, or the DataFrame itself."""
    return getattr(recording_or_events, "events", recording_or_events)


def in_list(column: str, values: str | list[str] | None) -> str | None:
    """``column IN (...)`` of one value or several; None for no condition."""
    if values is None:
        return None
    chosen = [values] if isinstance(values, str) else list(values)
    return f'"{column}" IN ({", ".join(quote(v) for v in chosen)})' if chosen else "false"


def where(*conditions: str | None) -> str:
    """A WHERE clause of the conditions that are not None (empty when none is)."""
    kept = [f"({c})" for c in conditions if c]
    return f"WHERE {' AND '.join(kept)}" if kept else ""


def bin_width_ns(freq: str) -> int:
    """The width of a fixed pandas frequency (``"1s"``, ``"100ms"``, ``"1min"``) in ns."""
    try:
        width = pd.Timedelta(pd.tseries.frequencies.to_offset(freq)).value
    except (ValueError, TypeError):
        raise ValueError(f"freq {freq!r}: give a fixed bin width such as '1s', '100ms' or '1min'") from None
    if width <= 0:
        raise ValueError(f"freq {freq!r}: the bin width must be positive")
    return int(width)


def rates_on(engine: Engine, kind: str | list[str] | None = None, freq: str = "1s", by: str | None = "comm",
             errno: str | list[str] | None = None) -> pd.DataFrame:
    """``rates()`` computed by ``engine``."""
    width = bin_width_ns(freq)
    if by is not None and by not in engine.columns("events"):
        raise ValueError(f"rates(by={by!r}): the events have no such column")
    group = "" if by is None else f', CAST("{by}" AS VARCHAR) AS grp'
    condition = where(in_list("kind", kind), in_list("errno", errno), "time_ns IS NOT NULL",
                      None if by is None else f'"{by}" IS NOT NULL')
    counted = engine.query(f"SELECT time_ns // {width} AS bin{group}, count(*) AS n FROM events {condition} "
                           f"GROUP BY {'1' if by is None else '1, 2'}")
    if counted.empty:
        return pd.DataFrame(index=pd.DatetimeIndex([], tz="UTC", name="time"))
    counted["bin"] = counted["bin"].astype("int64")
    bins = range(int(counted["bin"].min()), int(counted["bin"].max()) + 1)
    if by is None:
        counts = counted.set_index("bin")[["n"]].rename(columns={"n": "count"})
    else:
        counts = counted.pivot_table(index="bin", columns="grp", values="n", aggfunc="sum", fill_value=0)
        counts = counts[sorted(counts.columns, key=str)]
        counts.columns = pd.Index([str(c) for c in counts.columns])
    counts = counts.reindex(bins, fill_value=0).astype("int64")
    counts.index = pd.DatetimeIndex(pd.to_datetime([b * width for b in bins], unit="ns", utc=True), name="time")
    counts.columns.name = by
    return counts


def rates(recording_or_events: Any, kind: str | list[str] | None = None, freq: str = "1s",
          by: str | None = "comm", errno: str | list[str] | None = None) -> pd.DataFrame:
    """Counts of events per time bin. See ``fdtrace.analysis`` for the full description."""
    with engine_for(recording_or_events) as engine:
        return rates_on(engine, kind=kind, freq=freq, by=by, errno=errno)
