"""Makes tests/data/newcomer: `fdtrace record --stacks` of what a newcomer met (issue 25), about 40 s.

Run as root from the repository root:  .venv/bin/python tests/data/make_newcomer_recording.py

- burst-64, under `prlimit --nofile=64:64`, opens sockets as fast as it can from the first moment
  until socket() fails with EMFILE, fails 30 more times, holds its sockets 6 s and exits 1: an
  incident in the first seconds of the recording;
- steady-web opens and closes a socket every 0.1 s for the whole recording (a baseline), exits 0;
- haproxy under `prlimit --nofile=256:256` (maxconn 4096, one bind and one stats socket, which
  the recorder polls) is pushed to its limit by 160 client connections held for 8 s;
- go-threads (debug.SetMaxThreads(300)) pins 50 more OS threads per second in blocking reads
  until the runtime says "program exceeds 300-thread limit" and exits 2;
- clean-90 holds 920 descriptors of 1024 for 6 s and exits 0;
- bash runs grep every 0.3 s, and from 20 s on 300 greps back to back: close() churn only.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).parent / "newcomer"
FDTRACE = str(Path(sys.executable).with_name("fdtrace"))
PY = [sys.executable, "-S", "-c"]

BURST = """
import os, socket, sys, time
open('/proc/self/comm', 'w').write('burst-64')
sys.stdin.readline()
held = []
while True:
    try:
        held.append(socket.socket())
    except OSError:
        break
for _ in range(30):
    try: socket.socket()
    except OSError: pass
time.sleep(6)
os._exit(1)
"""
STEADY = """
import socket, sys, time
open('/proc/self/comm', 'w').write('steady-web')
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    socket.socket().close()
    time.sleep(0.1)
"""
HOLDER = """
import os, sys, time
open('/proc/self/comm', 'w').write(sys.argv[1])
held = [os.open('/dev/null', os.O_RDONLY) for _ in range(int(sys.argv[2]))]
time.sleep(float(sys.argv[3]))
"""
CLIENTS = """
import socket, sys, time
open('/proc/self/comm', 'w').write('clients')
held = []
for _ in range(160):
    try:
        s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2)
        held.append(s)
    except OSError:
        pass
time.sleep(8)
"""
GO = """package main

import (
	"runtime/debug"
	"syscall"
	"time"
)

func holdThread(fd int) {
	buf := make([]byte, 1)
	syscall.Read(fd, buf)
}

func main() {
	debug.SetMaxThreads(300)
	for i := 0; ; i++ {
		var fds [2]int
		if err := syscall.Pipe(fds[:]); err != nil {
			panic(err)
		}
		go holdThread(fds[0])
		if i%5 == 4 {
			time.Sleep(100 * time.Millisecond)
		}
	}
}
"""


def build_go(work: Path) -> Path:
    (work / "threads.go").write_text(GO)
    binary = work / "go-threads"
    env = {**os.environ, "GOCACHE": str(work / "cache"), "GOPATH": str(work / "gopath"), "HOME": str(work),
           "GO111MODULE": "off", "GOFLAGS": ""}
    subprocess.run(["go", "build", "-o", str(binary), str(work / "threads.go")], check=True, env=env, cwd=work,
                   capture_output=True, timeout=300)
    return binary


def start_haproxy(work: Path) -> tuple[subprocess.Popen[str], int, socket.socket, Path]:
    backend = socket.socket()
    backend.bind(("127.0.0.1", 0))
    backend.listen(4096)
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    stats = work / "stats.sock"
    config = work / "haproxy.cfg"
    config.write_text(
        f"global\n    maxconn 4096\n    ulimit-n 256\n    no strict-limits\n    stats socket {stats} mode 600\n"
        "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n"
        f"frontend fe\n    bind 127.0.0.1:{port}\n    default_backend be\n"
        f"backend be\n    server s1 127.0.0.1:{backend.getsockname()[1]}\n")
    proc = subprocess.Popen(["prlimit", "--nofile=256:256", "haproxy", "-db", "-f", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    while not stats.exists():
        assert proc.poll() is None, "haproxy did not start"
        time.sleep(0.05)
    return proc, port, backend, stats


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix="fdtrace-newcomer-"))
    go = build_go(work)
    haproxy, port, backend, stats = start_haproxy(work)
    burst = subprocess.Popen(["prlimit", "--nofile=64:64", *PY, BURST], stdin=subprocess.PIPE, text=True)
    recorder = subprocess.Popen([FDTRACE, "record", "-o", str(OUT), "--pid", str(os.getpid()), "--pid",
                                 str(haproxy.pid), "--pid", str(burst.pid), "--follow", "--interval", "0.5",
                                 "--top", "0", "--stacks", "--shared", "--haproxy-socket", str(stats)],
                                stderr=subprocess.PIPE, text=True)
    assert recorder.stderr is not None
    for line in recorder.stderr:
        if "recording to" in line:
            break
    start = time.monotonic()
    assert burst.stdin is not None
    burst.stdin.write("go\n")
    burst.stdin.flush()
    others = [subprocess.Popen([*PY, STEADY, "38"])]
    time.sleep(3)
    others.append(subprocess.Popen([*PY, CLIENTS, str(port)]))
    others.append(subprocess.Popen(["bash", "-c", "for i in $(seq 100); do grep -q root /etc/passwd; sleep 0.3; done"]))
    time.sleep(2)
    others.append(subprocess.Popen([str(go)], stderr=subprocess.DEVNULL))
    time.sleep(3)
    others.append(subprocess.Popen(["prlimit", "--nofile=1024:4096", *PY, HOLDER, "clean-90", "917", "6"]))
    time.sleep(max(0.0, 20 - (time.monotonic() - start)))
    others.append(subprocess.Popen(["bash", "-c", "for i in $(seq 300); do grep -q root /etc/passwd; done"]))
    for proc in [burst, *others]:
        proc.wait(timeout=120)
    time.sleep(1.5)
    recorder.send_signal(signal.SIGINT)
    recorder.communicate(timeout=60)
    haproxy.terminate()
    haproxy.wait(timeout=10)
    backend.close()
    shutil.rmtree(work, ignore_errors=True)
    print(f"recorded {time.monotonic() - start:.0f} s to {OUT}")


if __name__ == "__main__":
    main()
