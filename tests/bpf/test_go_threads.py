"""A Go program (Debian's golang-go) whose goroutines pin OS threads in blocking syscalls: its
raw clone() threads are seen, its growth is in a recording, and doctor flags it."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from fdtrace.analysis import failures, headroom, least_headroom, load, thread_sites, threads
from fdtrace.analysis.report import recommendations
from fdtrace.procfs.sampler import ProcSampler
from fdtrace.procfs.thread_limits import binding_limit
from tests.helpers import FDTRACE, build_go, started, wait_recorded

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(shutil.which("go") is None, reason="golang-go is not installed")]
GOROUTINES = 300

PROGRAM = """package main

import (
	"os"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"
)

// A read of an empty pipe blocks in the kernel and holds its OS thread.
func holdThread(fd int) {
	buf := make([]byte, 1)
	syscall.Read(fd, buf)
}

func main() {
	limit := 2000
	if len(os.Args) > 3 { // the thread limit to die at
		limit, _ = strconv.Atoi(os.Args[3])
	}
	debug.SetMaxThreads(limit)
	n, _ := strconv.Atoi(os.Args[1])
	if len(os.Args) > 2 { // "wait": start once a byte comes on stdin (the tracer is attached)
		os.Stdin.Read(make([]byte, 1))
	}
	for i := 0; i < n; i++ {
		var fds [2]int
		if err := syscall.Pipe(fds[:]); err != nil {
			panic(err)
		}
		go holdThread(fds[0])
		if i%20 == 19 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	time.Sleep(300 * time.Second) // until the test kills it (30 s ran out on two busy cores)
}
"""


def build(tmp_path: Path) -> Path:
    return build_go(PROGRAM, tmp_path, "go-threads")


def start_recorder(out: Path) -> subprocess.Popen[str]:
    """`fdtrace record` of the whole host, sampling every 0.5 s, once its probes are attached."""
    return started([FDTRACE, "record", "-o", str(out), "--interval", "0.5"], "recording to")


def test_go_thread_growth_is_recorded_and_flagged(tmp_path: Path) -> None:
    binary = build(tmp_path)
    out = tmp_path / "rec"
    recorder = start_recorder(out)
    program = subprocess.Popen([str(binary), str(GOROUTINES), "wait"], stdin=subprocess.PIPE)
    assert program.stdin is not None

    def mine() -> pd.DataFrame:
        """The program's samples on disk (the recorder flushes each round)."""
        samples = load(out).samples if (out / "samples").is_dir() else pd.DataFrame({"pid": [], "threads": []})
        return samples[samples["pid"] == program.pid]
    try:
        # Growth is judged from the samples: one round sees the program before its threads start,
        # then it starts 300 (200 a second) and rounds see them; a busy machine takes longer (each
        # wait has its own deadline: on two busy cores the three together took more than 60 s).
        deadline = time.monotonic() + 60
        while mine().empty and time.monotonic() < deadline:
            time.sleep(0.2)
        program.stdin.write(b"x")
        program.stdin.flush()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (mine()["threads"] >= GOROUTINES).any():
            time.sleep(0.3)
        deadline = time.monotonic() + 60
        while True:
            result = subprocess.run([FDTRACE, "doctor", "--pid", str(program.pid), "--from", str(out), "--json"],
                                    capture_output=True, text=True, timeout=60)
            checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]
                      if c["scope"] == f"pid {program.pid} (go-threads)"}
            go = checks.get("Go thread limit", {})
            if go.get("status") == "WARN" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert go.get("status") == "WARN", go
        # the program set 2000 (SetMaxThreads), read from its memory where Go's default was assumed before
        assert "threads of its limit 2000 (debug.SetMaxThreads, read from its memory), growing" in go["current"]
        assert result.returncode >= 1
    finally:
        # the recorder stops first: a round taken while the killed program exits would read no limit
        recorder.send_signal(signal.SIGINT)
        recorder.communicate(timeout=30)
        program.kill()
        program.wait()
    rec = load(out)
    started = rec.events[(rec.events["pid"] == program.pid) & (rec.events["kind"] == "thread_start")]
    assert len(started) >= GOROUTINES  # Go's raw clone() threads, each one seen
    threads = rec.samples[rec.samples["pid"] == program.pid].sort_values("ts_ns")["threads"]
    assert threads.iloc[0] < threads.max() and threads.max() >= GOROUTINES
    samples = rec.samples[rec.samples["pid"] == program.pid]
    assert (samples["go_max_threads"] == 2000).all() and samples["go_limit_unread"].isna().all()
    limits = headroom(rec)
    mine = limits[limits["pid"] == program.pid]
    # Go's limit binds unless a cgroup or the user's RLIMIT_NPROC leaves even less room
    assert (mine["thread_headroom"] <= 2000 - mine["threads"]).all()
    assert (mine["thread_limit_kind"] == "Go SetMaxThreads").any()
    assert mine["thread_limit_kind"].notna().all()


