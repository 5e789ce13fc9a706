"""The plotting helpers draw exactly what the computing functions returned (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fdtrace.analysis import headroom, load, rates, spikes

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
from fdtrace.analysis import plots  # noqa: E402

DATA = Path(__file__).parents[1] / "data"


def test_rates_draw_one_line_per_column_with_the_counts() -> None:
    counts = rates(load(DATA / "emfile"), kind="socket", freq="100ms", by="comm")
    ax = plots.rates(counts)
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {str(c) for c in counts.columns}
    for column in counts.columns:
        assert np.array_equal(lines[str(column)].get_ydata(), counts[column].to_numpy())


def test_headroom_draws_usage_and_limit_of_the_process() -> None:
    rec = load(DATA / "emfile")
    series = headroom(rec)
    pid = int(series[series["comm"] == "emfile-child"]["pid"].iloc[0])
    ax = plots.headroom(series, pid)
    used, limit = ax.get_lines()
    mine = series[series["pid"] == pid].sort_values("time")
    assert np.array_equal(used.get_ydata(), mine["open_fds"].to_numpy(dtype=float))
    assert np.array_equal(limit.get_ydata(), mine["fd_soft_limit"].to_numpy(dtype=float))
    assert "emfile-child" in ax.get_title()


def test_phase_bands_one_per_phase_of_the_rank_and_spikes_shaded() -> None:
    rec = load(DATA / "ddp")
    ax = plots.phase_bands(rec.phases, rank=1)
    assert len(ax.patches) == int((rec.phases["rank"] == 1).sum())
    labels = {p.get_label() for p in ax.patches if not p.get_label().startswith("_")}
    assert labels == set(rec.phases[rec.phases["rank"] == 1]["phase"])
    counts = rates(rec, kind=["socket", "connect", "accept"], freq="100ms", by=None)
    found = spikes(counts, window=5, threshold=3.0, min_count=2)
    shaded = plots.spikes(found)
    assert len(shaded.patches) == len(found)
