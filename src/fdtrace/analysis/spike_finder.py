"""Bins where a rate rises far above its own recent baseline, merged into intervals."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


def spikes(counts: pd.DataFrame, window: int = 30, threshold: float = 5.0, min_count: int = 10,
           min_share: float = 0.1) -> pd.DataFrame:
    """Spike intervals in a ``rates()`` frame. See ``fdtrace.analysis`` for the full description."""
    columns = ["start", "end", "duration_s", "peak", "peak_time", "baseline", "made_by"]
    if counts.empty:
        return pd.DataFrame(columns=columns)
    total = counts.sum(axis=1).astype(float)
    least = max(3, window // 3)
    past, past_mad = _baseline(total.to_numpy(), window, least)
    later, later_mad = _baseline(total.to_numpy()[::-1], window, least)
    # The first bins of a recording have no past: they are measured against the bins after them,
    # so that an incident in its first seconds is found.
    known = past.notna().to_numpy()
    baseline = pd.Series(np.where(known, past, later.to_numpy()[::-1]), index=total.index)
    mad = pd.Series(np.where(known, past_mad, later_mad.to_numpy()[::-1]), index=total.index)
    scale = (MAD_TO_SIGMA * mad).clip(lower=1.0)
    # No verdict where no baseline is known either way (a recording shorter than ``least`` bins).
    hot = baseline.notna() & (total >= min_count) & (total > baseline + threshold * scale.fillna(1.0))
    rows = []
    step = counts.index[1] - counts.index[0] if len(counts.index) > 1 else pd.Timedelta(seconds=1)
    run_id = (hot != hot.shift()).cumsum()
    for _, run in total[hot].groupby(run_id[hot]):
        start, last = run.index[0], run.index[-1]
        inside = counts.loc[start:last].sum()
        share = inside / max(inside.sum(), 1)
        rows.append({
            "start": start, "end": last + step, "duration_s": (last + step - start).total_seconds(),
            "peak": int(run.max()), "peak_time": run.idxmax(), "baseline": float(baseline.loc[start]),
            "made_by": [str(c) for c in share[share >= min_share].sort_values(ascending=False).index],
        })
    return pd.DataFrame(rows, columns=columns)


def _baseline(values: Any, window: int, least: int) -> tuple[pd.Series, pd.Series]:
    """The median of the ``window`` bins before each bin (not the bin itself) and the median
    absolute deviation from it, by position; NaN where fewer than ``least`` bins come before."""
    before = pd.Series(values, dtype=float).shift(1)
    median = before.rolling(window, min_periods=least).median()
    return median, (before - median).abs().rolling(window, min_periods=least).median()