def census_of(pid: int) -> dict[tuple[str, str | None], int]:
    result = subprocess.run([FDTRACE, "threads", "--pid", str(pid), "--json"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return {(s["syscall"], s["fd_kind"]): s["threads"] for s in json.loads(result.stdout)["census"]}


def recorded_census(out: Path, pid: int, blocked: int) -> None:
    """Wait until the recording's census has ``blocked`` threads of ``pid`` in read() on pipes."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            recorded = threads(load(out), pid=pid)
        except Exception:  # a part renamed into place while listed: read again
            recorded = None
        if recorded is not None and len(recorded):
            reading = recorded[(recorded["syscall"] == "read") & (recorded["fd_kind"] == "pipe")]
            if (reading.groupby("time")["threads"].sum() == blocked).any():
                return
        time.sleep(0.2)
    raise AssertionError(f"no census of {blocked} threads of pid {pid} in the recording in 60 s")


def test_threads_counts_the_goroutines_blocked_in_read_on_pipes(tmp_path: Path) -> None:
    binary = build(tmp_path)
    program = subprocess.Popen([str(binary), str(GOROUTINES), "wait"], stdin=subprocess.PIPE)
    out = tmp_path / "rec"
    recorder = subprocess.Popen([FDTRACE, "record", "-o", str(out), "--pid", str(program.pid), "--stacks",
                                 "--interval", "0.5"], stderr=subprocess.PIPE, text=True)
    try:
        assert recorder.stderr is not None
        for line in recorder.stderr:
            if "recording to" in line:
                break
        assert program.stdin is not None
        program.stdin.write(b"x")
        program.stdin.flush()
        deadline = time.monotonic() + 30
        census = census_of(program.pid)
        while census.get(("read", "pipe"), 0) < GOROUTINES and time.monotonic() < deadline:
            time.sleep(0.3)
            census = census_of(program.pid)
        assert census.get(("read", "pipe")) == GOROUTINES  # each goroutine's thread, and no other thread
        recorded_census(out, program.pid, GOROUTINES)  # the recorder's rounds take the census too
    finally:
        # the recorder stops first: a round taken while the killed program's threads exit counts only some
        recorder.send_signal(signal.SIGINT)
        recorder.communicate(timeout=60)
        program.kill()
        program.wait()
    rec = load(out)
    recorded = threads(rec, pid=program.pid)
    last = recorded[recorded["time"] == recorded["time"].max()]
    reading = last[(last["syscall"] == "read") & (last["fd_kind"] == "pipe")]
    assert reading["threads"].tolist() == [GOROUTINES] and reading["site"].tolist() == ["main.holdThread"]
    started = rec.events[(rec.events["pid"] == program.pid) & (rec.events["kind"] == "thread_start")]
    sites = thread_sites(rec, pid=program.pid)
    assert started["stack_id"].notna().all()
    assert sites["threads"].sum() == len(started) > GOROUTINES // 2  # threads idle before may take some goroutines
    assert any(frame.startswith("runtime.newm+") for frame in sites["frames"].iloc[0]), sites["frames"].iloc[0]
    # each site ends at its stack's root, no stale frame past it: the creating thread's start, or,
    # where the runtime made the thread on the system stack of a goroutine (newproc -> wakep), that
    # goroutine's root; and no two sites are the same
    # (a walk the stack-switch cut short says so in the stack's ``truncated``: no root to end at)
    roots = ("runtime.mstart0", "runtime.mstart", "runtime.goexit", "runtime.rt0_go")
    why_cut = dict(zip(rec.stacks["stack_id"], rec.stacks["truncated"], strict=True))
    for stack_id, frames in zip(sites["stack_id"], sites["frames"], strict=True):
        entries = [i for i, f in enumerate(frames) if f.split("+")[0].removesuffix(".abi0") in roots]
        cut = why_cut.get(stack_id)
        whole = bool(entries) and entries[0] == len(frames) - 1
        assert whole or (not entries and isinstance(cut, str)), (list(frames), cut)
    assert len({tuple(f) for f in sites["frames"]}) == len(sites)
    assert sites["reason"].iloc[0].startswith("a goroutine blocked in a syscall"), sites.iloc[0].to_dict()


def test_a_go_program_past_its_thread_limit_is_flagged_with_the_limit_it_printed(tmp_path: Path) -> None:
    binary = build(tmp_path)
    out = tmp_path / "rec"
    limit = 250  # below the 300 goroutines it starts: the runtime prints its limit and exits 2
    recorder = start_recorder(out)
    program = subprocess.Popen([str(binary), str(GOROUTINES), "wait", str(limit)], stdin=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        # a round sees its first threads (its sample is on disk): a Go binary, watched from now on
        wait_recorded(out, lambda rec: bool((rec.samples["pid"] == program.pid).any()),
                      "a round's sample of the program")
        assert program.stdin is not None
        program.stdin.write(b"x")
        program.stdin.flush()
        _, said = program.communicate(timeout=60)
        assert program.returncode == 2 and f"runtime: program exceeds {limit}-thread limit".encode() in said
        wait_recorded(out, lambda rec: {"go_thread_limit", "process_exit"}
                      <= set(rec.events[rec.events["pid"] == program.pid]["kind"].astype(str)),
                      "the program's go_thread_limit and its exit recorded")
    finally:
        program.kill()
        recorder.send_signal(signal.SIGINT)
        recorder.communicate(timeout=60)
    rec = load(out)
    mine = rec.events[rec.events["pid"] == program.pid]
    flagged = mine[mine["kind"] == "go_thread_limit"]
    assert flagged["ret"].tolist() == [limit]  # once, with the limit debug.SetMaxThreads set
    assert mine[mine["kind"] == "process_exit"]["exit_code"].tolist() == [2]
    found = failures(rec)
    assert found[found["pid"] == program.pid]["failure"].tolist() == [f"Go thread limit {limit} exceeded", "exit 2"]
    doctor = subprocess.run([FDTRACE, "doctor", "--pid", str(program.pid), "--from", str(out), "--json"],
                            capture_output=True, text=True, timeout=120)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"] if c["scope"].startswith(f"pid {program.pid}")}
    go = checks["Go thread limit"]
    assert go["status"] == "FAIL" and f"program exceeds {limit}-thread limit" in go["current"]
    assert "gone: from the recording" in go["scope"] and doctor.returncode == 2
    shown = subprocess.run([FDTRACE, "info", str(out)], capture_output=True, text=True, timeout=120).stdout
    assert f"go-threads [{program.pid}]: exceeded its Go thread limit (the runtime said so, and exits 2) at " in shown
    advice = recommendations(rec, least_headroom(rec))
    assert any(line.startswith(f"Go thread limit of go-threads [{program.pid}]: the runtime said 'program exceeds "
                               f"{limit}-thread limit'") for line in advice)


STORM = """package main

import (
	"runtime/debug"
	"syscall"
	"time"
)

// The Go incident at full speed: goroutines pin threads in blocking reads until the runtime's
// limit kills the program, well within its first second.
func main() {
	debug.SetMaxThreads(STORM_LIMIT)
	for i := 0; i < STORM_GOROUTINES; i++ {
		var fds [2]int
		if err := syscall.Pipe(fds[:]); err != nil {
			panic(err)
		}
		go func(fd int) { buf := make([]byte, 1); syscall.Read(fd, buf) }(fds[0])
	}
	time.Sleep(30 * time.Second)
}
"""


def test_a_go_program_that_dies_of_its_thread_limit_within_a_second_is_caught(tmp_path: Path) -> None:
    """The uprobe is attached as the program execs, not once a sampling round has seen it: a
    program that lives well under a second still leaves its go_thread_limit event, and the
    postmortem commands find it from its events alone (no sample of it was taken)."""
    limit = 250
    binary = build_go(STORM.replace("STORM_LIMIT", str(limit)).replace("STORM_GOROUTINES", str(GOROUTINES)),
                      tmp_path, "thread_storm")
    out = tmp_path / "rec"
    # Rounds 60 s apart, the first one done (its flush is on disk) before the program starts: no
    # sampling round sees the program alive, only its events do.
    recorder = started([FDTRACE, "record", "-o", str(out), "--interval", "60"], "recording to")
    try:
        deadline = time.monotonic() + 30
        while not list(out.glob("system/host=*/part-*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.05)
        began = time.monotonic()
        storm = subprocess.run([str(binary)], capture_output=True, timeout=60)
        lived = time.monotonic() - began
        assert storm.returncode == 2 and f"program exceeds {limit}-thread limit".encode() in storm.stderr
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.communicate(timeout=60)
    rec = load(out)
    pids = rec.events[(rec.events["comm"] == "thread_storm") & (rec.events["kind"] == "process_exec")]["pid"]
    assert len(pids) == 1, f"lived {lived:.2f} s"
    assert not (rec.samples["pid"] == pids.iloc[0]).any()  # never sampled: the uprobe came with its exec
    mine = rec.events[rec.events["pid"] == pids.iloc[0]]
    assert mine[mine["kind"] == "go_thread_limit"]["ret"].tolist() == [limit], f"lived {lived:.2f} s"
    doctor = subprocess.run([FDTRACE, "doctor", "--comm", "thread_storm", "--from", str(out), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert doctor.returncode == 2, doctor.stderr
    go = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "Go thread limit"]
    assert len(go) == 1 and go[0]["status"] == "FAIL" and f"program exceeds {limit}-thread limit" in go[0]["current"]
    shown = subprocess.run([FDTRACE, "info", str(out)], capture_output=True, text=True, timeout=120).stdout
    assert f"thread_storm [{pids.iloc[0]}]: exceeded its Go thread limit" in shown
    page = tmp_path / "report.md"
    made = subprocess.run([FDTRACE, "report", str(out), "-o", str(page)], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    [incident] = [line for line in page.read_text().splitlines()
                  if line.startswith("| Go thread limit |") and "| thread_storm |" in line]
    assert str(pids.iloc[0]) in incident, incident  # the report's incidents have it from its events alone


def test_a_limit_set_by_setmaxthreads_is_read_from_the_program_before_any_crash(tmp_path: Path) -> None:
    """Under debug.SetMaxThreads(250), 120 goroutines blocked in reads: doctor and the live
    views measure against 250, read from the program's memory, while it runs."""
    binary = build(tmp_path)
    program = subprocess.Popen([str(binary), "120", "go", "250"], stdin=subprocess.PIPE)
    try:
        assert program.stdin is not None
        program.stdin.write(b"x")
        program.stdin.flush()
        deadline = time.monotonic() + 30
        while census_of(program.pid).get(("read", "pipe"), 0) < 120 and time.monotonic() < deadline:
            time.sleep(0.2)
        shown = subprocess.run([FDTRACE, "threads", "--pid", str(program.pid)], capture_output=True, text=True,
                               timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert "; Go SetMaxThreads limit 250: " in shown.stdout.splitlines()[0], shown.stdout
        # the code they wait in, not the runtime's: their own function
        assert "  120 threads blocked in read() on pipes at main.holdThread" in shown.stdout.splitlines(), shown.stdout
        doctor = subprocess.run([FDTRACE, "doctor", "--pid", str(program.pid), "--json"], capture_output=True,
                                text=True, timeout=60)
        checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]
                  if c["scope"] == f"pid {program.pid} (go-threads)"}
        assert " threads of its limit 250 (debug.SetMaxThreads, read from its memory)" in \
            checks["Go thread limit"]["current"], checks["Go thread limit"]
        # what top's thread alert is measured against: the binding limit of its sample
        sample = ProcSampler().sample(program.pid)
        assert sample is not None and sample.go_max_threads == 250 and sample.go_limit_unread is None
        name, _count, limit = binding_limit(sample) or ("", 0, 0)
        assert (name, limit) == ("Go SetMaxThreads", 250)
        assert program.poll() is None  # all this before any crash
    finally:
        program.kill()
        program.wait()
