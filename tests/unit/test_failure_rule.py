""""Is this a failure?" is declared once (fdtrace.schema.failures) and every reader renders it:
the analyses' SQL, the Arrow mask of replay, the flight recorder and the part summaries, the
live view's row test. Issue 25 found five versions that disagreed on non-zero exits; here every
rendering is run over the same events (tests/data/newcomer and tests/data/emfile, made by
fdtrace's recorder, with the edge cases of process_exit they do not hold) and must agree."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from fdtrace.analysis import failures, load
from fdtrace.analysis.engines.dataset import engine_for
from fdtrace.analysis.summary import _failed
from fdtrace.recording.summaries import summarize
from fdtrace.schema.failures import (
    FAILURE_SQL,
    INCIDENT_CLASSES,
    INCIDENT_SQL,
    OOM_END_NS,
    failure_class,
    incident_mask,
    oom_ends,
)
from fdtrace.sinks.parquet import incidents
from fdtrace.tui.state import IncidentState

DATA = Path(__file__).parents[1] / "data"
COLUMNS = ["ts_ns", "time", "host", "pid", "start_ns", "comm", "kind", "syscall", "ret", "errno", "signal",
           "exit_code", "anon_rss_kb", "file_rss_kb", "oom_score_adj", "peer_addr", "peer_port"]


def edge_rows(like: pd.DataFrame) -> pd.DataFrame:
    """process_exit as the kernel reports it: exit 1, exit 0, killed (with and without an exit
    code), an empty signal; calls failing with EAGAIN and EINPROGRESS (no failures); and an OOM
    kill followed by its victim's SIGKILL exit (one failure: the OOM kill)."""
    base = like.iloc[-1]
    rows = [("process_exit", "", None, 1), ("process_exit", "", None, 0), ("process_exit", "", "SIGKILL", None),
            ("process_exit", "", "SIGSEGV", 139), ("process_exit", "", "", 3), ("connect", "EINPROGRESS", None, None),
            ("accept", "EAGAIN", None, None), ("oom_kill", "", None, None), ("process_exit", "", "SIGKILL", None)]
    frame = pd.DataFrame([{**base.to_dict(), "kind": kind, "errno": errno, "signal": signal, "exit_code": code,
                           "pid": 900_000 + min(i, 7), "comm": f"edge-{min(i, 7)}", "ts_ns": int(base["ts_ns"]) + i + 1,
                           "time": base["time"] + pd.Timedelta(i + 1, "ns"), "anon_rss_kb": 1000, "file_rss_kb": 10,
                           "oom_score_adj": 0}
                          for i, (kind, errno, signal, code) in enumerate(rows)])
    # an OOM kill whose victim's SIGKILL comes past OOM_END_NS (61 s later): a crash of its own, for
    # every reader, the live view's rule included
    late = frame.iloc[[-2, -1]].assign(pid=900_020, comm="edge-late")
    late.loc[late.index[-1], ["ts_ns", "time"]] = [int(late["ts_ns"].iloc[0]) + OOM_END_NS + 1_000_000_000,
                                                   late["time"].iloc[0] + pd.Timedelta(OOM_END_NS + 10**9, "ns")]
    return pd.concat([frame, late], ignore_index=True).astype({"exit_code": "Int64"})


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    parts = []
    for name in ("newcomer", "emfile"):
        recorded = load(DATA / name).events[COLUMNS]
        texts = ("host", "comm", "kind", "syscall", "errno", "signal", "peer_addr")
        parts += [recorded.astype(dict.fromkeys(texts, "string"))]
    merged = pd.concat([*parts, edge_rows(parts[0])], ignore_index=True)
    return merged.assign(row_id=range(len(merged)))


def test_every_rendering_of_the_rule_agrees(events: pd.DataFrame) -> None:
    by_python = [failure_class(row) for row in events.to_dict("records")]
    # the row test cannot see that an exit follows an OOM kill: the joins of the readers do
    after_oom = oom_ends(events["pid"], events["ts_ns"], events["kind"].astype(str), events["signal"].fillna(""),
                         events["host"].astype(str))
    assert after_oom.sum() == 1
    by_row = [c in INCIDENT_CLASSES for c in by_python], [c is not None for c in by_python]
    by_python = [None if ended else c for c, ended in zip(by_python, after_oom, strict=True)]
    incident = [c in INCIDENT_CLASSES for c in by_python]
    failure = [c is not None for c in by_python]
    assert sum(incident) >= 100 and sum(failure) > sum(incident)  # EMFILE, Go's limit, kills; exit 1s
    with engine_for(events) as engine:
        sql = engine.query(f"SELECT row_id, {INCIDENT_SQL} AS incident, {FAILURE_SQL} AS failure FROM events "
                           "ORDER BY row_id")
        headline = _failed(engine)
    assert (sql["incident"].fillna(False).tolist(), sql["failure"].fillna(False).tolist()) == by_row
    headline = headline[~oom_ends(headline["pid"], headline["at"].fillna(-1), headline["kind"].astype(str),
                                  headline["signal"], headline["host"])]  # as summary.headline does
    table = pa.Table.from_pandas(events, preserve_index=False)
    assert incident_mask(table).to_pylist() == incident
    assert incident_mask(table, exits=True).to_pylist() == failure
    # the readers: failures(), info's headline, the part summaries, the flight recorder, the view
    assert len(failures(events)) == sum(failure)
    assert int(headline["n"].sum()) == sum(incident)
    assert sum(row[8] for row in summarize(table)["failed"]) == sum(incident)  # n, by FAILED_COLUMNS
    assert [cls for _, cls in incidents(table)] == [c for c in by_python if c in INCIDENT_CLASSES]
    state = IncidentState()
    state.apply_events(table.sort_by("ts_ns"))
    failing = {pid for pid, is_incident in zip(events["pid"], incident, strict=True) if is_incident}
    assert {pid for pid, view in state.processes.items() if view.failed} == failing
    assert state.processes[900_020].failures == {"OOM kill", "killed by a signal"}  # the late SIGKILL
    assert state.processes[900_007].failures == {"OOM kill"}  # its end within OOM_END_NS: no failure
