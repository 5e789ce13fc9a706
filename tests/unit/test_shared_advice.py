"""One rule, one wording: the report's "What to change" and doctor's changes take the words of
each fix from ``fdtrace.analysis.report.advice``, so the same recording reads the same in both."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pandas as pd

from fdtrace.advice.change import fd_hard_to_set, fd_limit_ways
from fdtrace.advice.fixes import (
    file_max_change,
    file_max_needed,
    go_exceeded_change,
    listen_fix,
    thread_change,
)
from fdtrace.analysis import least_headroom, load
from fdtrace.analysis.engines.dataset import Recording
from fdtrace.analysis.needs import fd_needs
from fdtrace.analysis.report import build, recommendations
from fdtrace.doctor.checks import Doctor, Status
from fdtrace.doctor.report import apply_recording
from tests import fakeproc
from tests.fakeproc import write_files

EMFILE = Path(__file__).parents[1] / "data" / "emfile"
fake_process = partial(fakeproc.fake_process, cgroup="0::/app.slice/app.service", exe=b"\x7fELF plain")


def doctor_on(tmp_path: Path) -> Doctor:
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    write_files(proc, {
        "sys/fs/file-nr": "900\t0\t100000\n", "sys/fs/nr_open": "1048576\n", "sys/kernel/threads-max": "100000\n",
        "sys/kernel/pid_max": "32768\n", "sys/net/core/somaxconn": "4096\n",
        "net/netstat": "TcpExt: ListenOverflows ListenDrops\nTcpExt: 5 0\n",
    })
    cgroups.mkdir(parents=True)
    return Doctor(proc, systemctl=None, cgroupfs=cgroups)


def test_the_fd_limit_to_set_reads_the_same_in_the_report_and_doctor(tmp_path: Path) -> None:
    [row] = fd_needs(load(EMFILE)).query("pid == 15007").itertuples()
    target = int(row.recommended)
    hard = None if pd.isna(row.fd_hard_limit) else int(row.fd_hard_limit)
    ways = fd_limit_ways(target, fd_hard_to_set(target, hard))
    [line] = [r for r in build(load(EMFILE)).recommendations if r.startswith("RLIMIT_NOFILE of emfile-child [15007]")]
    assert f"set it to {target} ({ways})." in line
    doctor = doctor_on(tmp_path)  # the process is gone: doctor --from knows it from the recording only
    apply_recording(EMFILE, doctor, [15007])
    [check] = [c for c in doctor.process_checks(15007) if c.name == "RLIMIT_NOFILE soft"]
    assert check.status == Status.FAIL and check.recommended == f">= {target}"
    assert f"raise it where emfile-child is started ({ways})" in check.change


def test_a_thread_limit_fix_reads_the_same_in_the_report_and_doctor(tmp_path: Path) -> None:
    seconds = range(6)
    start = pd.Timestamp("2026-11-30 04:00:00", tz="UTC")
    samples = pd.DataFrame({
        "ts_ns": [i * 1_000_000_000 for i in seconds], "time": [start + pd.Timedelta(seconds=i) for i in seconds],
        "host": "h", "pid": 5, "start_ns": 99, "comm": "gopher", "open_fds": 10, "fd_soft_limit": 1024,
        "fd_hard_limit": 4096, "threads": 3500, "sockets": 0, "go_max_threads": None,
        "nproc_soft_limit": 4000, "user_threads": 3500, "pids_max": None, "pids_current": None,
    })
    recording = Recording(events=pd.DataFrame(), samples=samples, system=pd.DataFrame(), losses=pd.DataFrame(),
                          counters=pd.DataFrame(), clock=pd.DataFrame(), haproxy=pd.DataFrame(),
                          phases=pd.DataFrame())
    change = thread_change("RLIMIT_NPROC", 3500, 4000)  # 3500 threads of the user, with the margin
    assert change is not None and change.value == 4200
    fix = change.command
    assert f"RLIMIT_NPROC of gopher [5]: peak 3500 threads of its user of 4000; {fix}." in recommendations(
        recording, least_headroom(recording))
    doctor = doctor_on(tmp_path)
    fake_process(tmp_path / "proc", 5, "gopher", 10, "1024", "4096", threads=3500, nproc="4000")
    [check] = [c for c in doctor.process_checks(5) if c.name.startswith("RLIMIT_NPROC")]
    assert (check.status, check.recommended, check.change) == (Status.WARN, ">= 4200", fix)


def test_a_listen_queue_overflow_is_said_in_the_shared_words(tmp_path: Path) -> None:
    [check] = [c for c in doctor_on(tmp_path).system_checks() if c.name.startswith("TcpExt")]
    assert check.change == listen_fix(None, 4096)
    assert check.change == ("a listen queue overflowed: sysctl -w net.core.somaxconn=65535 (and in /etc/sysctl.d/), "
                            "and raise the listener's backlog, or accept faster")


def test_the_file_max_to_set_reads_the_same_in_the_report_and_doctor(tmp_path: Path) -> None:
    # 90,000 handles of 100,000: the file table is at the warning share in both
    start = pd.Timestamp("2026-11-30 04:00:00", tz="UTC")
    system = pd.DataFrame({"ts_ns": [0, 10**9], "time": [start, start + pd.Timedelta(seconds=1)], "host": "h",
                           "file_nr": [85_000, 90_000], "file_max": [100_000, 100_000]})
    recording = Recording(events=pd.DataFrame(), samples=pd.DataFrame(), system=system, losses=pd.DataFrame(),
                          counters=pd.DataFrame(), clock=pd.DataFrame(), haproxy=pd.DataFrame(),
                          phases=pd.DataFrame())
    needed = file_max_needed(90_000, 100_000)
    assert needed is not None and needed > 2 * 90_000 and file_max_needed(70_000, 100_000) is None
    [line] = [r for r in recommendations(recording, least_headroom(recording)) if r.startswith("fs.file-max")]
    change = file_max_change(90_000, 100_000)
    assert change is not None and change.value == needed
    assert f"set it to at least {needed:,}: {change.command}." in line
    doctor = doctor_on(tmp_path)
    (tmp_path / "proc" / "sys/fs/file-nr").write_text("90000\t0\t100000\n")
    (tmp_path / "proc" / "sys/fs/file-max").write_text("100000\n")
    [check] = [c for c in doctor.system_checks() if c.name == "fs.file-max vs file-nr"]
    assert (check.status, check.recommended, check.change) == (Status.WARN, f">= {needed}", change.command)


def test_a_go_program_that_exceeded_its_limit_gets_one_set_max_threads_everywhere() -> None:
    """tests/data/newcomer: go-threads said "program exceeds 300-thread limit" and exited 2. The
    report, info, doctor --from and the live view's detail (a replay) render the advice layer's
    one change: SetMaxThreads(360), and the report says it once."""
    from click.testing import CliRunner

    from fdtrace.analysis.summary import summary
    from fdtrace.cli import main
    from tests.helpers import replayed_detail

    newcomer = Path(__file__).parents[1] / "data" / "newcomer"
    events = load(newcomer).events
    pid = int(events[events["comm"] == "go-threads"]["pid"].iloc[0])
    change = go_exceeded_change(300)
    assert change is not None and change.value == 360 and change.command.endswith("runtime/debug.SetMaxThreads(360)")
    said = [r for r in build(load(newcomer)).recommendations if "SetMaxThreads(" in r]
    assert said == [r for r in said if r.startswith(f"Go thread limit of go-threads [{pid}]")] and len(said) == 1
    assert said[0].endswith(f"; {change.command}.")
    assert f"  {said[0]}" in summary(load(newcomer)).splitlines()
    result = CliRunner().invoke(main, ["doctor", "--from", str(newcomer), "--pid", str(pid), "--json"])
    [check] = [c for c in json.loads(result.output)["checks"] if c["name"] == "Go thread limit"]
    assert (check["recommended"], check["change"]) == ("SetMaxThreads >= 360", change.command)
    assert "what to change (threads): " + change.command in replayed_detail(newcomer, pid)
