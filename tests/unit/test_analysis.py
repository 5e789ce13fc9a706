"""Analysis functions on inputs with known answers, and the report on the fixture recording."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fdtrace.analysis import align, failures, headroom, incidents, least_headroom, load, phase_stats, rates, spikes
from fdtrace.analysis.engines.dataset import Recording
from fdtrace.analysis.report import SECTIONS, build, recommendations, to_html, to_markdown
from fdtrace.display import markdown_shown

EMFILE = Path(__file__).parents[1] / "data" / "emfile"
T0 = pd.Timestamp("2026-01-01T00:00:00Z")


def events(rows: list[tuple[float, int, str, str, str]]) -> pd.DataFrame:
    """(seconds, pid, comm, kind, errno) rows in the event model's columns that analysis reads."""
    frame = pd.DataFrame(rows, columns=["seconds", "pid", "comm", "kind", "errno"])
    frame["time"] = T0 + pd.to_timedelta(frame["seconds"], unit="s")
    frame["host"] = "h"
    frame["start_ns"] = frame["pid"] * 1000
    frame["syscall"] = np.where(frame["errno"] != "", "accept4", "")
    frame["signal"] = None
    frame["exit_code"] = pd.array([None] * len(frame), dtype="Int64")
    for column in ("comm", "kind", "errno", "syscall", "host"):
        frame[column] = frame[column].astype("category")
    return frame.drop(columns="seconds")


def test_rates_counts_every_bin_including_empty_ones() -> None:
    frame = events([(0.1, 1, "a", "socket", ""), (0.2, 2, "b", "socket", ""), (2.5, 1, "a", "socket", ""),
                    (2.6, 1, "a", "close", "")])
    counts = rates(frame, kind="socket", by="comm")
    assert counts.index.tolist() == [T0, T0 + pd.Timedelta(seconds=1), T0 + pd.Timedelta(seconds=2)]
    assert counts.to_dict("list") == {"a": [1, 0, 1], "b": [1, 0, 0]}
    assert rates(frame, by=None)["count"].tolist() == [2, 0, 2]


def test_spikes_are_found_where_they_were_put() -> None:
    rng = np.random.default_rng(7)
    rows = []
    for second in range(120):
        burst = 400 if 60 <= second < 63 else 0
        for i in range(int(rng.poisson(20)) + burst):
            rows.append((second + i / 1000, 1 if i < burst else 2, "haproxy" if i < burst else "web", "accept", ""))
    found = spikes(rates(events(rows), kind="accept", by="comm"))
    assert len(found) == 1
    [spike] = found.to_dict("records")
    assert (spike["start"], spike["end"]) == (T0 + pd.Timedelta(seconds=60), T0 + pd.Timedelta(seconds=63))
    assert spike["duration_s"] == 3.0 and spike["peak"] >= 400 and spike["made_by"] == ["haproxy"]
    assert 15 <= spike["baseline"] <= 25


def test_no_spike_in_steady_traffic() -> None:
    rows = [(second + i / 100, 1, "web", "accept", "") for second in range(100) for i in range(20)]
    assert spikes(rates(events(rows), kind="accept")).empty


def test_headroom_estimates_time_to_exhaustion() -> None:
    samples = pd.DataFrame({
        "ts_ns": [i * 1_000_000_000 for i in range(11)],
        "time": [T0 + pd.Timedelta(seconds=i) for i in range(11)],
        "host": "h", "pid": 5, "start_ns": 99, "comm": "leaky",
        "open_fds": [10 * i for i in range(11)], "fd_soft_limit": 200, "fd_hard_limit": 400,
        "threads": [1 + i for i in range(11)], "sockets": 0,
    })
    recording = Recording(events=pd.DataFrame(), samples=samples, system=pd.DataFrame(), losses=pd.DataFrame(),
                          counters=pd.DataFrame(), clock=pd.DataFrame(), haproxy=pd.DataFrame(),
                          phases=pd.DataFrame())
    series = headroom(recording)
    last = series.iloc[-1]
    assert (last["headroom"], last["usage"]) == (100, 0.5)
    assert last["seconds_to_exhaustion"] == pytest.approx(10.0) and last["threads_per_s"] == pytest.approx(1.0)
    assert np.isnan(series.iloc[0]["seconds_to_exhaustion"])
    assert least_headroom(recording).iloc[0]["open_fds"] == 100
    assert series["thread_limit_kind"].isna().all()  # a recording without thread limits


