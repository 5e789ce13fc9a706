"""Event counts per time bin."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fdtrace.analysis.engines import Engine, quote
from fdtrace.analysis.engines.dataset import engine_for
from fdtrace.analysis.span import Span


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


#: Bins a timeline of the report has at most: a longer recording gets wider bins.
MAX_BINS = 100_000
#: Cells (bins times columns) ``rates()`` makes at most: more asks for a wider ``freq``.
MAX_CELLS = 20_000_000
#: Columns of a pivot by name kept at most by the report (the busiest; the rest summed as one).
OTHERS = "(others)"


def coarser(counted: pd.DataFrame, factor: int) -> pd.DataFrame:
    """``binned_counts()`` re-binned ``factor`` times wider."""
    if factor <= 1:
        return counted
    keys = [c for c in counted.columns if c not in ("bin", "n", "first", "last")]
    wider = counted.assign(bin=counted["bin"] // factor)
    grouped = wider.groupby(["bin", *keys], dropna=False, sort=False, observed=True).agg(
        n=("n", "sum"), first=("first", "min"), last=("last", "max")).reset_index()
    grouped.attrs["width_ns"] = int(counted.attrs["width_ns"]) * factor
    return grouped


def within(counted: pd.DataFrame, span: Span | None) -> pd.DataFrame:
    """The rows of ``binned_counts()`` in the recording's span (the others are its outliers)."""
    if span is None or not len(counted):
        return counted
    kept = counted[span.holds_bins(counted["bin"], int(counted.attrs["width_ns"]))]
    kept.attrs.update(counted.attrs)
    return kept


def factor_for(span: Span, width_ns: int, max_bins: int = MAX_BINS) -> int:
    """How many times wider than ``width_ns`` bins must be for the span to take at most
    ``max_bins`` of them (a whole number: 1, 2, 5 or 10 times a power of ten)."""
    if span.first_ns is None or span.last_ns is None:
        return 1
    needed = -(-(span.last_ns - span.first_ns) // (width_ns * max_bins))
    if needed <= 1:
        return 1
    step = 1
    while True:
        for nice in (1, 2, 5):
            if nice * step >= needed:
                return nice * step
        step *= 10


def pivot_rates(counted: pd.DataFrame, by: str | None = "comm", kind: str | list[str] | None = None,
                errno: str | list[str] | None = None, top: int | None = None) -> pd.DataFrame:
    """``rates()`` from ``binned_counts()`` (which must have the ``by``, ``kind`` and ``errno``
    columns asked for here), every bin from the first to the last that has events. ``top``: only
    the busiest columns, the others summed as OTHERS."""
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
        if top is not None:
            busiest = chosen.groupby(by, observed=True)["n"].sum().sort_values(ascending=False, kind="stable")
            if len(busiest) > top:
                kept = set(busiest.index[:top])
                chosen = chosen.assign(**{by: [v if v in kept else OTHERS for v in chosen[by]]})
        counts = chosen.pivot_table(index="bin", columns=by, values="n", aggfunc="sum", fill_value=0, observed=True)
        counts = counts[sorted(counts.columns, key=str)]
        counts.columns = pd.Index([str(c) for c in counts.columns])
    counts = counts.reindex(bins, fill_value=0).astype("int64")
    counts.index = pd.DatetimeIndex(pd.to_datetime([b * width for b in bins], unit="ns", utc=True), name="time")
    counts.columns.name = by
    return counts


def rates_on(engine: Engine, kind: str | list[str] | None = None, freq: str = "1s", by: str | None = "comm",
             errno: str | list[str] | None = None) -> pd.DataFrame:
    """``rates()`` computed by ``engine``: the bins of the recording's span (``span.span_on``);
    the events outside it are counted in the result's ``attrs["outliers"]``. Raises ValueError
    when ``freq`` would make more than MAX_CELLS cells."""
    from fdtrace.analysis.span import span_on

    keys = tuple(dict.fromkeys(("kind", *(() if by is None else (by,)))))
    counted = binned_counts(engine, freq, keys, kind=kind, errno=errno)
    span = span_on(engine, counted=counted)
    counted = within(counted, span)
    if len(counted):
        bins = int(counted["bin"].max()) - int(counted["bin"].min()) + 1
        columns = 1 if by is None else int(counted[by].nunique())
        if bins * columns > MAX_CELLS:
            wider = factor_for(span, bin_width_ns(freq), MAX_CELLS // columns)
            raise ValueError(f"rates(freq={freq!r}): {bins:,} bins of {columns:,} columns, more than {MAX_CELLS:,} "
                             f"cells: give a wider freq (at least {wider} times wider)")
    found = pivot_rates(counted, by=by)
    found.attrs["outliers"] = span.outliers
    return found


def rates(recording_or_events: Any, kind: str | list[str] | None = None, freq: str = "1s",
          by: str | None = "comm", errno: str | list[str] | None = None) -> pd.DataFrame:
    """Counts of events per time bin. See ``fdtrace.analysis`` for the full description."""
    with engine_for(recording_or_events) as engine:
        return rates_on(engine, kind=kind, freq=freq, by=by, errno=errno)
