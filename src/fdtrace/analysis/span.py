"""The span of a recording that its timelines cover, robust to what its events' times say.

One event three years after the others (a clock step, a damaged file, a planted row) would make
every per-second timeline 94 million bins long. The span is taken from the recorder's own rounds
instead (the ``losses`` table has one row per host and interval, all the while it recorded): per
host, the longest run of rounds without a gap of more than a minute (or ten of their usual
intervals), with a margin; events outside it are counted and named, and left off the timelines.
A recording without rounds takes the same from its events' seconds (split by gaps of a day).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from fdtrace.analysis.engines import Engine

SECOND = 1_000_000_000
#: Rounds further apart than this, and than ten of their usual gaps, split a host's recording into
#: runs; the run with the most of them is its span.
SPLIT_S = 60
#: The same for event seconds, when a recording has no rounds (events may be hours apart).
SPLIT_EVENTS_S = 86_400
#: Events this close to a host's span (and three of its usual intervals) are in it: written by the
#: rounds at its ends.
MARGIN_S = 60
OUTLIER_COLUMNS = ["kind", "n", "first", "last"]


def _runs_sql(table: str, split_s: int) -> str:
    """The runs of one table's distinct seconds, per host: (host, n, first, last, typical)."""
    return f"""
WITH r AS (SELECT host, time_ns // {SECOND} AS s FROM {table} WHERE time_ns IS NOT NULL GROUP BY 1, 2),
g AS (SELECT host, s, s - lag(s) OVER (PARTITION BY host ORDER BY s) AS gap FROM r),
m AS (SELECT host, coalesce(median(gap), 1) AS typical FROM g GROUP BY host),
k AS (SELECT g.host, g.s, m.typical, sum(CASE WHEN g.gap > greatest({split_s}, 10 * m.typical) THEN 1 ELSE 0 END)
             OVER (PARTITION BY g.host ORDER BY g.s ROWS UNBOUNDED PRECEDING) AS run
      FROM g JOIN m ON g.host = m.host)
SELECT host, run, count(*) AS n, min(s) AS first, max(s) AS last, max(typical) AS typical FROM k GROUP BY 1, 2"""


@dataclass
class Span:
    """Where a recording's timelines go (``first_ns`` to ``last_ns``; None: no events), and the
    events outside it: ``outliers`` (kind, n, first, last; times in ns)."""

    first_ns: int | None
    last_ns: int | None
    outliers: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=OUTLIER_COLUMNS))

    @property
    def outside(self) -> int:
        """How many events are outside the span."""
        return int(self.outliers["n"].sum()) if len(self.outliers) else 0

    def contains(self, ns: pd.Series) -> pd.Series:
        """Which of these times are in the span."""
        if self.first_ns is None or self.last_ns is None:
            return pd.Series(True, index=ns.index)
        return (ns >= self.first_ns) & (ns <= self.last_ns)

    def holds_bins(self, bins: pd.Series, width: int) -> pd.Series:
        """Which time bins (numbers of ``width`` ns from the epoch) reach into the span."""
        if self.first_ns is None or self.last_ns is None:
            return pd.Series(True, index=bins.index)
        return (bins * width + width > self.first_ns) & (bins * width <= self.last_ns)

    def condition(self, column: str = "time_ns") -> str:
        """The SQL condition of being in the span."""
        if self.first_ns is None or self.last_ns is None:
            return "true"
        return f"{column} BETWEEN {int(self.first_ns)} AND {int(self.last_ns)}"

    def describe(self) -> str:
        """The events outside the span, for people ("" when there are none)."""
        if not self.outside:
            return ""
        first = pd.Timestamp(int(self.outliers["first"].min()), unit="ns", tz="UTC")
        last = pd.Timestamp(int(self.outliers["last"].max()), unit="ns", tz="UTC")
        kinds = ", ".join(f"{r.kind} {int(r.n):,}" for r in self.outliers.sort_values(["n", "kind"],
                                                                                       ascending=[False, True])
                          .itertuples())
        when = f"at {first:%Y-%m-%d %H:%M:%S} UTC" if first == last else \
            f"from {first:%Y-%m-%d %H:%M:%S} to {last:%Y-%m-%d %H:%M:%S} UTC"
        return (f"{self.outside:,} event{'s' if self.outside != 1 else ''} far outside the recorded span ({kinds}), "
                f"{when}: left off the timelines (a clock step, or a damaged or planted file)")


def _host_spans(engine: Engine) -> list[tuple[int, int]]:
    """Each host's span in ns, from its rounds (else its events), margins included."""
    for table, split in (("losses", SPLIT_S), ("events", SPLIT_EVENTS_S)):
        runs = engine.query(_runs_sql(table, split))
        if len(runs):
            break
    else:
        return []
    spans = []
    for _, mine in runs.groupby("host", sort=True):
        best = mine.sort_values(["n", "first"], ascending=[False, True]).iloc[0]
        margin = max(MARGIN_S, 3 * float(best["typical"])) * SECOND
        spans.append((int(best["first"]) * SECOND - int(margin), (int(best["last"]) + 1) * SECOND + int(margin)))
    return spans


def span_on(engine: Engine, counted: pd.DataFrame | None = None, kinds: pd.DataFrame | None = None) -> Span:
    """The span of a recording whose tables ``engine`` holds. Its outliers come from ``counted``
    (``binning.binned_counts``, with a ``kind`` column: nothing read again) when given; else
    ``kinds`` (first and last time per host and kind, as ``info`` has them) tells whether any
    event is outside, and only then are they counted."""
    spans = _host_spans(engine)
    if not spans:
        return Span(None, None)
    found = Span(min(first for first, _ in spans), max(last for _, last in spans))
    if counted is not None:
        if not len(counted):
            return found
        outside = counted[~found.holds_bins(counted["bin"], int(counted.attrs["width_ns"]))]
        if len(outside):
            found.outliers = outside.groupby("kind", observed=True).agg(
                n=("n", "sum"), first=("first", "min"), last=("last", "max")).reset_index()[OUTLIER_COLUMNS]
        return found
    if kinds is not None and len(kinds) and (found.contains(kinds["first"]) & found.contains(kinds["last"])).all():
        return found
    outliers = engine.query(f"SELECT kind, count(*) AS n, min(time_ns) AS first, max(time_ns) AS last FROM events "
                            f"WHERE time_ns IS NOT NULL AND NOT ({found.condition()}) GROUP BY kind")
    found.outliers = outliers[OUTLIER_COLUMNS] if len(outliers) else found.outliers
    return found
