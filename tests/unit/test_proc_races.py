"""A process that exits while /proc is read, at every step of the read: real processes, killed and
reaped by the test between two of the reader's own calls, so the race is hit every time."""

from __future__ import annotations

import builtins
import os
import resource
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fdtrace.procfs import ProcessGoneError, ProcFS
from fdtrace.procfs import reader as reader_module
from fdtrace.procfs.sampler import ProcSampler
from fdtrace.procfs.threads import thread_census

#: The calls through which the reader touches a process's files.
READS = ("open", "listdir", "stat", "readlink", "scandir")


class Exits:
    """Counts the reader's calls into /proc and, at call number ``at``, kills and reaps the
    process first: from that call on, the process is gone."""

    def __init__(self, process: subprocess.Popen[bytes], at: int) -> None:
        self.process = process
        self.at = at
        self.calls = 0

    def wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def maybe_exit_first(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.at:
                self.process.kill()
                self.process.wait()  # reaped: /proc/PID is no more
            return call(*args, **kwargs)
        return maybe_exit_first


class _Os:
    """The os module as the reader sees it, with the process-reading calls counted."""

    def __init__(self, exits: Exits) -> None:
        self._wrapped = {name: exits.wrap(getattr(os, name)) for name in READS}

    def __getattr__(self, name: str) -> Any:
        return self._wrapped.get(name) or getattr(os, name)


class _Resource:
    def __init__(self, exits: Exits) -> None:
        self.prlimit = exits.wrap(resource.prlimit)

    def __getattr__(self, name: str) -> Any:
        return getattr(resource, name)


@pytest.fixture
def sleeper() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        # a few sockets, so the fd listing has links to read
        child = subprocess.Popen(["python3", "-S", "-c", "import socket, sys, time\n"
                                  "held = [socket.socket() for _ in range(3)]\nsys.stdout.write('up\\n')\n"
                                  "sys.stdout.flush()\ntime.sleep(60)\n"], stdout=subprocess.PIPE)
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        started.append(child)
        return child

    yield start
    for child in started:
        child.kill()
        child.wait()


def exiting_at(monkeypatch: pytest.MonkeyPatch, process: subprocess.Popen[bytes], at: int) -> Exits:
    exits = Exits(process, at)
    monkeypatch.setattr(reader_module, "os", _Os(exits))
    monkeypatch.setattr(reader_module, "resource", _Resource(exits))
    monkeypatch.setattr(reader_module, "open", exits.wrap(builtins.open), raising=False)
    return exits


def test_fd_targets_of_a_process_that_exits_after_its_fd_folder_is_opened(
        monkeypatch: pytest.MonkeyPatch, sleeper: Callable[[], subprocess.Popen[bytes]]) -> None:
    # issue 27 item 3: os.listdir(fd_dir) raised FileNotFoundError out of the sampler
    child = sleeper()
    exits = exiting_at(monkeypatch, child, at=2)  # 1: os.open of /proc/PID/fd, 2: its listing
    with pytest.raises(ProcessGoneError):
        ProcFS().fd_targets(child.pid)
    assert exits.calls >= 2 and child.returncode == -9


def test_a_process_that_exits_at_any_step_of_its_sample_is_counted_never_raised(
        monkeypatch: pytest.MonkeyPatch, sleeper: Callable[[], subprocess.Popen[bytes]]) -> None:
    whole = sleeper()
    counting = exiting_at(monkeypatch, whole, at=0)  # never exits: how many calls a sample makes
    counted = ProcSampler(cmdline=True)
    sample = counted.sample(whole.pid)
    assert sample is not None and sample.sockets == 3
    steps = counting.calls
    assert steps >= 8  # stat, limits, status, fd folder (open, listing, links), cmdline, cgroup
    for at in range(1, steps + 1):
        child = sleeper()
        exits = exiting_at(monkeypatch, child, at)
        sampler = ProcSampler(cmdline=True)
        # the same way of counting descriptors as the sample counted: another thread of this
        # process opening one while a sampler looks at its own fd folder may have decided otherwise
        sampler.fd_count_by_size = counted.fd_count_by_size
        assert sampler.sample(child.pid) is None, f"a sample of a process gone at read {at}"
        assert exits.calls >= at
        assert sampler.skipped == {"gone": 1}, at


def test_a_round_over_processes_that_exit_mid_read_keeps_the_others(
        monkeypatch: pytest.MonkeyPatch, sleeper: Callable[[], subprocess.Popen[bytes]]) -> None:
    going, staying = sleeper(), sleeper()
    exiting_at(monkeypatch, going, at=5)  # within the first sample, whichever pid comes first
    sampler = ProcSampler()
    assert [s.pid for s in sampler.processes([going.pid, staying.pid])] == [staying.pid]
    assert sampler.skipped == {"gone": 1}


def test_a_thread_census_of_a_process_gone_while_listed(
        monkeypatch: pytest.MonkeyPatch, sleeper: Callable[[], subprocess.Popen[bytes]]) -> None:
    child = sleeper()
    exiting_at(monkeypatch, child, at=1)  # the listing of /proc/PID/task
    with pytest.raises(ProcessGoneError):
        thread_census(ProcFS(), child.pid, str)


def test_a_failed_read_that_is_no_race_is_counted_by_its_errno(
        monkeypatch: pytest.MonkeyPatch, sleeper: Callable[[], subprocess.Popen[bytes]]) -> None:
    child = sleeper()

    def no_descriptors(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(reader_module, "open", no_descriptors, raising=False)
    sampler = ProcSampler()
    assert sampler.sample(child.pid) is None
    assert sampler.skipped == {"EMFILE": 1}


def test_what_was_skipped_is_said_in_words() -> None:
    sampler = ProcSampler()
    assert sampler.describe_skipped() == ""
    sampler.skip(ProcessGoneError(1))
    sampler.skip(ProcessGoneError(2))
    sampler.skip(OSError(24, "Too many open files"))
    assert sampler.describe_skipped() == "2 processes gone when sampled, 1 process not read (EMFILE)"


def test_a_process_is_exiting_by_its_stat_flags(tmp_path: Any) -> None:
    def stat(pid: int, flags: int) -> None:
        (tmp_path / str(pid)).mkdir()
        fields = ["R", "1", str(pid), str(pid), "0", "-1", str(flags), *["0"] * 12, "500", "0"]
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (go (x) y) {' '.join(fields)}\n")
    stat(10, 0x400100)  # a running task
    stat(11, 0x400104)  # PF_EXITING: in do_exit(), its memory about to go
    procfs = ProcFS(tmp_path)
    assert not procfs.stat(10).exiting and procfs.stat(11).exiting
    assert procfs.stat(11).comm == "go (x) y" and procfs.stat(11).start_ns == procfs.stat(10).start_ns > 0
    assert not ProcFS().stat(os.getpid()).exiting
