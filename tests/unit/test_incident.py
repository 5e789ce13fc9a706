"""The incident state the live view draws: alerts, HAProxy's maxconn, thread limits and the
destinations of each process's connect() calls (from events decoded as the live source does)."""

from __future__ import annotations

import dataclasses
import socket
import struct

import numpy as np

from fdtrace.schema import SYSCALL_IDS, Kind
from fdtrace.schema.records import ProcessSample, ProcessTotals
from fdtrace.tui.adapters import process_detail
from fdtrace.tui.state import IncidentState
from tests.unit.test_decode import decode_table, record, sockaddr


def test_haproxy_near_maxconn_for_30_seconds_alerts_once() -> None:
    state = IncidentState()
    row = {"socket": "/run/haproxy.sock", "error": None, "haproxy_pid": 7, "curr_conns": 950, "maxconn": 1000}
    for second in range(0, 40):
        state.apply_haproxy([dict(row)], second * 1_000_000_000)
    alerts = [e for e in state.log if "for 30 s" in e.text]
    assert len(alerts) == 1 and alerts[0].time_ns == 30_000_000_000 and alerts[0].pid == 7
    assert state.haproxy["/run/haproxy.sock"].busy_for_s(39_000_000_000) == 39
    state.apply_haproxy([{**row, "curr_conns": 100}], 41_000_000_000)
    assert state.haproxy["/run/haproxy.sock"].busy_since_ns is None
    state.apply_haproxy([{"socket": "/gone.sock", "error": "No such file or directory"}] * 2, 42_000_000_000)
    [gone] = [e for e in state.log if "does not answer" in e.text]
    # no haproxy holds that socket: the line names no process, and never "[0]"
    from fdtrace.tui.adapters import log_line
    assert log_line(gone).plain == "00:00:42 haproxy stats socket /gone.sock does not answer: No such file or directory"


def test_a_stats_socket_that_stops_answering_keeps_its_last_answer() -> None:
    from fdtrace.tui.adapters import haproxy_line

    state = IncidentState()
    good = {"socket": "/run/haproxy.sock", "error": None, "haproxy_pid": 7, "curr_conns": 255, "maxconn": 256,
            "ulimit_n": 256, "maxsock": 8220, "conn_rate": 90}
    state.apply_haproxy([good], 1_000_000_000)
    state.apply_haproxy([{"socket": "/run/haproxy.sock", "error": "timed out"}], 4_000_000_000)  # out of FDs
    view = state.haproxy["/run/haproxy.sock"]
    assert view.row == good and view.error == "timed out"
    [said] = [e for e in state.log if "does not answer" in e.text]
    assert (said.pid, said.comm) == (7, "haproxy")  # its pid, not 0
    assert said.text.endswith("timed out; last answer: 255/256 connections")
    shown = haproxy_line([view], 4_000_000_000).plain
    assert shown.startswith("haproxy /run/haproxy.sock: does not answer (timed out); its last answer, 3 s ago: "
                            "255/256 connections (100%)  Ulimit-n 256  Maxsock 8220")
    state.apply_haproxy([{**good, "curr_conns": 10}], 5_000_000_000)
    assert view.error is None and view.row["curr_conns"] == 10


def test_the_live_view_alerts_on_the_thread_limit_that_binds() -> None:
    state = IncidentState()
    gopher = ProcessSample(pid=8, start_ns=1, comm="gopher", open_fds=10, fd_soft_limit=1024, fd_hard_limit=4096,
                           threads=8500, sockets=0, go_max_threads=10_000, pids_current=8600, pids_max=9000)
    state.apply_samples([gopher], 1_000_000_000)
    view = state.processes[8]
    assert view.thread_limit == ("cgroup pids.max", 8600, 9000)  # 400 to spare, Go's limit 1500
    assert "threads 8600/9000 (cgroup pids.max)" in view.alerts
    state.apply_samples([ProcessSample(**{**gopher.__dict__, "threads": 100, "pids_current": 200})], 2_000_000_000)
    assert not any(alert.startswith("threads") for alert in state.processes[8].alerts)