def test_thread_headroom_takes_the_tightest_limit_and_its_own_growth() -> None:
    seconds = range(6)
    samples = pd.DataFrame({
        "ts_ns": [i * 1_000_000_000 for i in seconds], "time": [T0 + pd.Timedelta(seconds=i) for i in seconds],
        "host": "h", "pid": 5, "start_ns": 99, "comm": "gopher", "open_fds": 10, "fd_soft_limit": 1024,
        "fd_hard_limit": 4096, "threads": [100 + 10 * i for i in seconds], "sockets": 0,
        "go_max_threads": 10_000,
        "nproc_soft_limit": 4000, "user_threads": [1000 + 500 * i for i in seconds],  # others' threads too
        "pids_max": None, "pids_current": None,
    })
    system = pd.DataFrame({"ts_ns": samples["ts_ns"], "host": "h", "threads_max": 95_000, "threads_total": 2000})
    recording = Recording(events=pd.DataFrame(), samples=samples, system=system, losses=pd.DataFrame(),
                          counters=pd.DataFrame(), clock=pd.DataFrame(), haproxy=pd.DataFrame(),
                          phases=pd.DataFrame())
    series = headroom(recording, window_s=10)
    first, last = series.iloc[0], series.iloc[-1]
    assert (first["thread_limit_kind"], first["thread_limit"], first["thread_headroom"]) == ("RLIMIT_NPROC", 4000, 3000)
    assert (last["thread_count"], last["thread_headroom"], last["thread_usage"]) == (3500, 500, 0.875)
    # the user's threads grow 500/s (this process only 10/s): 500 left is one second
    assert last["seconds_to_thread_limit"] == pytest.approx(1.0) and last["threads_per_s"] == pytest.approx(10.0)
    assert least_headroom(recording, resource="threads").iloc[0]["thread_usage"] == 0.875
    no_nproc = Recording(events=pd.DataFrame(), samples=samples.assign(nproc_soft_limit=None), system=system,
                         losses=pd.DataFrame(), counters=pd.DataFrame(), clock=pd.DataFrame(),
                         haproxy=pd.DataFrame(), phases=pd.DataFrame())
    go = headroom(no_nproc).iloc[-1]
    assert (go["thread_limit_kind"], go["thread_headroom"]) == ("Go default", 10_000 - 150)
    assert ("RLIMIT_NPROC of gopher [5]: peak 3500 threads of its user of 4000; set LimitNPROC=4200 in its "
            "systemd unit (or ulimit -u 4200) for the user.") in recommendations(recording, least_headroom(recording))
    assert recommendations(no_nproc, least_headroom(no_nproc)) == [  # 150 threads of Go's 10000
        "No limit was approached in this recording: nothing to change."]


def test_incidents_are_grouped_by_program_and_ranked_by_severity() -> None:
    frame = events([(1.0, 1, "web", "accept", ""), (2.0, 9, "grep", "process_exit", ""),
                    (5.0, 2, "haproxy", "accept", "EMFILE"), (5.5, 2, "haproxy", "accept", "EMFILE"),
                    (6.0, 3, "client", "connect", "ECONNREFUSED"), (7.0, 3, "client", "connect", "ECONNREFUSED"),
                    (7.5, 3, "client", "connect", "EINPROGRESS"), (8.0, 4, "worker", "socket", "EMFILE"),
                    (8.5, 5, "worker", "socket", "EMFILE"), (9.0, 6, "worker", "socket", "EMFILE"),
                    (30.0, 3, "client", "connect", "ECONNREFUSED")])
    frame.loc[frame["pid"] == 9, "exit_code"] = 1
    assert len(failures(frame)) == 6
    found = incidents(frame, window_s=10)
    # grep's exit 1 came first, but exit codes are not incidents unless asked for; within a class
    # of harm, the most failures first (worker's 3 before haproxy's 2, which failed first)
    assert found["comm"].tolist() == ["worker", "haproxy"] and found["first_overall"].tolist() == [False, True]
    assert found["severity"].tolist() == ["EMFILE/ENFILE"] * 2
    worker = found.iloc[0]
    assert (worker["failure"], worker["count"], worker["processes"], worker["first_pid"]) == ("accept4 EMFILE", 3, 3, 4)
    first = found.iloc[1]
    assert first["failure"] == "accept4 EMFILE" and first["count"] == 2
    # EINPROGRESS is a non-blocking connect's answer, not a symptom; three kinds of symptom at most
    assert first["followed_by"] == {"worker: accept4 EMFILE": 3, "client: accept4 ECONNREFUSED": 2}
    with_exits = incidents(frame, window_s=10, exits=True)
    assert with_exits["comm"].tolist() == ["worker", "haproxy", "grep"]  # by harm: an exit 1 last
    assert with_exits.iloc[2]["severity"] == "non-zero exit"


