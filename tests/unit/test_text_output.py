"""`fdtrace trace` on a terminal: one aligned line per event, and the per-process summary of
`-s`, over a replay of tests/data/emfile (made by fdtrace's own recorder)."""

from __future__ import annotations

import io
from pathlib import Path

from fdtrace.analysis import load
from fdtrace.pipeline import Pipeline, Stop
from fdtrace.sinks.text import HEADER, TextLinesSink
from fdtrace.sources.replay import ReplaySource

EMFILE = Path(__file__).parents[1] / "data" / "emfile"


def test_each_event_is_one_aligned_line_under_the_header() -> None:
    ticks = iter(range(0, 10**15, 100_000_000))
    source = ReplaySource(EMFILE, clock=lambda: next(ticks))
    out = io.StringIO()
    lines_sink = TextLinesSink(out)
    pipeline = Pipeline(source, [lines_sink], poll_interval_s=0)
    pipeline.start()
    pipeline.run(Stop(condition=lambda: source.player.finished, signals=False))
    lines = out.getvalue().splitlines()
    assert lines[0] == HEADER and len(lines) == 1 + 76
    events = load(EMFILE).events
    pid = int(events.query("comm == 'emfile-child'")["pid"].iloc[0])
    failed = [line for line in lines if "EMFILE" in line]
    assert len(failed) == 4
    assert failed[0].split()[1:7] == [str(pid), str(pid), "emfile-child", "socket", "socket", "-24"]
    assert any(line.split()[4:6] == ["fd_error", "pipe2"] for line in failed)
    exits = [line for line in lines if " process_exit " in line]
    assert len(exits) == 3 and all(line.endswith(("exit 0", "exit 1")) or "killed by" in line for line in exits)
    assert lines_sink.summary().startswith("76 events (")


def test_times_are_written_as_pandas_writes_them() -> None:
    """The live commands do not import pandas: their ISO times are the same all the same."""
    import pandas as pd

    from fdtrace.schema import iso_utc

    for ns in (1764477217490362178, 1764477217490362000, 1764477217000000000, 0, 1764477217000000001):
        assert iso_utc(ns) == pd.Timestamp(ns, unit="ns", tz="UTC").isoformat().replace("+00:00", "Z")
