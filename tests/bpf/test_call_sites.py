"""--stacks on real programs: which function leaks sockets, which one hit EMFILE, where threads are
created and what they are blocked in; exec, close_range and fork make no false leaks."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import pandas as pd
import pytest

from fdtrace.analysis import leaks, load
from tests.helpers import FDTRACE, Lines, eventually, replay_app, replay_to_end, wait_recorded

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")]
SOURCE = Path(__file__).parents[1] / "data" / "call_sites" / "sites.c"


def build_sites(folder: Path) -> Path:
    """The test program, built with frame pointers in ``folder``."""
    binary = folder / "sites"
    subprocess.run(["gcc", "-O0", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", str(binary), str(SOURCE)],
                   check=True, capture_output=True, timeout=120)
    return binary


@pytest.fixture(scope="module")
def sites_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sites(tmp_path_factory.mktemp("sites"))


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


class Program:
    """The test program in one mode: started waiting for a byte on stdin."""

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.process.pid
        # Until its exec, the child also holds subprocess's error pipe (a descriptor the program
        # never has): its descriptors are counted once it no longer runs Python.
        python = os.path.realpath(sys.executable)
        deadline = time.monotonic() + 30
        while _exe(self.pid) in (None, python):
            assert time.monotonic() < deadline and self.process.poll() is None, f"{argv[0]} did not start"
            time.sleep(0.01)

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("x")
        self.process.stdin.flush()

    def line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def finish(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def wait_for(stream: IO[str] | None, marker: str) -> list[str]:
    """Lines of a stream up to the one holding ``marker``."""
    assert stream is not None
    seen = []
    for line in stream:
        seen.append(line)
        if marker in line:
            return seen
    raise AssertionError(f"no {marker!r} in: {''.join(seen)}")


def traced(program: Program, argv: list[str], marker: str = "tracing pid") -> subprocess.Popen[str]:
    tracer = subprocess.Popen([FDTRACE, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(tracer.stderr, marker)
    return tracer


def leaks_json(program: Program, duration: float, after_go: list[str]) -> dict[str, Any]:
    tracer = traced(program, ["leaks", "--pid", str(program.pid), "--duration", str(duration), "--interval", "0.5",
                              "--json"])
    try:
        program.go()
        for expected in after_go:
            assert program.line() == expected
        out, err = tracer.communicate(timeout=60)
    finally:
        if tracer.poll() is None:
            tracer.kill()
            tracer.wait()
    assert tracer.returncode == 0, err
    data: dict[str, Any] = json.loads(out)
    assert not any(data["losses"].values()), data["losses"]
    return data


def frames_of(data: dict[str, Any]) -> list[str]:
    return [frame for site in data["sites"] for frame in site["frames"]]


def test_leaks_names_the_function_that_never_closes_and_not_the_one_that_does(sites_binary: Path) -> None:
    program = Program([str(sites_binary), "leak", "7", "5"])
    try:
        before = len(os.listdir(f"/proc/{program.pid}/fd"))
        data = leaks_json(program, 3, ["done"])
    finally:
        program.finish()
    made = [site for site in data["sites"] if site["site"] != "(from before tracing)"]
    assert len(made) == 1, data["sites"]
    site = made[0]
    assert site["site"].startswith("leak_sockets+"), site
    assert (site["open"], site["opened"], site["closed"]) == (7, 7, 0)
    assert site["frames"][0].startswith("__socket+") or "libc" in site["frames"][0]
    assert any(frame.startswith("main+") for frame in site["frames"])
    assert site["truncated"] is None  # frame pointers all the way to libc's start of main
    assert site["oldest_age_s"] > 0
    assert not any("balanced_sockets" in frame for frame in frames_of(data))
    older = [s for s in data["sites"] if s["site"] == "(from before tracing)"]
    assert [s["open"] for s in older] == [before]


def test_emfile_failures_carry_the_stack_of_the_function_that_failed(sites_binary: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    program = Program(["prlimit", "--nofile=24:24", str(sites_binary), "emfile"])
    recorder = traced(program, ["record", "-o", str(out), "--pid", str(program.pid), "--stacks", "--interval", "0.5"],
                      marker="recording to")
    try:
        program.go()
        made, failed = (int(part.split("=")[1]) for part in program.line().split())
        # stacks are symbolized while their process lives: it ends once they are on disk
        wait_recorded(out, lambda rec: _failures_with_stacks(rec, program.pid) == failed
                      and _most_open_at(rec, program.pid, "exhaust_descriptors+") == made,
                      "the EMFILE failures with their stacks, and the open sockets by site, recorded")
        program.finish()
    finally:
        recorder.send_signal(signal.SIGINT)
        _out, err = recorder.communicate(timeout=60)
    assert recorder.returncode == 0, err
    assert failed == 4  # one socket(), three open()
    rec = load(out)
    failures = rec.events[(rec.events["pid"] == program.pid) & (rec.events["errno"] == "EMFILE")]
    assert len(failures) == failed
    assert sorted(failures["syscall"].astype(str)) == ["openat", "openat", "openat", "socket"]
    assert failures["stack_id"].notna().all()
    stacks = rec.stacks.set_index("stack_id")
    for syscall, stack_id in zip(failures["syscall"].astype(str), failures["stack_id"], strict=True):
        frames = list(stacks.loc[int(stack_id), "frames"])
        # the wrapper's caller, which a frame-pointer walk skips, is put back second; not decoy(),
        # whose return addresses fill the stack where the wrapper's frame lies
        assert frames[1].startswith("exhaust_descriptors+"), frames
        assert not any(f.startswith("decoy+") for f in frames), frames
        if syscall == "socket":  # glibc's socket() leaves the frame pointer alone: the walk reaches main's caller
            assert frames[2].startswith("main+") and pd.isna(stacks.loc[int(stack_id), "truncated"]), frames
        else:  # open() uses it as a register: the walk goes astray above the caller, and says so
            assert "frame pointers" in stacks.loc[int(stack_id), "truncated"]
    mine = rec.fd_sites[rec.fd_sites["pid"] == program.pid]
    exhausted = mine[mine["stack_id"].isin([i for i, s in stacks["frames"].items()
                                            if any(f.startswith("exhaust_descriptors+") for f in s)])]
    assert exhausted["open"].max() == made  # every socket it made, while it lived
    assert leaks(rec, pid=program.pid)["site"].tolist() == []  # its exit closed them all
    assert int(rec.losses["stacks_full_total"].max()) == 0 and int(rec.losses["fds_full_total"].max()) == 0


def _failures_with_stacks(rec: Any, pid: int) -> int:
    """How many of ``pid``'s EMFILE failures are recorded with a symbolized stack."""
    failures = rec.events[(rec.events["pid"] == pid) & (rec.events["errno"] == "EMFILE")]
    if rec.stacks is None or not len(rec.stacks):
        return 0
    return int(failures["stack_id"].isin(set(rec.stacks["stack_id"])).sum())