def test_connect_destinations_are_counted_per_process_with_their_failures() -> None:
    def connect(address: str, port: int, errno: int = 0) -> np.ndarray:
        raw = struct.pack("<H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton(address)
        return record(Kind.CONNECT, pid=42, syscall=SYSCALL_IDS["connect"], fd=5, ret=-errno, errno=errno,
                      extra=sockaddr(raw))

    rows = [connect("10.0.0.5", 8080) for _ in range(4)] + [connect("10.0.0.5", 8080, errno=111)]
    rows += [connect("10.0.0.6", 8080, errno=115), connect("10.0.0.6", 8080)]  # EINPROGRESS is no failure
    state = IncidentState()
    state.apply_events(decode_table(*rows))
    view = state.processes[42]
    assert view.destinations == {"10.0.0.5:8080": [5, 1], "10.0.0.6:8080": [2, 0]}
    text = str(process_detail(view))
    assert "connect() destinations: 10.0.0.5:8080 ×5 (1 failed), 10.0.0.6:8080 ×2" in text



def sample(pid: int, open_fds: int = 10) -> ProcessSample:
    return ProcessSample(pid=pid, start_ns=pid, comm=f"p{pid}", open_fds=open_fds, fd_soft_limit=1024,
                         fd_hard_limit=4096, threads=1, sockets=0)


def test_processes_that_ended_or_went_unseen_are_forgotten_after_the_keep_time() -> None:
    seconds = 1_000_000_000
    state = IncidentState(keep_exited_ns=10 * seconds)
    state.apply_samples([sample(1), sample(2), sample(3, open_fds=1000)], 1 * seconds)  # 3 is at 98 %: an alert
    state.roll(5 * seconds, {})
    assert set(state.processes) == {1, 2, 3}
    state.apply_samples([sample(1)], 10 * seconds)  # 1 is still sampled; 2 and 3 are not seen again
    state.roll(12 * seconds, {})
    assert set(state.processes) == {1, 3} and state.forgotten == 1  # 3 keeps its alert on screen
    state.processes[1].ended_ns = 12 * seconds  # it exits
    state.roll(21 * seconds, {})
    assert 1 in state.processes
    state.roll(23 * seconds, {})
    assert set(state.processes) == {3} and state.forgotten == 2


def test_past_the_cap_the_least_recently_seen_go_first() -> None:
    state = IncidentState(max_processes=100)
    state.apply_samples([sample(pid) for pid in range(1, 151)], 1)
    state.apply_samples([sample(pid) for pid in range(101, 151)], 2)  # seen again later
    state.roll(3, {})
    assert len(state.processes) == 100 and state.forgotten == 50
    assert set(state.processes) == set(range(51, 151))


def test_the_first_window_after_a_seek_gives_no_rates_but_logs_its_failures() -> None:
    """A replay's seek hands the whole history up to there in one update: its failures are
    logged, but they are no rate (13,133k EMFILE/s was shown)."""
    failures = [record(Kind.SOCKET, pid=9, syscall=SYSCALL_IDS["socket"], ret=-24, errno=24) for _ in range(500)]
    state = IncidentState()
    state.apply_events(decode_table(np.concatenate(failures)))
    state.roll(10_000_000_000, {})
    assert state.processes[9].rates["fd_exhaustion"] == 0.0
    assert any("socket failed with EMFILE x500" in entry.text for entry in state.log)
    state.apply_events(decode_table(np.concatenate(failures[:20])))
    state.roll(12_000_000_000, {})
    assert state.processes[9].rates["fd_exhaustion"] == 10.0  # 20 in 2 s


def test_a_failure_is_logged_under_the_name_its_process_had_when_it_failed() -> None:
    """A /proc sample read before the process renamed itself (prctl) names it otherwise: the log
    line names the program that failed, as its failing calls do."""
    failures = [record(Kind.SOCKET, pid=9, syscall=SYSCALL_IDS["socket"], ret=-24, errno=24, comm=b"charlie")
                for _ in range(3)]
    state = IncidentState()
    state.apply_events(decode_table(np.concatenate(failures)))
    state.apply_samples([sample(9)], 1)  # "p9": what /proc said before the rename
    state.roll(10_000_000_000, {})
    [line] = [entry for entry in state.log if "socket failed with EMFILE" in entry.text]
    assert (line.pid, line.comm, line.text) == (9, "charlie", "socket failed with EMFILE x3")


def test_memory_near_its_cgroup_limit_alerts_and_an_oom_kill_says_what_was_last_seen() -> None:
    state = IncidentState()
    limit, per_socket, base = 150 << 20, 100 * 1024, 10 << 20
    for second in range(30):
        sockets = 35 * second + 400
        state.apply_samples([ProcessSample(pid=400, start_ns=1, comm="haproxy", open_fds=sockets + 5,
                                           fd_soft_limit=4096, fd_hard_limit=4096, threads=2, sockets=sockets,
                                           rss_anon_kb=(base + per_socket * sockets) // 1024 - 4000, rss_file_kb=4000,
                                           rss_shmem_kb=0, memcg_limit_bytes=limit,
                                           memcg_usage_bytes=base + per_socket * sockets)], second * 1_000_000_000)
    state.apply_haproxy([{"socket": "/run/haproxy.sock", "source": "configuration", "haproxy_pid": 400,
                          "maxconn": 4096, "maxsock": 8220}], 30_000_000_000)
    view = state.processes[400]
    assert view.memory_usage is not None and view.memory_usage > 0.95
    [alert] = [a for a in view.alerts if a.startswith("memory")]
    assert alert == "memory at 99% of its cgroup, full in 1s"  # 3.4 MiB a second, 1.7 MiB to spare
    text = str(process_detail(view))
    assert "cgroup 148 MiB of 150 MiB (99%)  full in 1s" in text
    assert "at 4,096 connections (its maxconn) haproxy needs about 410 MiB, about 100 KiB per connection" in text
    assert "lower maxconn to 1,177 (what its cgroup holds with the margin) or raise MemoryMax=" in text
    state.apply_events(decode_table(record(Kind.OOM_KILL, pid=400, ts=31_000_000_000, ret=-500,
                                           extra=[150000, 4000, 0, 0])))
    [said] = [e for e in state.log if e.text.startswith("OOM kill")]
    assert said.text.endswith("; last seen: 1,420 FDs (1,415 sockets), 2 threads, RSS 148 MiB; its cgroup at "
                              "148 MiB of 150 MiB (99%): foreseen")
    assert not [a for a in state.processes[400].alerts if a.startswith("memory")]  # the kill says it now


def test_a_growth_stops_its_full_in_when_it_stops_and_an_ended_process_has_none() -> None:
    """Open FDs growing 10 a second give a "full in"; 10 s flat after it, none (not a whole 30 s
    window later); a process that ended is never "full in" anything."""
    seconds = 1_000_000_000
    state = IncidentState()
    for t in range(10):
        state.apply_samples([sample(1, open_fds=100 + 10 * t)], t * seconds)
    view = state.processes[1]
    assert view.seconds_to_exhaustion() == (1024 - 190) / 10
    for t in range(10, 21):
        state.apply_samples([sample(1, open_fds=190)], t * seconds)
    assert view.seconds_to_exhaustion() is None
    state.apply_samples([sample(1, open_fds=200)], 21 * seconds)
    assert view.seconds_to_exhaustion() is not None
    view.ended, view.ended_ns = "exit 0", 22 * seconds
    assert view.seconds_to_exhaustion() is None


def test_past_the_cap_the_ended_go_first_and_the_failed_last() -> None:
    """Issue 34: memory bounded by what is shown: past the cap, processes that ended cleanly are
    forgotten first, then the least recently seen; one that failed (EMFILE) stays, though it
    was seen earliest of all."""
    state = IncidentState(max_processes=100)
    failing = [record(Kind.SOCKET, pid=7, syscall=SYSCALL_IDS["socket"], ret=-24, errno=24)]
    state.apply_events(decode_table(np.concatenate(failing)))
    state.apply_samples([sample(pid) for pid in range(1000, 1150)], 2)
    for pid in range(1100, 1150):  # 50 of them end, and are seen last
        state.processes[pid].ended_ns = 3
        state.processes[pid].last_seen_ns = 3
    state.roll(4, {})
    assert len(state.processes) == 100 and state.forgotten == 51
    assert 7 in state.processes and state.processes[7].failed
    assert not any(pid in state.processes for pid in range(1100, 1150))


def test_the_fd_advice_keeps_a_peak_older_than_the_views_history() -> None:
    """A peak of 900 open FDs 700 rounds ago (past the 600 the view's history keeps) is still the
    need the live view's "what to change" renders, as the report's peak over every sample is."""
    from fdtrace.tui.adapters import fd_recommendation
    from fdtrace.tui.state import HISTORY_POINTS

    state = IncidentState()
    for second, fds in enumerate([900] + [100] * (HISTORY_POINTS + 100)):
        state.apply_samples([ProcessSample(pid=9, start_ns=1, comm="spiky", open_fds=fds, fd_soft_limit=1000,
                                           fd_hard_limit=4096, threads=1, sockets=0)], second * 1_000_000_000)
    view = state.processes[9]
    assert max(fds for _, fds in view.history) == 100 and view.peak_fds == 900
    said = fd_recommendation(view)
    assert said is not None and said.startswith("RLIMIT_NOFILE soft limit 1080 (needed 900: peak 900 open")


def test_a_host_that_forks_thousands_keeps_only_the_latest_brief_lives_and_every_failure() -> None:
    """Issue 34: processes whose whole life is in one update and that ended cleanly are counted as
    forgotten past ``max_ended`` (the latest kept), not made rows to be dropped at the next roll;
    one that exited 1 and one that failed (EMFILE) in the same update are kept, with exact counts."""
    state = IncidentState(max_ended=3)
    lives = []
    for number, pid in enumerate(range(1000, 1012)):
        ts = 1_000_000 * (number + 1)
        lives.append(record(Kind.PROCESS_START, pid=pid, ts=ts, extra=[1, 0, 0, 0]))
        if pid == 1011:
            lives += [record(Kind.SOCKET, pid=pid, ts=ts + 1, syscall=SYSCALL_IDS["socket"], ret=-24, errno=24)] * 2
        lives.append(record(Kind.PROCESS_EXIT, pid=pid, ts=ts + 2, extra=[1, 1 if pid == 1010 else 0, 0, 0]))
    events = decode_table(*lives)
    state.apply_events(events)
    assert set(state.processes) == {1007, 1008, 1009, 1010, 1011} and state.forgotten == 7
    assert state.processes[1011].failed and state.processes[1011].emfile == 2
    assert state.processes[1010].ended == "exit 1" and state.processes[1009].ended == "exit 0"
    assert state._window_events == events.num_rows  # every event is in the rate
    rows, matching = state.top_rows(limit=2)
    assert [view.pid for view in rows] == [1011, 1007] and matching == 5  # the failed first


WALL = 1_700_000_000_000_000_000  # the wall time of ts 0 in the decoded records (tests.unit.test_decode)


def test_a_failure_the_counters_saw_first_is_shown_at_once_and_not_counted_again_by_its_events() -> None:
    """Under a flood the events of a failing program come late, or are dropped: the in-kernel
    counters' reading, with its /proc sample of the same round, makes its row a failed one with
    its exact count at once; its events, when they come, add their times and log lines but no
    count; a later reading raises the count past the events' (the ring dropped some); a reading
    of another instance of the pid, or of a process the view does not show, changes nothing."""
    counted = ProcessTotals(pid=9, first_ts=5, comm="python3", exit_ts=None, counts={},
                            errors={("openat", "EMFILE"): 3, ("connect", "EAGAIN"): 7})
    stranger = ProcessTotals(pid=11, first_ts=6, comm="bash", exit_ts=None, counts={}, errors={("openat", "ENOENT"): 2})
    state = IncidentState()
    state.apply_samples([dataclasses.replace(sample(9, open_fds=40), comm="charlie")], WALL + 2_000_000_000)
    state.apply_counters([counted, stranger], WALL + 2_000_000_000)
    view = state.processes[9]
    assert (view.comm, view.failed, view.fd_exhaustion_errors, dict(view.errors)) == \
        ("charlie", True, 3, {("openat", "EMFILE"): 3})
    assert [v.pid for v in state.rows()] == [9]
    failures = [record(Kind.SOCKET, pid=9, syscall=SYSCALL_IDS["openat"], ret=-24, errno=24, comm=b"charlie")
                for _ in range(3)]
    state.apply_events(decode_table(np.concatenate(failures)))
    state.apply_counters([counted], WALL + 3_000_000_000)
    state.roll(WALL + 3_000_000_000, {})
    assert (view.fd_exhaustion_errors, dict(view.errors)) == (3, {("openat", "EMFILE"): 3})
    assert view.first_failure_ns == WALL + 1_000  # when its events say it failed
    assert any("openat failed with EMFILE x3" in entry.text for entry in state.log)
    counted.errors[("openat", "EMFILE")] = 5  # two more, whose events the ring dropped
    state.apply_counters([counted], WALL + 4_000_000_000)
    assert view.fd_exhaustion_errors == 5
    other = ProcessTotals(pid=9, first_ts=1, comm="charlie", exit_ts=3, counts={}, errors={("openat", "EMFILE"): 40})
    state.apply_counters([other], WALL + 5_000_000_000)
    assert state.processes[9] is view and view.fd_exhaustion_errors == 5


def test_replay_without_counters_counts_failures_from_events_alone() -> None:
    """A replay has no counters reading: the events' counts are what the view shows."""
    failures = [record(Kind.SOCKET, pid=9, syscall=SYSCALL_IDS["socket"], ret=-24, errno=24) for _ in range(4)]
    state = IncidentState()
    state.apply_events(decode_table(np.concatenate(failures)))
    assert (state.processes[9].fd_exhaustion_errors, dict(state.processes[9].errors)) == (4, {("socket", "EMFILE"): 4})


def test_the_views_of_processes_never_sampled_stay_small() -> None:
    """Issue 34: a churning host's view keeps up to ``MAX_PROCESSES`` processes, most never
    sampled. Each costs about 1.5 kB; it was 5 kB while each held three empty 600-point deques
    and a dict of its 52 fields."""
    import tracemalloc

    from fdtrace.tui.state import ProcessView

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        views = [ProcessView(pid=pid, comm="forked", start_ns=pid) for pid in range(10_000)]
        per_view = (tracemalloc.get_traced_memory()[0] - before) / len(views)
    finally:
        tracemalloc.stop()
    assert per_view < 2_000, f"{per_view:.0f} bytes a view"
    state = IncidentState()
    state.apply_samples([sample(5)], 1_000_000_000)
    assert len(state.processes[5].history) == 1 and not views[0].history


def test_late_events_of_a_pid_s_earlier_process_leave_the_process_now_under_it_alone() -> None:
    """On a host that forks thousands a second, pid_max (32,768) comes round in seconds, and a
    flood holds events back for seconds: the events of a short-lived child that had a failing
    program's pid before it come after that program's sample. They once took its row (a new
    view for the earlier process, ended, and not failing) until its next sample."""
    state = IncidentState()
    failing = dataclasses.replace(sample(777, open_fds=40), comm="emfile-0", start_ns=9_000_000_000,
                                  fd_soft_limit=40)
    state.apply_samples([failing], 9_500_000_000)
    state.apply_events(decode_table(*[record(Kind.SOCKET, pid=777, ts=4_400_000_000 + i, syscall=SYSCALL_IDS["socket"],
                                             ret=-24, errno=24, comm=b"emfile-0") for i in range(3)]))
    assert state.processes[777].failed
    # the earlier owner of pid 777, started at boot time 6 s and ended at once (its events decoded
    # from its own start: the clock offsets put boot time 5 s ahead of the stamps)
    connect = struct.pack("<H", socket.AF_INET) + struct.pack(">H", 8080) + socket.inet_aton("10.0.0.5")
    earlier = decode_table(record(Kind.PROCESS_START, pid=777, ts=1_000_000_000, extra=[100, 0, 0, 0],
                                  comm=b"fdt-forkloop"),
                           record(Kind.CONNECT, pid=777, ts=1_000_050_000, syscall=SYSCALL_IDS["connect"], fd=3,
                                  extra=sockaddr(connect), comm=b"fdt-forkloop"),
                           record(Kind.PROCESS_EXIT, pid=777, ts=1_000_100_000, extra=[1, 0, 0, 0],
                                  comm=b"fdt-forkloop"),
                           record(Kind.SOCKET, pid=778, ts=1_000_200_000, syscall=SYSCALL_IDS["socket"], ret=4, fd=4))
    assert earlier["start_ns"].to_pylist() == [6_000_000_000] * 3 + [None]
    state.apply_events(earlier)
    view = state.processes[777]
    assert (view.comm, view.start_ns, view.ended) == ("emfile-0", 9_000_000_000, None)
    assert view.failed and view.errors == {("socket", "EMFILE"): 3} and view.totals["process_exit"] == 0
    assert view.destinations == {}
    assert state.forgotten == 1
    # a later process under the pid still takes the row, as a reused pid always did
    later = decode_table(record(Kind.PROCESS_START, pid=777, ts=5_000_000_000, extra=[100, 0, 0, 0],
                                comm=b"fdt-forkloop"))
    state.apply_events(later)
    assert (state.processes[777].comm, state.processes[777].start_ns) == ("fdt-forkloop", 10_000_000_000)
