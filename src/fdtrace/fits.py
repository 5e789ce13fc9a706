"""The one robust line fit: Theil-Sen (the median of the slopes between every two points), used
wherever fdtrace fits a cost per connection (a connection's memory, ``advice.memory``; the
descriptors a rehearsed target takes, ``rehearsal.result``). A sample taken during a burst or a
descriptor opened by something else moves one point, not the line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    """A fitted line.

    Attributes:
        slope: the median of the pairwise slopes.
        intercept: the median of ``y - slope * x`` over the points.
        spread: half the interquartile range of the pairwise slopes.
    """

    slope: float
    intercept: float
    spread: float


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (the mean of the middle two for an even count); not empty."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def theil_sen(points: Sequence[tuple[float, float]]) -> Line | None:
    """The Theil-Sen line through (x, y) points: pairs with the same x give no slope; None
    without two distinct x. Every pair is used, so callers bound the number of points."""
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1:] if x2 != x1]
    if not slopes:
        return None
    slope = median(slopes)
    ordered = sorted(slopes)
    spread = (ordered[3 * len(ordered) // 4] - ordered[len(ordered) // 4]) / 2
    return Line(slope, median([y - slope * x for x, y in points]), spread)