def _most_open_at(rec: Any, pid: int, function: str) -> int:
    """The most descriptors ``pid`` held open at once from call sites whose stack holds ``function``."""
    if rec.fd_sites is None or rec.stacks is None or not len(rec.fd_sites) or not len(rec.stacks):
        return 0
    ids = [i for i, frames in zip(rec.stacks["stack_id"], rec.stacks["frames"], strict=True)
           if any(f.startswith(function) for f in frames)]
    mine = rec.fd_sites[(rec.fd_sites["pid"] == pid) & rec.fd_sites["stack_id"].isin(ids)]
    return int(mine["open"].max()) if len(mine) else 0


def test_exec_keeps_only_the_descriptors_without_close_on_exec(sites_binary: Path) -> None:
    program = Program([str(sites_binary), "exec"])
    try:
        data = leaks_json(program, 4.5, ["opened", "exec'd"])
    finally:
        program.finish()
    made = [site for site in data["sites"] if site["site"] != "(from before tracing)"]
    assert len(made) == 1, data["sites"]
    site = made[0]
    assert site["site"].startswith("open_before_exec+"), site
    # the second loop's call: the first's three close-on-exec sockets, closed by the exec, were
    # made by another call instruction, a site of their own with none open (not listed)
    assert (site["open"], site["opened"], site["closed"]) == (2, 2, 0)


