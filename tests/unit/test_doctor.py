"""Every doctor check against a fake /proc and /sys/fs/cgroup tree."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from fdtrace.advice.haproxy import HaproxyShape
from fdtrace.doctor import report
from fdtrace.doctor.checks import Doctor, Status
from fdtrace.integrations.haproxy import parse_config
from fdtrace.procfs.golang import BUILDINFO_MAGIC
from tests import fakeproc
from tests.fakeproc import write_files

# Processes of the doctor's tests live in a systemd unit's cgroup and run a plain executable.
fake_process = partial(fakeproc.fake_process, cgroup="0::/app.slice/app.service", exe=b"\x7fELF plain")


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    write_files(proc, {
        "sys/fs/file-nr": "900\t0\t1000\n", "sys/fs/nr_open": "1048576\n", "sys/kernel/threads-max": "100000\n",
        "sys/kernel/pid_max": "32768\n", "sys/net/core/somaxconn": "128\n",
        "sys/net/ipv4/tcp_max_syn_backlog": "8192\n", "sys/net/ipv4/tcp_tw_reuse": "0\n",
        "net/netstat": "TcpExt: ListenOverflows ListenDrops\nTcpExt: 5 7\n",
    })
    write_files(cgroups, {"app.slice/app.service/pids.current": "97\n", "app.slice/app.service/pids.max": "100\n"})
    return proc, cgroups


def doctor(tree: tuple[Path, Path]) -> Doctor:
    return Doctor(tree[0], systemctl=None, cgroupfs=tree[1])


def by_name(checks: list, name: str):  # type: ignore[no-untyped-def]
    [check] = [c for c in checks if c.name == name]
    return check


def test_fd_limit_warns_at_80_and_fails_at_95_with_the_change_to_make(tree: tuple[Path, Path]) -> None:
    fake_process(tree[0], 10, "warm", 85, "100", "4096")
    fake_process(tree[0], 11, "full", 96, "100", "100")
    fake_process(tree[0], 12, "calm", 10, "100", "100")
    checks = doctor(tree)
    warm = by_name(checks.process_checks(10), "RLIMIT_NOFILE soft")
    assert (warm.status, warm.recommended) == (Status.WARN, ">= 102")
    assert warm.change.startswith("prlimit --pid 10 --nofile=102:4096 now; for good: set LimitNOFILE=102:4096 in")
    full = by_name(checks.process_checks(11), "RLIMIT_NOFILE soft")
    assert full.status == Status.FAIL and "raise the soft and hard limits to 116" in full.change
    assert by_name(checks.process_checks(12), "RLIMIT_NOFILE soft").status == Status.OK
    source = by_name(checks.process_checks(12), "RLIMIT_NOFILE source")
    assert source.current == "systemd unit app.service"


def test_recorded_peak_raises_the_recommendation(tree: tuple[Path, Path]) -> None:
    fake_process(tree[0], 10, "spiky", 10, "100", "4096")
    checks = doctor(tree)
    checks.peaks[10] = 97
    check = by_name(checks.process_checks(10), "RLIMIT_NOFILE soft")
    assert check.status == Status.FAIL and check.recommended == ">= 117" and "peak 97" in check.current


def test_threads_against_nproc_cgroup_and_go(tree: tuple[Path, Path]) -> None:
    go_exe = b"\x7fELF" + b"\0" * 5000 + BUILDINFO_MAGIC + b"\0" * 100
    fake_process(tree[0], 20, "gosrv", 5, "1024", "1024", threads=8500, nproc="10000", exe=go_exe)
    checks = doctor(tree).process_checks(20)
    nproc = by_name(checks, "RLIMIT_NPROC (threads of uid 1000)")
    assert nproc.status == Status.WARN and nproc.current == "8500 of 10000"
    pids = by_name(checks, "cgroup pids.max")
    assert pids.status == Status.FAIL and pids.current == "97 tasks of 100"
    go = by_name(checks, "Go thread limit")
    assert go.status == Status.WARN and "8500 threads of Go's default 10000" in go.current
    # the number and the function, as the report says them (issue 33)
    assert go.recommended == "SetMaxThreads >= 10200" and go.change.endswith("runtime/debug.SetMaxThreads(10200)")
    fake_process(tree[0], 21, "cprog", 5, "1024", "1024", threads=8500)
    assert not [c for c in doctor(tree).process_checks(21) if c.name == "Go thread limit"]


def test_a_memory_cgroup_near_its_limit_fails_and_one_far_from_it_is_ok(tree: tuple[Path, Path]) -> None:
    fake_process(tree[0], 30, "hoard", 5, "1024", "1024", cgroup="0::/app.slice/hoard.service")
    fake_process(tree[0], 31, "calm", 5, "1024", "1024", cgroup="0::/app.slice/calm.service")
    write_files(tree[1], {"app.slice/hoard.service/memory.max": f"{150 << 20}\n",
                          "app.slice/hoard.service/memory.current": f"{146 << 20}\n",
                          "app.slice/calm.service/memory.max": f"{1 << 30}\n",
                          "app.slice/calm.service/memory.current": f"{20 << 20}\n"})
    checks = doctor(tree)
    near = by_name(checks.process_checks(30), "memory cgroup")
    assert (near.status, near.current) == (Status.FAIL, "146 MiB of 150 MiB (97%)")
    assert near.recommended == "MemoryMax >= 176M"
    # set in the unit its cgroup names (advice.memory.memory_change), to the figure recommended
    assert near.change == ("raise MemoryMax= in [Service] of hoard.service (memory.max of its cgroup) to 176M, or find "
                           "what holds the memory")
    calm = by_name(checks.process_checks(31), "memory cgroup")
    assert (calm.status, calm.current, calm.change) == (Status.OK, "20 MiB of 1,024 MiB (2%)", "")


def test_go_thread_growth_in_a_recording_warns_before_the_limit(tree: tuple[Path, Path]) -> None:
    go_exe = b"\x7fELF" + BUILDINFO_MAGIC
    fake_process(tree[0], 22, "gosrv", 5, "1024", "1024", threads=400, exe=go_exe)
    checker = doctor(tree)
    checker.thread_growth[22] = 100.0
    go = by_name(checker.process_checks(22), "Go thread limit")
    assert go.status == Status.WARN and "growing 100/s in the recording: the limit in 96 s" in go.current


def test_haproxy_maxconn_the_fd_limit_cannot_hold(tree: tuple[Path, Path], tmp_path: Path) -> None:
    config = tmp_path / "haproxy.cfg"
    config.write_text("global\n    maxconn 1000\n    ulimit-n 4000\n    no strict-limits\n"
                      f"    stats socket {tmp_path}/nobody.sock mode 600\n"
                      "defaults\n    mode tcp\nfrontend fe\n    bind 127.0.0.1:1\n    default_backend be\n"
                      "backend be\n    server s1 127.0.0.1:2\n")
    parsed = parse_config(config)
    assert (parsed.maxconn, parsed.ulimit_n, parsed.strict_limits, parsed.listeners) == (1000, 4000, False, 1)
    # root's haproxy (a configuration is read only as its process could: uid 1000 may not search
    # pytest's folders of root's)
    fake_process(tree[0], 30, "haproxy", 20, "1024", "1024", cmdline=f"/usr/sbin/haproxy -f {config}", uid=0)
    checks = doctor(tree).process_checks(30)
    maxconn = by_name(checks, "haproxy maxconn vs FD limit")
    assert maxconn.status == Status.FAIL
    # 2028 as haproxy 2.6 counts it for this shape (show info's Maxsock: 1 bind, 1 stats socket, 2 threads)
    assert maxconn.recommended == "FD limit >= 2434 (RLIMIT_NOFILE soft, above), or maxconn <= 498"
    # one FD limit recommended: the RLIMIT_NOFILE check's, from what maxconn needs (not from the 20 open)
    soft = by_name(checks, "RLIMIT_NOFILE soft")
    assert (soft.status, soft.recommended) == (Status.FAIL, ">= 2434") and "its maxconn needs ~2028" in soft.change
    assert HaproxyShape(nbthread=2, binds=1, stats_sockets=1).maxsock(1000) == 2028
    assert by_name(checks, "haproxy ulimit-n").current == "config says 4000, the process has 1024"
    assert by_name(checks, "haproxy strict-limits").status == Status.WARN
    assert "did not answer" in by_name(checks, "haproxy stats socket").current


def test_system_checks(tree: tuple[Path, Path]) -> None:
    checks = doctor(tree).system_checks()
    assert by_name(checks, "fs.file-max vs file-nr").status == Status.WARN
    assert by_name(checks, "net.core.somaxconn").change == "sysctl -w net.core.somaxconn=65535 (and in /etc/sysctl.d/)"
    assert by_name(checks, "net.ipv4.tcp_max_syn_backlog").status == Status.OK
    assert by_name(checks, "net.ipv4.tcp_tw_reuse").status == Status.WARN
    listen = by_name(checks, "TcpExt ListenOverflows / ListenDrops since boot")
    assert listen.current == "5 ListenOverflows, 7 ListenDrops"
    assert "sysctl -w net.core.somaxconn=65535" in listen.change
    moved = doctor(tree).system_checks(listen_moved={"ListenOverflows": 0, "ListenDrops": 0})
    assert by_name(moved, "TcpExt ListenOverflows / ListenDrops during the recording").status == Status.OK
    # when the listener was failing accept() with EMFILE, the overflow is its symptom: one change, not somaxconn
    symptom = doctor(tree)
    symptom.accept_failures = ["haproxy [22669]"]
    listen = by_name(symptom.system_checks(listen_moved={"ListenOverflows": 3, "ListenDrops": 3}),
                     "TcpExt ListenOverflows / ListenDrops during the recording")
    assert listen.change.startswith("a symptom: accept() failed with EMFILE in haproxy [22669]")
    assert "not somaxconn" in listen.change


def test_sum_of_big_consumers_against_file_max(tree: tuple[Path, Path]) -> None:
    fake_process(tree[0], 40, "a", 5, "800", "800")
    fake_process(tree[0], 41, "b", 5, "800", "800")
    checks = doctor(tree).system_checks(consumers=[40, 41])
    check = by_name(checks, "sum of the big consumers' FD limits vs fs.file-max")
    assert check.status == Status.WARN and check.current == "1600 (2 processes) against 1000"


def test_report_table_json_and_exit_status(tree: tuple[Path, Path]) -> None:
    fake_process(tree[0], 11, "full", 96, "100", "100")
    checker = doctor(tree)
    checks = report.run_checks(checker, [11], None)
    assert report.worst(checks) == Status.FAIL
    data = json.loads(report.as_json(checks))
    assert data["status"] == "FAIL"
    assert {"scope", "name", "status", "current", "recommended", "change"} <= set(data["checks"][0])
    table = report.as_table(checks)
    assert table.splitlines()[0].split() == ["STATUS", "SCOPE", "CHECK", "CURRENT", "RECOMMENDED"]
    assert "Changes:" in table and table.endswith("overall: FAIL")
    assert report.select_pids(checker, (), ("full",)) == [11]


def test_systemd_unit_limit_is_read_through_systemctl(tree: tuple[Path, Path], tmp_path: Path) -> None:
    systemctl = tmp_path / "systemctl"
    systemctl.write_text("#!/bin/sh\n[ \"$1 $2 $3 $4 $5 $6\" = \"show -p LimitNOFILE -p LimitNOFILESoft app.service\" ]"
                         " || exit 1\nprintf 'LimitNOFILE=524288\\nLimitNOFILESoft=1024\\n'\n")
    systemctl.chmod(0o755)
    fake_process(tree[0], 50, "svc", 900, "1024", "524288")
    checker = Doctor(tree[0], systemctl=str(systemctl), cgroupfs=tree[1])
    checks = checker.process_checks(50)
    source = by_name(checks, "RLIMIT_NOFILE source")
    assert source.current == "systemd unit app.service (LimitNOFILE=524288 LimitNOFILESoft=1024)"
    soft = by_name(checks, "RLIMIT_NOFILE soft")
    assert soft.status == Status.WARN
    assert soft.change == ("prlimit --pid 50 --nofile=1080:524288 now; for good: set LimitNOFILE=1080:524288 in "
                           "[Service] of app.service, then systemctl daemon-reload && systemctl restart app.service")


def test_limit_source_is_the_parent_only_when_the_parent_has_the_same_limit(tree: tuple[Path, Path]) -> None:
    plain = partial(fakeproc.fake_process, cgroup="0::/user.slice/session-1.scope", exe=b"\x7fELF plain")
    plain(tree[0], 60, "launcher", 5, "1024", "4096")
    plain(tree[0], 61, "worker", 5, "1024", "4096", ppid=60)
    plain(tree[0], 62, "haproxy", 5, "256", "4096", ppid=60)
    checks = doctor(tree)
    assert by_name(checks.process_checks(61), "RLIMIT_NOFILE source").current == (
        "inherited from its parent pid 60 (launcher), whose soft limit is the same")
    assert by_name(checks.process_checks(62), "RLIMIT_NOFILE source").current == (
        "set for this process: by its own setrlimit (or its start script's ulimit), or by a prlimit; its parent "
        "pid 60 (launcher) has 1024")


def test_the_need_of_a_process_that_failed_comes_from_what_it_asked_for() -> None:
    from fdtrace.analysis.needs import need_of

    # haproxy capped at 256 FDs, refusing 120 accepts in its worst second, sized itself for 8220
    assert need_of(256, 256, 40_867, 120, 8220) == (8220, "HAProxy's Maxsock 8220 (show info)")
    assert need_of(256, 256, 40_867, 120, None) == (
        376, "its limit 256 plus the 120 opens refused with EMFILE in its worst second")
    assert need_of(1024, 900, 0, 0, None) == (900, "peak 900 open")
    assert need_of(256, 20, 0, 0, None, config_need=2017) == (2017, "its maxconn needs ~2017")


EMFILE_RECORDING = Path(__file__).parents[1] / "data" / "emfile"


def test_doctor_from_a_recording_checks_a_process_that_is_gone() -> None:
    from click.testing import CliRunner

    from fdtrace.cli import main

    for selection in (["--comm", "emfile-child"], ["--pid", "15007"]):
        result = CliRunner().invoke(main, ["doctor", "--from", str(EMFILE_RECORDING), "--json", *selection])
        assert result.exit_code == 2, result.output
        checks = [c for c in json.loads(result.output)["checks"] if "emfile-child, gone" in c["scope"]]
        soft = next(c for c in checks if c["name"] == "RLIMIT_NOFILE soft")
        # capped at 64, it asked for 4 more in one second: never the capped peak's 77
        assert (soft["status"], soft["current"], soft["recommended"]) == (
            "FAIL", "64 (peak 64 open, 4 EMFILE failures, 100%)", ">= 82")
        assert "it ended: exit 1" in next(c for c in checks if c["name"] == "RLIMIT_NOFILE source")["current"]
    for selection, said in ((["--comm", "no-such-program"], "no process named no-such-program, running or in the "
                             "recording"), (["--pid", "4194304"], "no such process: 4194304, running or in the "
                                            "recording")):
        result = CliRunner().invoke(main, ["doctor", "--from", str(EMFILE_RECORDING), *selection])
        assert result.exit_code != 0 and result.output.strip().splitlines() == [f"fdtrace: error: {said}"]
    alive_only = CliRunner().invoke(main, ["doctor", "--comm", "emfile-child"])
    assert alive_only.exit_code != 0 and "give --from RECORDING" in alive_only.output


def test_haproxy_need_is_written_with_the_numbers_it_adds(tree: tuple[Path, Path], tmp_path: Path) -> None:
    """Issue 25: doctor said "2 per connection ... 1 listeners" while it added more. Its text now
    writes every term it adds, and a bind line of two addresses is two listeners."""
    import re

    config = tmp_path / "haproxy.cfg"
    config.write_text("global\n    maxconn 100\n    nbthread 2\n"
                      f"    stats socket {tmp_path}/nobody.sock mode 600\n"
                      "defaults\n    mode tcp\nfrontend fe\n    bind 127.0.0.1:1,127.0.0.1:3\n    default_backend be\n"
                      "backend be\n    server s1 127.0.0.1:2\n")
    assert parse_config(config).listeners == 2
    fake_process(tree[0], 31, "haproxy", 20, "1024", "1024", cmdline=f"/usr/sbin/haproxy -f {config}", uid=0)
    maxconn = by_name(doctor(tree).process_checks(31), "haproxy maxconn vs FD limit")
    terms = re.search(r"needs (\d+) FDs as HAProxy counts them \(Maxsock: 2 x (\d+) connections \+ 3 x (\d+) threads "
                      r"\+ (\d+) listeners \+ (\d+) of the stats CLI \+ (\d+) reserved = (\d+); the listeners: 2 "
                      r"bound, 1 stats socket\)", maxconn.current)
    assert terms is not None, maxconn.current
    need, conns, threads, listeners, cli, reserved, total = map(int, terms.groups())
    assert 2 * conns + 3 * threads + listeners + cli + reserved == total == need == 229
    assert HaproxyShape(nbthread=2, binds=2, stats_sockets=1).maxsock(100) == 229


def test_doctor_from_does_not_call_the_systems_tasks_haproxys_peak() -> None:
    """tests/data/newcomer: haproxy's binding thread limit is threads-max, whose count is every
    task on the system; doctor --from says so and gives haproxy's own threads."""
    import json

    from click.testing import CliRunner

    from fdtrace.analysis import load
    from fdtrace.cli import main

    recording = Path(__file__).parents[1] / "data" / "newcomer"
    events = load(recording).events
    pid = int(events[events["comm"] == "haproxy"]["pid"].iloc[0])  # by pid: a live haproxy may run here
    result = CliRunner().invoke(main, ["doctor", "--from", str(recording), "--pid", str(pid), "--json"])
    [check] = [c for c in json.loads(result.output)["checks"] if c["name"] == "threads-max (threads)"]
    assert "tasks on the system of 192724" in check["current"] and "it ran 2 threads" in check["current"]
    assert not check["current"].startswith("peak")
