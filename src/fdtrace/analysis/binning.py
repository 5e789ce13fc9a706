"""Event counts per time bin."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fdtrace.analysis.engines import Engine, quote
from fdtrace.analysis.engines.dataset import engine_for


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


def binned_counts(engine: Engine, freq: str = "1s", columns: tuple[str, ...] = (),
                  kind: str | list[str] | None = None, errno: str | list[str] | None = None) -> pd.DataFrame:
    """Events counted per time bin and per value of ``columns`` in one pass: ``bin`` (the bin's
    number: its start is ``bin * width`` ns), the columns (text), ``n``, and the ``first`` and
    ``last`` event's ``time_ns``. Several ``rates()`` of one recording come out of one such
    frame (``pivot_rates``)."""
    width = bin_width_ns(freq)
    present = engine.columns("events")
    missing = [c for c in columns if c not in present]
    if missing:
        raise ValueError(f"rates(by={missing[0]!r}): the events have no such column")
    groups = "".join(f', CAST("{c}" AS VARCHAR) AS "{c}"' for c in columns)
    condition = where(in_list("kind", kind), in_list("errno", errno), "time_ns IS NOT NULL")
    keys = ", ".join(str(i) for i in range(1, len(columns) + 2))
    counted = engine.query(f"SELECT time_ns // {width} AS bin{groups}, count(*) AS n, min(time_ns) AS first, "
                           f"max(time_ns) AS last FROM events {condition} GROUP BY {keys}")
    counted["bin"] = counted["bin"].astype("int64")
    counted.attrs["width_ns"] = width
    return counted


def pivot_rates(counted: pd.DataFrame, by: str | None = "comm", kind: str | list[str] | None = None,
                errno: str | list[str] | None = None) -> pd.DataFrame:
    """``rates()`` from ``binned_counts()`` (which must have the ``by``, ``kind`` and ``errno``
    columns asked for here)."""
    width = int(counted.attrs["width_ns"])
    chosen = counted
    for column, values in (("kind", kind), ("errno", errno)):
        if values is not None:
            chosen = chosen[chosen[column].isin([values] if isinstance(values, str) else list(values))]
    if by is not None:
        chosen = chosen[chosen[by].notna()]
    if chosen.empty:
        return pd.DataFrame(index=pd.DatetimeIndex([], tz="UTC", name="time"))
    bins = range(int(chosen["bin"].min()), int(chosen["bin"].max()) + 1)
    if by is None:
        counts = chosen.groupby("bin")[["n"]].sum().rename(columns={"n": "count"})
    else:
        counts = chosen.pivot_table(index="bin", columns=by, values="n", aggfunc="sum", fill_value=0)
        counts = counts[sorted(counts.columns, key=str)]
        counts.columns = pd.Index([str(c) for c in counts.columns])
    counts = counts.reindex(bins, fill_value=0).astype("int64")
    counts.index = pd.DatetimeIndex(pd.to_datetime([b * width for b in bins], unit="ns", utc=True), name="time")
    counts.columns.name = by
    return counts


def rates_on(engine: Engine, kind: str | list[str] | None = None, freq: str = "1s", by: str | None = "comm",
             errno: str | list[str] | None = None) -> pd.DataFrame:
    """``rates()`` computed by ``engine``."""
    counted = binned_counts(engine, freq, () if by is None else (by,), kind=kind, errno=errno)
    return pivot_rates(counted, by=by)


def rates(recording_or_events: Any, kind: str | list[str] | None = None, freq: str = "1s",
          by: str | None = "comm", errno: str | list[str] | None = None) -> pd.DataFrame:
    """Counts of events per time bin. See ``fdtrace.analysis`` for the full description."""
    with engine_for(recording_or_events) as engine:
        return rates_on(engine, kind=kind, freq=freq, by=by, errno=errno)
