"""A clean stop, always: `record --stacks` stopped by --duration, SIGINT and SIGTERM, 20 times in a
row, while a Go program (its runtime uprobe attached) and a program holding tracked descriptors
run, exits 0 with no traceback and a complete recording each time.

bcc 0.26's symbol caches closed a descriptor number they never opened when freed, which closed
fdtrace's own program descriptors at random (then bcc's cleanup failed with EBADF); fdtrace now
symbolizes with its own ELF reader and owns every descriptor of its programs."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bpf.test_go_threads import build
from tests.conftest import needs_root
from tests.helpers import FDTRACE

pytestmark = [needs_root(), pytest.mark.bpf,
              pytest.mark.skipif(shutil.which("go") is None, reason="golang-go is not installed")]

STOPS = 20

HOLDER = """
import socket, sys, time
held = []
print("ready", flush=True)
while True:  # new descriptors all the time (each one tracked with its call site), 40 held
    held.append(socket.socket())
    if len(held) > 40:
        held.pop(0).close()
    time.sleep(0.002)
"""


def test_twenty_stops_in_a_row_are_clean(tmp_path: Path) -> None:
    binary = build(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    go = None
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        for i in range(STOPS):
            how = ("duration", "SIGINT", "SIGTERM")[i % 3]
            out = tmp_path / f"rec{i}"
            argv = [FDTRACE, "record", "--stacks", "-o", str(out), "--interval", "0.3"]
            recorder = subprocess.Popen(argv + (["--duration", "1"] if how == "duration" else []),
                                        stderr=subprocess.PIPE, text=True)
            assert recorder.stderr is not None
            said = []
            for line in recorder.stderr:
                said.append(line)
                if "recording to" in line:
                    break
            go = subprocess.Popen([str(binary), "50"], stdout=subprocess.DEVNULL)  # watched from its exec on
            if how != "duration":
                deadline = time.monotonic() + 30  # a round or two is on disk, the Go uprobe attached by then
                while len(list(out.glob("samples/host=*/part-*.parquet"))) < 2 and time.monotonic() < deadline:
                    time.sleep(0.05)
                recorder.send_signal(getattr(signal, how))
            said += recorder.stderr.readlines()
            assert recorder.wait(timeout=60) == 0, (how, "".join(said))
            text = "".join(said)
            assert "Traceback" not in text and "Error" not in text, (how, text)
            meta = json.loads(next((out / "meta").glob("host=*.json")).read_text())
            assert meta["complete"] is True, (how, text)
            # its Go program's uprobe was attached when it stopped (other Go programs of a busy host too)
            watched = re.search(r"(\d+) Go binar(?:y|ies) watched for its thread-limit message", said[-1])
            assert watched is not None and int(watched.group(1)) >= 1, (how, text)
            go.kill()
            go.wait()
    finally:
        for process in (go, holder):
            if process is not None:
                process.kill()
                process.wait()
