"""Makes tests/data/emfile: `fdtrace record` of a process that runs out of file descriptors,
next to two that do not.

Run as root from the repository root:  .venv/bin/python tests/data/make_emfile_recording.py

- emfile-child, under `prlimit --nofile=64:64`, opens 8 sockets every 0.25 s until socket()
  fails with EMFILE, fails 3 more times (socket twice, pipe once), starts 4 threads, exits with 1;
- busy-85 holds 870 descriptors under a soft limit of 1024 (85 %, an amber alert);
- quiet-10 holds about 100 descriptors under 1024.
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
HOLDER = """
import os, sys, time
open('/proc/self/comm', 'w').write(sys.argv[1])
held = [os.open('/dev/null', os.O_RDONLY) for _ in range(int(sys.argv[2]))]
sys.stdin.readline()
time.sleep(4)
"""
CHILD = """
import os, socket, sys, threading, time
open('/proc/self/comm', 'w').write('emfile-child')
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
    holders = [subprocess.Popen(["prlimit", "--nofile=1024:4096", sys.executable, "-S", "-c", HOLDER, name, str(n)],
                                stdin=subprocess.PIPE, text=True) for name, n in (("busy-85", 867), ("quiet-10", 97))]
    time.sleep(0.5)
    pids = [str(p.pid) for p in (child, *holders)]
    recorder = subprocess.Popen([FDTRACE, "record", "-o", str(OUT), *(a for pid in pids for a in ("--pid", pid)),
                                 "--interval", "0.5", "--shared", "--top", "6"], stderr=subprocess.PIPE, text=True)
    assert recorder.stderr is not None
    for line in recorder.stderr:
        if "recording to" in line:
            break
    time.sleep(0.3)
    for holder in holders:
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()
    child.communicate("go\n", timeout=60)
    for holder in holders:
        holder.communicate(timeout=60)
    time.sleep(0.8)
    recorder.send_signal(signal.SIGINT)
    recorder.communicate(timeout=30)
    print(f"recorded pid {child.pid} (exit {child.returncode}) to {OUT}")


if __name__ == "__main__":
    main()
