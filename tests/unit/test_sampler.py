"""The /proc sampler against a fake procfs tree (psutil's way of testing it)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest

from fdtrace.procfs import TICK_NS
from fdtrace.procfs.golang import BUILDINFO_MAGIC, GO_DEFAULT_MAX_THREADS
from fdtrace.procfs.sampler import ProcSampler
from tests import fakeproc
from tests.fakeproc import write_files

# Processes of the sampler's tests: a server with 7 threads, started at tick 1234.
fake_process = partial(fakeproc.fake_process, threads=7, nproc="63936", cmdline="server --port 8080",
                       start_ticks=1234)


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    fake_process(tmp_path, 10, "haproxy (w)", {0: "/dev/null", 3: "socket:[991]", 4: "socket:[992]", 5: "pipe:[7]"})
    fake_process(tmp_path, 11, "idle", {0: "/dev/null"}, soft="unlimited", hard="unlimited", fd_table=256)
    fake_process(tmp_path, 13, "small", {0: "/dev/null"}, fd_table=32)
    (tmp_path / "12").mkdir()  # a kernel thread: no fds
    write_files(tmp_path, {
        "sys/fs/file-nr": "2048\t0\t9223372036854775807\n", "sys/fs/nr_open": "1048576\n",
        "sys/kernel/threads-max": "95000\n", "sys/kernel/pid_max": "32768\n", "sys/net/core/somaxconn": "4096\n",
        "loadavg": "0.52 0.58 0.59 3/1187 4242\n",
        "meminfo": "MemTotal:       24000000 kB\nMemFree:        19000000 kB\nMemAvailable:   20500000 kB\n",
        "net/netstat": ("TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 0 17 19\n"
                        "IpExt: InNoRoutes\nIpExt: 0\n"),
    })
    return tmp_path


def test_process_sample_reads_fds_limits_threads_and_sockets(proc_root: Path) -> None:
    sampler = ProcSampler(proc_root)
    assert not sampler.fd_count_by_size  # a fake tree has no /proc/self: count by readdir
    sample = sampler.sample(10)
    assert sample is not None
    assert (sample.comm, sample.open_fds, sample.fd_soft_limit, sample.fd_hard_limit) == ("haproxy (w)", 4, 64, 4096)
    assert (sample.threads, sample.sockets, sample.start_ns) == (7, 2, 1234 * TICK_NS)
    assert sample.cmdline is None
    unlimited = sampler.sample(11)
    assert unlimited is not None and (unlimited.fd_soft_limit, unlimited.fd_hard_limit) == (None, None)


def test_command_lines_only_when_asked(proc_root: Path) -> None:
    sample = ProcSampler(proc_root, cmdline=True).sample(10)
    assert sample is not None and sample.cmdline == "server --port 8080"


def test_vanished_process_is_skipped(proc_root: Path) -> None:
    sampler = ProcSampler(proc_root)
    (proc_root / "10" / "limits").unlink()  # gone between two reads
    assert sampler.sample(10) is None
    assert sampler.sample(404) is None
    assert [s.pid for s in sampler.processes([10, 11, 404])] == [11]


def test_top_without_o1_counts_ranks_by_fd_table_size(proc_root: Path) -> None:
    sampler = ProcSampler(proc_root)
    assert sampler.top_by_open_fds(5) == [11, 10, 13]  # FDSize 256, 64, 32; the kernel thread has none
    assert sampler.top_by_open_fds(1) == [11]


def test_top_by_open_fds_counts_when_the_kernel_gives_counts(proc_root: Path) -> None:
    sampler = ProcSampler(proc_root)
    sampler.fd_count_by_size = True  # as on Linux >= 6.2; a fake tree's st_size is no count, so stand in
    sampler.open_fds = lambda pid: {10: 4, 11: 2, 13: 1}.get(pid, 0)  # type: ignore[method-assign]
    assert sampler.top_by_open_fds(2) == [10, 11]


def test_system_figures(proc_root: Path) -> None:
    assert ProcSampler(proc_root).system() == {
        "file_nr": 2048, "file_max": 9223372036854775807, "nr_open": 1048576, "threads_max": 95000,
        "pid_max": 32768, "somaxconn": 4096, "listen_overflows": 17, "listen_drops": 19, "threads_total": 1187,
        "mem_total_kb": 24_000_000, "mem_available_kb": 20_500_000,
    }


def test_thread_limits_nproc_counts_every_thread_of_the_user(proc_root: Path) -> None:
    fake_process(proc_root, 20, "worker", {}, uid=1001, threads=40, nproc="100")
    fake_process(proc_root, 21, "helper", {}, uid=1001, threads=25, nproc="100")
    fake_process(proc_root, 22, "rootd", {}, uid=0, threads=3, nproc="100")
    samples = {s.pid: s for s in ProcSampler(proc_root).processes([10, 20, 22])}
    assert (samples[20].uid, samples[20].nproc_soft_limit, samples[20].user_threads) == (1001, 100, 65)
    assert (samples[10].nproc_soft_limit, samples[10].user_threads) == (63936, 7 * 3)  # uid 1000: 10, 11, 13
    assert (samples[22].nproc_soft_limit, samples[22].user_threads) == (None, None)  # root is not held to it


def test_thread_limits_tightest_cgroup_pids_max_of_the_ancestors(tmp_path: Path) -> None:
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    fake_process(proc, 30, "app", {}, cgroup="12:pids:/app.slice/app.service\n0::/app.slice/app.service\n")
    fake_process(proc, 31, "free", {}, cgroup="0::/\n")
    for folder, current, limit in (("pids/app.slice", 90, "100"), ("pids/app.slice/app.service", 40, "max")):
        (cgroups / folder).mkdir(parents=True)
        (cgroups / folder / "pids.current").write_text(f"{current}\n")
        (cgroups / folder / "pids.max").write_text(f"{limit}\n")
    sampler = ProcSampler(proc, cgroupfs=cgroups)
    app, free = sampler.sample(30), sampler.sample(31)
    assert app is not None and (app.pids_current, app.pids_max) == (90, 100)  # the slice binds, 10 to spare
    assert free is not None and (free.pids_current, free.pids_max) == (None, None)


def test_memory_of_the_process_and_the_tightest_memory_cgroup_v1_and_v2(tmp_path: Path) -> None:
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    fake_process(proc, 40, "v1", {}, cgroup="9:memory:/app.slice/app.service\n0::/app.slice/app.service\n")
    fake_process(proc, 41, "v2", {}, cgroup="0::/pods/web\n")
    fake_process(proc, 42, "free", {}, cgroup="9:memory:/\n")
    with open(proc / "40" / "status", "a") as status:
        status.write("RssAnon:\t  143360 kB\nRssFile:\t    2048 kB\nRssShmem:\t       4 kB\n")
    unlimited = str(9223372036854771712)
    for folder, limit, usage, events, name in (
            ("memory", unlimited, 900 << 20, "oom_kill 3\n", "memory.oom_control"),
            ("memory/app.slice", str(150 << 20), 140 << 20, "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
             "memory.oom_control"),
            ("memory/app.slice/app.service", unlimited, 139 << 20, "oom_kill 1\n", "memory.oom_control")):
        write_files(cgroups, {f"{folder}/memory.limit_in_bytes": f"{limit}\n",
                              f"{folder}/memory.usage_in_bytes": f"{usage}\n", f"{folder}/{name}": events})
    write_files(cgroups, {"unified/pods/memory.max": "max\n", "unified/pods/memory.current": "100\n",
                          "unified/pods/web/memory.max": f"{256 << 20}\n",
                          "unified/pods/web/memory.current": f"{200 << 20}\n",
                          "unified/pods/web/memory.events": "low 0\nhigh 0\nmax 9\noom 4\noom_kill 4\n"})
    sampler = ProcSampler(proc, cgroupfs=cgroups)
    v1, v2, free = sampler.processes([40, 41, 42])
    assert (v1.rss_anon_kb, v1.rss_file_kb, v1.rss_shmem_kb, v1.rss_kb) == (143360, 2048, 4, 145412)
    assert (v1.memcg_limit_bytes, v1.memcg_usage_bytes, v1.memcg_oom_kills) == (150 << 20, 140 << 20, 2)
    assert (v2.memcg_limit_bytes, v2.memcg_usage_bytes, v2.memcg_oom_kills) == (256 << 20, 200 << 20, 4)
    assert v2.rss_kb is None  # its status has no Rss lines
    assert (free.memcg_limit_bytes, free.memcg_usage_bytes, free.memcg_oom_kills) == (None, None, None)


def test_go_programs_get_gos_thread_limit(proc_root: Path) -> None:
    (proc_root / "10" / "exe").write_bytes(b"\0" * 100 + BUILDINFO_MAGIC + b"go1.19")
    (proc_root / "13" / "exe").write_bytes(b"\x7fELF not go")
    sampler = ProcSampler(proc_root)
    go, other = sampler.sample(10), sampler.sample(13)
    assert go is not None and go.go_max_threads == GO_DEFAULT_MAX_THREADS
    assert other is not None and other.go_max_threads is None


def test_real_proc_counts_this_process_fds() -> None:
    sampler = ProcSampler()
    r, w = os.pipe()
    try:
        expected = len(os.listdir("/proc/self/fd")) - 1
        assert sampler.open_fds(os.getpid()) == expected
    finally:
        os.close(r)
        os.close(w)


def test_a_round_on_a_budget_samples_what_matters_first_and_counts_the_rest() -> None:
    """Issue 34: a round's /proc work is bounded. On a budget the processes named first (failing,
    filtered) are sampled before the others, whatever their pids; what the budget leaves out is
    counted and said, and the round's cost is measured."""
    import subprocess
    import sys

    children = [subprocess.Popen([sys.executable, "-S", "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
                for _ in range(4)]
    try:
        pids = [c.pid for c in children]
        sampler = ProcSampler()
        everything = sampler.round(pids, 0, first=[pids[-1]], budget_s=60.0)
        assert [s.pid for s in everything] == [pids[-1], *sorted(pids[:-1])] and sampler.unsampled == 0
        assert sampler.round_s > 0
        [only] = sampler.round(pids, 0, first=[pids[2]], budget_s=0.0)  # no time: the first one only
        assert only.pid == pids[2] and sampler.unsampled == 3 and sampler.skipped["late"] == 3
        assert "3 processes left for later (the round's time ran out)" in sampler.describe_skipped()
    finally:
        for child in children:
            child.kill()
            child.wait()
