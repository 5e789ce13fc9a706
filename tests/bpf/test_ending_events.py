"""The events that end a process (an OOM kill, Go's thread limit) are kept in the kernel beside the
ring until taken (issue 34): the live view gets them ahead of the ring's backlog, in a round
brought forward, once each; and a ring that a flood filled does not lose them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fdtrace.kernel.loader import TraceOptions
from fdtrace.pipeline.update import Update
from fdtrace.sources.live import LiveOptions, LiveSource
from tests.conftest import needs_root
from tests.helpers import memory_cgroup

pytestmark = [needs_root(), pytest.mark.bpf]

TAG = os.getpid() % 100000
HOG_NAME = f"oomhog-{TAG}"
HOG = f"""
import ctypes
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"{HOG_NAME}"), 0, 0, 0)  # PR_SET_NAME
chunks = []
while True:
    chunks.append(bytearray(16 << 20))
"""
#: socket() and close() 5,000 times: 10,000 events, about 0.9 MB, where the small ring holds 64 KiB.
FLOOD = "import socket\nfor _ in range(5000):\n    socket.socket().close()\n"
SMALL_RING_PAGES = 16


def oom_killed_hog() -> int:
    """A Python program that allocates until its memory cgroup's OOM killer ends it: its pid."""
    with memory_cgroup(limit_bytes=96 << 20) as procs_file:
        hog = subprocess.Popen(["sh", "-c", f'echo $$ > {procs_file} && exec "$0" -S -c "$1"', sys.executable, HOG])
        assert hog.wait(timeout=60) == -signal.SIGKILL
    return hog.pid


def hog_kills(update: Update, pid: int) -> list[dict]:
    return [e for e in update.events.to_pylist() if e["kind"] == "oom_kill" and e["pid"] == pid]


def first_update_with_the_kill(source: LiveSource, pid: int, seen: list[Update]) -> Update:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        update = source.poll()
        seen.append(update)
        if hog_kills(update, pid):
            return update
        time.sleep(0.01)
    pytest.fail("the OOM kill never came out of the live source")


def test_an_oom_kill_comes_in_a_round_of_its_own_once() -> None:
    """Rounds 30 s apart: the OOM kill brings one forward, whose events are the kill alone; the
    ring's copy of it is dropped, so the kill is counted once, and the ring's events (the
    victim's SIGKILL exit) still come."""
    source = LiveSource(LiveOptions(trace=TraceOptions(), comms=(HOG_NAME,), top_processes=0, keep_exited=0,
                                    interval_s=30.0, failures_first=True))
    source.start()
    try:
        source.poll()  # the round at start
        pid = oom_killed_hog()
        seen: list[Update] = []
        update = first_update_with_the_kill(source, pid, seen)
        assert update.rounds and update.counters is not None
        assert update.events["kind"].to_pylist() == ["oom_kill"]
        [kill] = hog_kills(update, pid)
        assert kill["comm"] == HOG_NAME and 48 << 10 <= kill["anon_rss_kb"] <= 96 << 10
        seen.append(source.finish())  # everything the ring holds
    finally:
        source.stop()
    events = [e for u in seen for e in u.events.to_pylist() if e["pid"] == pid]
    assert [e["kind"] for e in events].count("oom_kill") == 1
    assert [e["signal"] for e in events if e["kind"] == "process_exit"] == ["SIGKILL"]


def test_a_ring_full_of_a_flood_does_not_lose_the_oom_kill() -> None:
    """A 64 KiB ring, not read while a flood of 10,000 events and then the OOM kill happen: the
    ring dropped events (counted), yet the first poll after hands out the kill, with its sizes."""
    source = LiveSource(LiveOptions(trace=TraceOptions(ring_pages=SMALL_RING_PAGES), comms=(HOG_NAME,),
                                    top_processes=0, keep_exited=0, interval_s=30.0, failures_first=True))
    source.start()
    try:
        source.poll()
        subprocess.run([sys.executable, "-c", FLOOD], check=True, timeout=60)
        pid = oom_killed_hog()
        update = source.poll()
        [kill] = hog_kills(update, pid)
        assert kill["comm"] == HOG_NAME and kill["total_vm_kb"] >= kill["anon_rss_kb"] >= 48 << 10
        assert update.rounds and update.losses["ringbuf_full"] > 0, update.losses
        rest = source.finish()
    finally:
        source.stop()
    assert hog_kills(rest, pid) == []
