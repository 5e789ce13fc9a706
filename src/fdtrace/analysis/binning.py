"""Event counts per time bin."""

from __future__ import annotations

from typing import Any

import pandas as pd


def events_of(recording_or_events: Any) -> pd.DataFrame:
    """The events DataFrame of a Recording, or the DataFrame itself."""
    return getattr(recording_or_events, "events", recording_or_events)


def rates(recording_or_events: Any, kind: str | list[str] | None = None, freq: str = "1s",
          by: str | None = "comm", errno: str | list[str] | None = None) -> pd.DataFrame:
    """Counts of events per time bin. See ``fdtrace.analysis`` for the full description."""
    events = events_of(recording_or_events)
    # Categorical columns are compared as they are: no 10-million-string copies.
    if kind is not None:
        events = events[events["kind"].isin([kind] if isinstance(kind, str) else kind)]
    if errno is not None:
        events = events[events["errno"].isin([errno] if isinstance(errno, str) else errno)]
    if events.empty:
        return pd.DataFrame(index=pd.DatetimeIndex([], tz="UTC", name="time"))
    bins = events["time"].dt.floor(freq)
    if by is None:
        counts = events.groupby(bins).size().to_frame("count")
    else:
        groups = events[by]
        if isinstance(groups.dtype, pd.CategoricalDtype):
            groups = groups.cat.remove_unused_categories()
        counts = events.groupby([bins, groups], observed=True).size().unstack(fill_value=0)
        counts.columns = counts.columns.astype(str)
    full = pd.date_range(bins.min(), bins.max(), freq=freq, name="time")
    counts = counts.reindex(full, fill_value=0)
    counts.columns.name = by
    return counts.astype("int64")