def test_close_range_and_fork_leave_no_false_leaks(sites_binary: Path) -> None:
    for mode, function in (("close_range", "open_then_close_range"), ("fork", "before_fork")):
        program = Program([str(sites_binary), mode])
        try:
            data = leaks_json(program, 2.5, ["done"])
        finally:
            program.finish()
        made = [site for site in data["sites"] if site["site"] != "(from before tracing)"]
        assert made == [], (mode, made)
        assert not any(function in frame for frame in frames_of(data))


def test_leaks_text_output(sites_binary: Path) -> None:
    program = Program([str(sites_binary), "leak", "3", "1"])
    tracer = traced(program, ["leaks", "--pid", str(program.pid), "--duration", "2", "--interval", "0.5"])
    try:
        program.go()
        assert program.line() == "done"
        out, err = tracer.communicate(timeout=60)
    finally:
        program.finish()
    assert tracer.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"fdtrace leaks: pid {program.pid} (sites), traced ")
    assert lines[0].endswith(": 3 descriptors made then are still open")
    site = next(line for line in lines if "leak_sockets+" in line and "at " not in line)
    assert site.split()[:3] == ["3", "3", "0"]
    assert lines[-1] == "lost: nothing"


def test_threads_census_and_creation_sites(sites_binary: Path) -> None:
    workers = 12
    program = Program([str(sites_binary), "threads", str(workers)])
    tracer = traced(program, ["threads", "--pid", str(program.pid), "--stacks", "--duration", "2", "--json"])
    try:
        program.go()
        assert program.line() == "started"
        out, err = tracer.communicate(timeout=60)
    finally:
        program.finish()
    assert tracer.returncode == 0, err
    data = json.loads(out)
    assert data["threads"] == workers + 1
    census = {(s["syscall"], s["fd_kind"], s["site"]): s["threads"] for s in data["census"]}
    assert census[("read", "pipe", "blocked_worker")] == workers  # the workers on their pipe, in their function
    assert census[("read", "pipe", "wait_eof")] == 1  # main on its stdin pipe
    sites = data["creation_sites"]
    assert sites[0]["site"].startswith("spawn_workers+"), sites
    assert sites[0]["threads"] == workers
    assert sum(site["threads"] for site in sites) == workers


WINDOW = r"the (\d+\.\d) s traced \((\d\d:\d\d:\d\d) to (\d\d:\d\d:\d\d) UTC"


def test_threads_stacks_says_no_thread_started_in_its_window(sites_binary: Path) -> None:
    """Issue 35: a process that starts no thread while watched: one line says so, with the window
    (its length and wall times), not an empty answer after a silent wait."""
    program = Program([str(sites_binary), "threads", "4"])  # waits for a byte it never gets: no thread
    try:
        tracer = traced(program, ["threads", "--pid", str(program.pid), "--stacks", "--duration", "1"])
        out, err = tracer.communicate(timeout=60)
    finally:
        program.finish()
    assert tracer.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"pid {program.pid} (sites): 1 threads; "), out
    said = re.fullmatch(rf"no thread started during {WINDOW}, --duration 1\)", lines[-1])
    assert said is not None, out
    assert 1.0 <= float(said[1]) < 3.0  # the window asked for, as long as it was