def test_report_on_a_recording_has_every_section() -> None:
    content = build(load(EMFILE))
    page = to_html(content)
    markdown = to_markdown(content)
    for section in SECTIONS:
        assert f"<h2>{section}</h2>" in page and f"## {section}" in markdown
    assert page.count("Plotly.newPlot(") == 1 and "emfile-child [15007]" in page  # the figure, drawn in a browser
    # Markdown's markup characters are escaped (a name could otherwise make a link or a tag)
    assert markdown_shown("Worst failure: emfile-child [15007], socket EMFILE ×3, first at "
                          "2026-11-30 05:36:15.697 UTC.") in markdown
    # capped at its limit of 64, it asked for 4 more in one second: 68 needed, 82 with the margin
    assert markdown_shown(
        "RLIMIT_NOFILE of emfile-child [15007]: soft limit 64, failed 4 times with EMFILE; it needed at least 68 "
        "(its limit 64 plus the 4 opens refused with EMFILE in its worst second); set it to 82") in markdown
    assert "socket EMFILE" in markdown


def test_report_cli_writes_a_self_contained_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fdtrace.cli import main

    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", str(EMFILE), "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    # Everything is in the page, plotly.js too: nothing is fetched (the browser test opens it offline).
    assert page.startswith("<!DOCTYPE html>") and "<link" not in page
    assert not re.search(r"<script[^>]*\bsrc=", page) and not re.search(r"<img[^>]*\bsrc=", page)
    bad = CliRunner().invoke(main, ["report", str(tmp_path), "-o", str(out)])
    assert bad.exit_code != 0 and "not an fdtrace recording" in bad.output


DDP = Path(__file__).parents[1] / "data" / "ddp"


def phases_frame(rows: list[tuple[int, int, str, int, int]]) -> pd.DataFrame:
    """(pid, step, phase, start, end) with rank = pid - 100, times in monotonic ns."""
    frame = pd.DataFrame(rows, columns=["pid", "step", "phase", "start_mono_ns", "end_mono_ns"])
    frame["rank"] = frame["pid"] - 100
    frame["name"] = None
    frame["start_wall_ns"] = frame["start_mono_ns"] + 10**18
    frame["end_wall_ns"] = frame["end_mono_ns"] + 10**18
    return frame


def test_align_labels_events_with_the_innermost_phase_at_its_boundaries() -> None:
    phases = phases_frame([(100, 0, "backward", 1000, 2000), (100, 0, "allreduce", 1500, 1800),
                           (101, 0, "backward", 1000, 2000)])
    frame = pd.DataFrame({"pid": [100, 100, 100, 100, 100, 101, 102],
                          "ts_ns": [999, 1000, 1500, 1800, 2000, 1600, 1600], "kind": "socket", "errno": ""})
    labelled = align(frame, phases)
    assert labelled["phase"].astype(str).tolist() == ["outside any phase", "backward", "allreduce", "allreduce",
                                                      "backward", "backward", "outside any phase"]
    assert labelled["rank"].tolist()[:6] == [0, 0, 0, 0, 0, 1] and pd.isna(labelled["rank"].iloc[6])


