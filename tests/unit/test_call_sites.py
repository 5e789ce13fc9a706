"""The pure parts of --stacks: site names, leaks and growth from fd_sites rows, the thread census
in words, and the live view's thread-limit alert."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fdtrace.analysis.call_sites import leaks
from fdtrace.procfs import ProcFS
from fdtrace.procfs.threads import describe_state, thread_census
from fdtrace.schema.records import ThreadState
from fdtrace.schema.site_names import DNS_LOOKUP_SITE, code_site, site_name, thread_reason, to_thread_start
from fdtrace.tui.state import ProcessView

S = 1_000_000_000


def test_a_site_is_named_by_its_first_frame_outside_libc_and_go_plumbing() -> None:
    assert site_name(["__socket+0x7 [libc.so.6]", "leak+0x27 [app]", "main+0x29 [app]"]) == "leak+0x27 [app]"
    assert site_name(["syscall.Syscall+0x2a [app]", "net.sysSocket+0x40 [app]"]) == "net.sysSocket+0x40 [app]"
    assert site_name(["clone3+0x19 [libc.so.6]"]) == "clone3+0x19 [libc.so.6]"
    assert site_name([]) == "(no stack)"


def rows(*entries: tuple[int, int | None, int, int]) -> pd.DataFrame:
    """fd_sites rows: (seconds, stack_id, open, opened)."""
    return pd.DataFrame([{"ts_ns": t * S, "pid": 7, "comm": "app", "origin": "traced" if sid else "before_tracing",
                          "stack_id": sid, "open": n, "opened": o if sid else None, "closed": (o - n) if sid else None,
                          "oldest_ns": S if sid else None} for t, sid, n, o in entries])


STACKS = pd.DataFrame([{"stack_id": 11, "pid": 7, "comm": "app", "frames": ["__socket+0x7 [libc.so.6]",
                                                                              "leak+0x27 [app]"], "truncated": None},
                       {"stack_id": 12, "pid": 7, "comm": "app", "frames": ["__socket+0x7 [libc.so.6]",
                                                                              "pool+0x10 [app]"], "truncated": None}])


def test_leaks_takes_the_last_figures_and_the_growth_over_the_window() -> None:
    sites = rows((1, 11, 10, 10), (31, 11, 40, 40), (61, 11, 70, 70), (1, 12, 5, 5), (61, 12, 0, 9), (1, None, 3, 0))
    found = leaks(sites, STACKS, end_ns=61 * S, window_s=60)
    assert found["site"].tolist() == ["leak+0x27 [app]", "(from before tracing)"]  # pool's were all closed
    leak = found.iloc[0]
    assert (leak["open"], leak["opened"], leak["closed"]) == (70, 70, 0)
    assert leak["growth_per_min"] == 60.0  # 10 open at 1 s, 70 at 61 s
    assert leak["oldest_age_s"] == 60.0
    assert found.iloc[1]["open"] == 3


def test_growth_counts_from_zero_for_a_site_first_seen_inside_the_window() -> None:
    sites = rows((1, 12, 1, 1), (31, 11, 30, 30))
    found = leaks(sites, STACKS, end_ns=31 * S, window_s=60)
    leak = found[found["site"] == "leak+0x27 [app]"].iloc[0]
    assert leak["growth_per_min"] == 60.0  # 30 in the 30 s the recording spans


def test_the_census_in_words() -> None:
    assert describe_state(ThreadState("read", "file", 412)) == "412 threads blocked in read() on regular files"
    assert describe_state(ThreadState("futex", None, 1)) == "1 thread blocked in futex()"
    assert describe_state(ThreadState("epoll_wait", "anon:eventpoll", 2)) == \
        "2 threads blocked in epoll_wait() on eventpoll descriptors"
    assert describe_state(ThreadState("running", None, 3)) == "3 threads running"
    assert describe_state(ThreadState("read", "pipe", 120, "main.holdThread")) == \
        "120 threads blocked in read() on pipes at main.holdThread"


def test_the_code_a_blocked_thread_waits_in_is_its_first_frame_of_its_own() -> None:
    assert code_site(["runtime/internal/syscall.Syscall6+0xe [hold]", "syscall.RawSyscall6+0x13 [hold]",
                      "syscall.read+0x45 [hold]", "main.holdThread+0x2b [hold]", "main.main.func1+0x26 [hold]"]) \
        == "main.holdThread"
    assert code_site(["read+0x12 [libc.so.6]", "fetch_one+0x30 [app]", "main+0x10 [app]"]) == "fetch_one"
    assert code_site(["runtime.futex.abi0+0x23 [hold]", "runtime.mstart0+0x79 [hold]"]) is None  # the runtime's
    assert code_site(["read+0x12 [libc.so.6]", "0x7f00deadbeef"]) is None
    # a thread in the C library's resolver waits on DNS, whatever called it (a cgo lookup here)
    resolver = ["poll+0x4f [libc.so.6]", "send_dg+0x24d [libc.so.6]", "__res_context_send+0x1fb [libc.so.6]",
                "_nss_dns_gethostbyname4_r+0x251 [libc.so.6]"]
    assert code_site(resolver) == DNS_LOOKUP_SITE == "the C library's DNS lookup (getaddrinfo)"
    assert code_site([*resolver, "_cgo_Cfunc_getaddrinfo+0x10 [server]"]) == DNS_LOOKUP_SITE
    assert code_site(["getaddrinfo+0x10 [app]", "main+0x1 [app]"]) == "getaddrinfo"  # the program's own, not libc's


def test_the_census_groups_blocked_threads_by_the_code_they_wait_in(tmp_path: Path) -> None:
    from tests.fakeproc import fake_process, write_files

    fake_process(tmp_path, 50, "server", {3: "pipe:[7]", 4: "socket:[9]"})
    threads = {51: "0 0x3 0x1 0x1 0 0 0 0x7ffd1000 0x401000", 52: "0 0x3 0x1 0x1 0 0 0 0x7ffd2000 0x401000",
               53: "0 0x4 0x1 0x1 0 0 0 0x7ffd3000 0x402000", 54: "running", 55: "0 0x3 0x1 0x1 0 0 0 0x7ffd4000 0x0"}
    write_files(tmp_path, {f"50/task/{tid}/syscall": text + "\n" for tid, text in threads.items()})
    sites = {0x401000: "main.holdThread", 0x402000: "net.serve"}
    asked: list[tuple[int, int, int, int]] = []

    def site_of(pid: int, tid: int, pc: int, sp: int) -> str | None:
        asked.append((pid, tid, pc, sp))
        return sites.get(pc)

    census = thread_census(ProcFS(tmp_path), 50, lambda number: {0: "read"}.get(number, str(number)), site_of)
    assert census == [ThreadState("read", "pipe", 2, "main.holdThread"), ThreadState("read", "pipe", 1, None),
                      ThreadState("read", "socket", 1, "net.serve"), ThreadState("running", None, 1)]
    assert sorted(asked) == [(50, 51, 0x401000, 0x7ffd1000), (50, 52, 0x401000, 0x7ffd2000),
                             (50, 53, 0x402000, 0x7ffd3000), (50, 55, 0x0, 0x7ffd4000)]


def go_view(counts: list[int], limit: int = 10_000) -> ProcessView:
    view = ProcessView(pid=9, comm="server")
    view.thread_history = [(i * 5 * S, n) for i, n in enumerate(counts)]
    view.threads = counts[-1]
    view.thread_limit = ("Go default", counts[-1], limit)
    view.census = [ThreadState("running", None, 2), ThreadState("read", "file", counts[-1] - 10)]
    return view


def test_steady_thread_growth_alerts_with_the_time_to_the_limit_and_the_dominant_syscall() -> None:
    view = go_view([1000, 1500, 2000, 2500, 3000])  # 100 threads a second, 7000 to go
    assert view.seconds_to_thread_limit() == 70.0
    assert view.thread_growth() == 100.0
    assert ("2990 threads blocked in read() on regular files, 100 new per second, thread limit (Go default) in 70s"
            in view.alerts)
    slow = go_view([1000, 1002, 1004, 1006, 1008], limit=1010)  # 0.4 a second, 2 to go
    assert "0.4 new per second, thread limit (Go default) in 5s" in " ".join(slow.alerts)


def test_no_alert_for_threads_that_also_shrink_or_hold() -> None:
    assert go_view([1000, 1500, 1400, 2500, 3000]).seconds_to_thread_limit() is None
    assert go_view([1000, 1000, 1000, 1000]).seconds_to_thread_limit() is None
    assert go_view([1000, 1001]).seconds_to_thread_limit() is None  # too short to call it steady
    far = go_view([1000, 1001, 1002, 1003, 1004])  # hours away
    assert far.seconds_to_thread_limit() is not None
    assert not any("thread limit" in alert for alert in far.alerts)


def test_a_creation_site_ends_at_the_creating_threads_start_and_says_why() -> None:
    storm = ["runtime.clone.abi0+0x2f [storm]", "runtime.newm1+0x9a [storm]", "runtime.newm+0xd8 [storm]",
             "runtime.startm+0x10f [storm]", "runtime.handoffp+0x2c9 [storm]", "runtime.retake+0x1f5 [storm]",
             "runtime.sysmon+0x2c6 [storm]", "runtime.mstart1+0x93 [storm]", "runtime.mstart0+0x79 [storm]",
             "time.Sleep+0x135 [storm]", "main.main+0x1b [storm]"]  # stale words past mstart0
    assert to_thread_start(storm) == storm[:9]
    assert thread_reason(storm).startswith("a goroutine blocked in a syscall: its P was handed to a new thread")
    c = ["__GI___clone3+0x19 [libc.so.6]", "__clone_internal+0x2d [libc.so.6]", "pthread_create+0x5a [libc.so.6]",
         "spawn_workers+0x33 [sites]", "main+0x60 [sites]", "__libc_start_call_main+0x7a [libc.so.6]",
         "__libc_start_main+0x85 [libc.so.6]"]
    assert to_thread_start(c) == c[:6] and thread_reason(c) == ""
    assert to_thread_start([]) == []


NEWCOMER = Path(__file__).parents[1] / "data" / "newcomer"


def test_leaks_keep_integers_integers_and_print_no_nan(capsys: pytest.CaptureFixture[str]) -> None:
    """tests/data/newcomer (record --stacks) one second into burst-64's sockets: its site beside
    descriptors from before the tracing, which have no stack and no counts."""
    import json

    from fdtrace.analysis import load
    from fdtrace.cli.call_sites import _emit_leaks

    recording = load(NEWCOMER)
    sites = recording.fd_sites
    cut = int(sites[sites["comm"] == "burst-64"]["ts_ns"].min()) + S
    table = leaks(sites[sites["ts_ns"] <= cut], recording.stacks)
    assert {"(from before tracing)", "socket"} <= set(table["site"].str.split("+").str[0])
    _emit_leaks(table, "leaks", {}, True, {})
    [burst] = [site for site in json.loads(capsys.readouterr().out)["sites"] if site["comm"] == "burst-64"
               and site["stack_id"] is not None]
    assert isinstance(burst["stack_id"], int) and isinstance(burst["opened"], int)
    assert burst["stack_id"] == int(recording.stacks["stack_id"][recording.stacks["stack_id"] == burst["stack_id"]]
                                    .iloc[0])  # all 64 bits
    _emit_leaks(table, "leaks", {}, False, {})
    text = capsys.readouterr().out
    assert "nan" not in text.lower() and "<NA>" not in text and "(stack may be incomplete: the walk" in text


def test_a_huge_udp_table_is_read_up_to_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fdtrace.procfs import threads

    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

    def line(n: int, port: str, inode: int) -> str:
        return f"{n:5}: 0100007F:A000 0100007F:{port} 01 00000000:00000000 00:00000000 00000000 0 0 {inode} 2\n"
    planted = header + line(0, "0035", 1001) + "".join(line(i, "1F90", 2000 + i) for i in range(1, 200))
    planted += line(200, "0035", 9999)  # past the bound: not seen
    (tmp_path / "7" / "net").mkdir(parents=True)
    (tmp_path / "7" / "net" / "udp").write_text(planted)
    monkeypatch.setattr(threads, "MAX_UDP_TABLE_BYTES", 100 * len(line(1, "1F90", 2001)))
    assert threads.dns_socket_inodes(ProcFS(tmp_path), 7) == {1001}
    monkeypatch.setattr(threads, "MAX_UDP_TABLE_BYTES", len(planted) + 1)
    assert threads.dns_socket_inodes(ProcFS(tmp_path), 7) == {1001, 9999}