def test_threads_stacks_stops_when_the_process_ends_and_says_so(sites_binary: Path) -> None:
    """The watched process ends early in a 60 s window: the tracing stops then, and says that no
    thread started before its end (and, in JSON, the window and what ended it)."""
    for as_json in (False, True):
        program = Program([str(sites_binary), "threads", "4"])
        tracer = traced(program, ["threads", "--pid", str(program.pid), "--stacks", "--duration", "60",
                                  *(["--json"] if as_json else [])])
        try:
            began = time.monotonic()
            program.finish()  # stdin closed before its byte: it exits 3
            out, err = tracer.communicate(timeout=60)
            stopped_in = time.monotonic() - began
        finally:
            if tracer.poll() is None:
                tracer.kill()
                tracer.wait()
        assert tracer.returncode == 0, err
        assert stopped_in < 20, stopped_in  # not the 60 s asked for
        assert f"process {program.pid} ended " in err and "(exit 3)" in err, err
        if as_json:
            data = json.loads(out)
            assert data["creation_sites"] == [] and data["window"]["stopped_by"] == "process ended"
            assert data["window"]["duration_asked"] == 60 and data["window"]["seconds"] < 20
        else:
            last = out.splitlines()[-1]
            assert re.fullmatch(f"no thread started during {WINDOW}; process {program.pid} ended before the "
                                "--duration 60 s\\)", last), out