def test_phase_stats_equal_direct_counts_on_a_ddp_recording() -> None:
    rec = load(DDP)
    stats = phase_stats(rec).set_index(["rank", "phase"])
    for rank in (0, 1):
        for name in ("forward", "backward", "optimizer"):
            assert stats.loc[(rank, name), "instances"] == 3
        assert stats.loc[(rank, "init_process_group"), "instances"] == 1
    assert stats.loc[(0, "checkpoint_save"), "instances"] == 1
    labelled = align(rec.events, rec.phases)
    for (rank, name), row in stats.iterrows():
        mine = labelled[(labelled["rank"] == rank) & (labelled["phase"].astype(str) == name)]
        assert row["sockets"] == ((mine["kind"].astype(str) == "socket") & (mine["errno"] == "")).sum()
        assert row["connects"] == (mine["kind"].astype(str) == "connect").sum()
    # gloo's mesh and the store: every connection of a rank was made inside init_process_group
    made = labelled[labelled["rank"].notna() & labelled["kind"].isin(["connect", "accept"])
                    & labelled["errno"].isin(["", "EINPROGRESS"])]
    assert len(made) >= 4 and set(made["phase"].astype(str)) == {"init_process_group"}


def test_spikes_are_labelled_with_each_ranks_phase_at_their_peak() -> None:
    phases = phases_frame([(100, 2, "backward", 0, 10**9), (101, 2, "forward", 0, 10**9)])
    peak = pd.Timestamp(10**18 + 5 * 10**8, tz="UTC")
    spike = pd.DataFrame({"start": [pd.Timestamp(10**18, tz="UTC")], "peak_time": [peak]})
    [row] = align(spike, phases).to_dict("records")
    assert row["phase_by_rank"] == {0: "backward", 1: "forward"} and row["steps"] == [2]


def test_report_of_a_ddp_recording_has_phase_statistics_and_bands() -> None:
    content = build(load(DDP))
    stats = content.phase_stats.set_index(["rank", "phase"])
    assert stats.loc[(0, "forward"), "instances"] == 3 and stats.loc[(1, "init_process_group"), "sockets"] > 0
    page = to_html(content)
    bands = content.phase_marks.groupby(["rank", "phase"]).size()
    assert bands[(0, "forward")] == bands[(1, "forward")] == 3 and bands[(1, "init_process_group")] == 1
    assert '"name":"init_process_group"' in page and "Training phases, per rank" in page
    assert "No training phases" not in page and "No training phases" in to_html(build(load(EMFILE)))


def test_info_opens_with_what_went_wrong() -> None:
    from fdtrace.analysis.summary import summary

    emfile = Path(__file__).parents[1] / "data" / "emfile"
    lines = summary(load(emfile)).splitlines()
    pid = int(load(emfile).events.query("comm == 'emfile-child'")["pid"].iloc[0])
    assert lines[0] == "what went wrong:"
    assert lines[1] == (f"  emfile-child [{pid}]: 4 calls failed (EMFILE socket 3, EMFILE pipe2 1), "
                        "first at 2026-11-30 05:36:15.697 UTC")
    assert lines[2].startswith(f"  emfile-child [{pid}]: reached its FD limit, 64 of 64 at ")
    assert not any("process_api" in line or "(0%" in line or "(1%" in line for line in lines)  # unrelated ones
    quiet = summary(load(Path(__file__).parents[1] / "data" / "ddp")).splitlines()
    assert quiet[0].startswith("what went wrong: nothing")


def test_the_fd_panel_draws_the_failing_processes_first_then_the_fewest_descriptors_left() -> None:
    """haproxy at 255/256 with 2,391 EMFILE comes before three processes at 32-descriptor limits;
    among those that did not fail, the fewest descriptors left first, not the highest ratio."""
    from fdtrace.analysis.report.model import by_harm

    rows = [("a", 1, 32, 32), ("haproxy", 2, 255, 256), ("c", 3, 32, 32), ("d", 4, 31, 32), ("e", 5, 254, 256),
            ("f", 6, 10, None)]
    least = pd.DataFrame({"host": ["vm"] * len(rows), "comm": [r[0] for r in rows], "pid": [r[1] for r in rows],
                          "open_fds": [r[2] for r in rows], "fd_soft_limit": [r[3] for r in rows]})
    least["usage"] = least["open_fds"] / least["fd_soft_limit"]
    least = least.sort_values("usage", ascending=False)  # as least_headroom gives them
    failing = pd.DataFrame({"host": ["vm", "vm"], "pid": [2, 3], "start_ns": [0, 0], "n": [2391, 1],
                            "first": [5, 1]})
    assert by_harm(least, failing)["comm"].tolist() == ["haproxy", "c", "a", "d", "e", "f"]
