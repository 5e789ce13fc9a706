"""The report of what issue 25's newcomer met, over tests/data/newcomer (made by fdtrace's own
recorder): an EMFILE burst in its first second, bash/grep close() churn later, a Go program
dying at its 300-thread limit, haproxy at its FD limit."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fdtrace.analysis import load
from fdtrace.analysis.engines.dataset import engine_for
from fdtrace.analysis.report import SECTIONS, Report, build, go_limit_advice, to_html, to_markdown

NEWCOMER = Path(__file__).parents[1] / "data" / "newcomer"


@pytest.fixture(scope="module")
def recording() -> object:
    return load(NEWCOMER)


@pytest.fixture(scope="module")
def report(recording: object) -> Report:
    return build(recording)


def test_an_incident_in_the_first_seconds_is_a_spike(recording: object, report: Report) -> None:
    events = recording.events  # type: ignore[attr-defined]
    start = events["time"].min()
    burst = events[(events["comm"] == "burst-64") & (events["kind"] == "socket")]
    assert (burst["time"].max() - start).total_seconds() < 2  # the incident is in the first seconds
    first = report.spikes.sort_values("start").iloc[0]
    assert first["start"] <= burst["time"].min() < first["end"] and "burst-64" in first["made_by"]


def test_close_churn_of_grep_and_bash_is_no_spike(report: Report) -> None:
    makers = {name for names in report.spikes["made_by"] for name in names}
    assert not makers & {"grep", "bash", "sleep", "seq"}, report.spikes


def test_the_go_limit_the_event_holds_is_printed(recording: object, report: Report) -> None:
    [line] = [r for r in report.recommendations if r.startswith("Go thread limit of go-threads")]
    assert "'program exceeds 300-thread limit'" in line
    # a limit the event does not hold is said in words, never as <NA>
    events = recording.events.copy()  # type: ignore[attr-defined]
    events.loc[events["kind"] == "go_thread_limit", "ret"] = pd.NA
    with engine_for(events) as engine:
        [unknown] = go_limit_advice(engine)
    assert "<NA>" not in unknown and "nan" not in unknown
    assert "its thread limit (the number was not recorded)" in unknown


def test_what_to_change_comes_first_after_the_summary(report: Report) -> None:
    page, markdown = to_html(report), to_markdown(report)
    change = SECTIONS.index("What to change")
    for text, mark in ((page, "<h2>{}</h2>"), (markdown, "## {}")):
        order = sorted((text.index(mark.format(s)), s) for s in SECTIONS if mark.format(s) in text)
        assert [s for _, s in order][:2] == [SECTIONS[0], SECTIONS[change]]


def test_the_thread_panel_is_scaled_to_the_programs_own_figures(report: Report) -> None:
    [go] = [frame for label, frame in report.thread_series.items() if label.startswith("go-threads")]
    assert go["threads"].max() >= 250 and (go["thread_limit"].dropna() == 300).all()
    for label, frame in report.thread_series.items():  # no line at the system's threads-max
        drawn = pd.concat([frame["threads"], frame["thread_limit"]]).dropna()
        assert drawn.max() <= 1000, label
    page = to_html(report)
    assert "threads-max" in page and "not drawn" in page  # the system's limit is said in words