def test_leaks_refuses_a_missing_process() -> None:
    result = subprocess.run([FDTRACE, "leaks", "--pid", "999999999"], capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["fdtrace: error: no process 999999999"]


def test_replay_shows_a_recorded_leak_in_the_process_detail(sites_binary: Path, tmp_path: Path) -> None:
    import asyncio

    from textual.widgets import Static

    from fdtrace.sources.replay import ReplaySource
    from fdtrace.tui.screens import ProcessScreen

    out = tmp_path / "rec"
    program = Program([str(sites_binary), "leak", "6", "2"])
    recorder = traced(program, ["record", "-o", str(out), "--pid", str(program.pid), "--stacks", "--interval", "0.5"],
                      marker="recording to")
    try:
        program.go()
        assert program.line() == "done"
        wait_recorded(out, lambda rec: _most_open_at(rec, program.pid, "leak_sockets+") == 6
                      and rec.thread_census is not None and bool((rec.thread_census["pid"] == program.pid).any()),
                      "the leaking site's figures, its stack and a thread census, recorded")
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.communicate(timeout=60)
        program.finish()
    recorded = leaks(load(out), pid=program.pid)
    assert recorded["site"].str.startswith("leak_sockets+").tolist() == [True, False]
    assert recorded["site"].iloc[1] == "(from before tracing)"
    assert recorded["open"].iloc[0] == 6
    report = tmp_path / "report.md"
    result = subprocess.run([FDTRACE, "report", str(out), "-o", str(report)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    section = report.read_text().split("## Open descriptors by call site", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in section.splitlines() if "leak_sockets+" in line)
    assert [cell.strip() for cell in row.strip("|").split("|")][3:6] == ["6", "6", "0"]
    census = report.read_text().split("## What the threads were doing", 1)[1].split("\n## ", 1)[0]
    assert "| read |" in census and "| pipe |" in census

    now = [0]
    feed = ReplaySource(out, clock=lambda: now[0])
    app = replay_app(feed)

    async def main() -> None:
        async with app.run_test(size=(180, 50)) as pilot:
            await replay_to_end(pilot, feed, now, step_ns=500_000_000, steps=100)
            app.push_screen(ProcessScreen(program.pid))
            await pilot.pause(0.5)
            text = str(app.screen.query_one("#detail", Static).render())
            assert "open descriptors by call site (--stacks):" in text, text
            line = next(line for line in text.splitlines() if "leak_sockets+" in line)
            assert line.split()[0] == "6"
            assert "threads now: 1 thread blocked in read() on pipes" in text

    asyncio.run(main())


def test_trace_prints_the_stack_of_each_failure(sites_binary: Path) -> None:
    program = Program(["prlimit", "--nofile=24:24", str(sites_binary), "emfile"])
    tracer = traced(program, ["trace", "--pid", str(program.pid), "--stacks", "--errors-only", "--json"],
                    marker="tracing (")
    output = Lines(tracer.stdout)
    try:
        program.go()
        _made, failed = (int(part.split("=")[1]) for part in program.line().split())
        # stacks are symbolized while their process lives: it ends once its failures are printed
        output.until(lambda lines: sum('"EMFILE"' in line for line in lines) >= failed,
                     "the EMFILE failures printed")
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=60)
        program.finish()
    assert tracer.stderr is not None
    tracer.stderr.close()
    out = output.rest()
    events = [json.loads(line) for line in out.splitlines()]
    failures = [e for e in events if e["errno"] == "EMFILE"]
    assert len(failures) == failed == 4
    for event in failures:
        assert event["stack"][1].startswith("exhaust_descriptors+"), event


def test_a_binary_replaced_by_a_fifo_does_not_hang_the_symbolizer(sites_binary: Path, tmp_path: Path) -> None:
    """A traced program's file is deleted and a FIFO planted at its path: a symbolizer that opens
    modules by path would wait on the FIFO forever. fdtrace reads the very file the process maps
    (its /proc/PID/map_files entry), so the names still come, and the FIFO is never opened."""
    copy = tmp_path / "planted" / "sites"
    copy.parent.mkdir()
    shutil.copy(sites_binary, copy)
    program = Program([str(copy), "leak", "4", "1"])
    try:
        eventually(lambda: os.readlink(f"/proc/{program.pid}/exe") == str(copy), "the copy running")
        copy.unlink()
        os.mkfifo(copy)
        data = leaks_json(program, 2, ["done"])
    finally:
        program.finish()
    made = [site for site in data["sites"] if site["site"] != "(from before tracing)"]
    assert [site["open"] for site in made] == [4]
    frames = made[0]["frames"]
    assert frames[1].startswith("leak_sockets+") and frames[1].endswith(" [sites (deleted)]"), frames


def test_leaks_of_a_process_that_exits_while_traced_are_kept_and_printed(sites_binary: Path) -> None:
    """Its end is the moment that matters: what it held at its last look before the exit is
    printed, with a note saying it ended, instead of an error that throws the tracing away."""
    program = Program([str(sites_binary), "leak", "6", "2"])
    tracer = traced(program, ["leaks", "--pid", str(program.pid), "--duration", "60", "--interval", "0.2"])
    try:
        program.go()
        assert program.line() == "done"
        time.sleep(1.0)  # five sweeps (--interval 0.2) see the six sockets before the program ends
        program.finish()  # its stdin closes: it exits 0, its sockets with it
        out, err = tracer.communicate(timeout=60)
    finally:
        if tracer.poll() is None:
            tracer.kill()
            tracer.wait()
    assert tracer.returncode == 0, err
    assert f"process {program.pid} ended " in err and "what follows is what was traced up to its end" in err
    rows = [line.split() for line in out.splitlines() if "leak_sockets+" in line and line.split()[0].isdigit()]
    assert len(rows) == 1 and rows[0][:3] == ["6", "6", "0"], out  # open, opened, closed


def test_threads_of_a_go_program_that_dies_while_traced_are_printed(tmp_path: Path) -> None:
    """`threads --stacks` on the Go incident: the program dies of its thread limit while traced;
    where its threads were created and its last census are printed, with how it ended."""
    from tests.bpf.test_go_threads import GOROUTINES, build

    if shutil.which("go") is None:
        pytest.skip("golang-go is not installed")
    program = subprocess.Popen([str(build(tmp_path)), str(GOROUTINES), "wait", "250"], stdin=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    tracer = subprocess.Popen([FDTRACE, "threads", "--pid", str(program.pid), "--stacks", "--duration", "60"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(tracer.stderr, "tracing pid")
        assert program.stdin is not None
        program.stdin.write(b"x")
        program.stdin.flush()
        assert program.wait(timeout=60) == 2
        out, err = tracer.communicate(timeout=60)
    finally:
        for process in (program, tracer):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert tracer.returncode == 0, err
    assert f"process {program.pid} ended " in err and "(exit 2)" in err, err
    lines = out.splitlines()
    assert lines[0].startswith(f"pid {program.pid} (go-threads): "), out
    started = lines.index(next(line for line in lines if line.startswith("threads started in ")))
    counts = [int(line.split()[0]) for line in lines[started + 1:] if line[:7].strip().isdigit()]
    assert sum(counts) >= 200, out  # the threads it made before the runtime killed it at 250
