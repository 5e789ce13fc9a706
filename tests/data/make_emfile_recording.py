"""Makes tests/data/emfile: `fdtrace record` of a process that runs out of file descriptors.

Run as root from the repository root:  .venv/bin/python tests/data/make_emfile_recording.py

The child, under `prlimit --nofile=64:64`, opens 8 sockets every 0.25 s until socket() fails
with EMFILE, fails 3 more times (socket twice, pipe once), starts 4 threads, and exits with 1.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).parent / "emfile"
FDTRACE = str(Path(sys.executable).with_name("fdtrace"))
CHILD = """
import os, socket, sys, threading, time
sys.stdin.readline()
held = []
while True:
    try:
        for _ in range(8):
            held.append(socket.socket())
    except OSError:
        break
    time.sleep(0.25)
for attempt in (socket.socket, socket.socket, os.pipe):
    try: attempt()
    except OSError: pass
threads = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
time.sleep(0.6)
os._exit(1)
"""


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    child = subprocess.Popen(["prlimit", "--nofile=64:64", sys.executable, "-S", "-c", CHILD],
                             stdin=subprocess.PIPE, text=True)
    recorder = subprocess.Popen([FDTRACE, "record", "-o", str(OUT), "--pid", str(child.pid), "--top", "0",
                                 "--interval", "0.5", "--shared"], stderr=subprocess.PIPE, text=True)
    assert recorder.stderr is not None
    for line in recorder.stderr:
        if "recording to" in line:
            break
    time.sleep(0.3)
    child.communicate("go\n", timeout=60)
    time.sleep(0.8)
    recorder.send_signal(signal.SIGINT)
    recorder.communicate(timeout=30)
    print(f"recorded pid {child.pid} (exit {child.returncode}) to {OUT}")


if __name__ == "__main__":
    main()
