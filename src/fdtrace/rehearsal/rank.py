"""The ranks: each one a thread of this process or a process of its own, driven the same way.

A rank serves JSON lines on a pair of descriptors: ``burst`` (open that many connections at an
instant; progress lines, then the outcome), ``give_up`` (during a burst: stop waiting for
answers), ``check`` (which held connections the target closed), ``close`` and ``exit``. A
thread rank serves them on a socket pair, a process rank (``python -m fdtrace.rehearsal.rank
FAMILY HOST PORT``) on its stdin and stdout, so both run the same code.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
from typing import Any

from fdtrace.children import CHILD_CWD, child_environment, python_module_command
from fdtrace.rehearsal.connections import RankConnections

#: Seconds a rank process may take to start (the machine may be busy: it is under test).
START_TIMEOUT_S = 60.0


class RankGoneError(Exception):
    """A rank ended, or stopped answering, while it was driven."""


class LineChannel:
    """JSON messages, one a line, read from one descriptor and written to another."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        """Write one message (the descriptors are blocking: it is written whole)."""
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.write_fd, data):]

    def pending(self) -> bool:
        """Whether a whole message has been read and not yet taken."""
        return b"\n" in self._buffer

    def take(self) -> dict[str, Any] | None:
        """The next message already read, None when there is none."""
        if not self.pending():
            return None
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    def fill(self) -> None:
        """Read what is waiting (call when the descriptor is readable). Raises RankGoneError
        at the end of the stream."""
        chunk = os.read(self.read_fd, 65536)
        if not chunk:
            raise RankGoneError("the rank ended")
        self._buffer += chunk

    def receive(self, timeout_s: float | None = None) -> dict[str, Any]:
        """The next message, waiting for it (at most ``timeout_s``). Raises RankGoneError at the
        end of the stream or when none comes in time."""
        while not self.pending():
            if timeout_s is not None and not select.select([self.read_fd], [], [], timeout_s)[0]:
                raise RankGoneError(f"the rank did not answer within {timeout_s:.0f} s")
            self.fill()
        message = self.take()
        assert message is not None
        return message


def serve(channel: LineChannel, family: int, address: tuple[Any, ...]) -> None:
    """A rank's loop: take commands from ``channel`` until ``exit`` or the end of the stream."""
    connections = RankConnections(family, address)
    channel.send({"ready": os.getpid()})
    try:
        while True:
            try:
                command = channel.receive()
            except RankGoneError:
                return
            op = command.get("op")
            if op == "exit":
                return
            if op == "burst":
                outcome = connections.open(
                    int(command["count"]), int(command["at_ns"]), float(command["timeout_s"]),
                    bytes.fromhex(command["payload"]), bool(command["reply"]), woken=channel.pending,
                    wake_fd=channel.read_fd, on_progress=lambda answered: channel.send({"answered": answered}))
                channel.send({"done": outcome})
            elif op == "check":
                channel.send({"checked": connections.check()})
            elif op == "close":
                channel.send({"closed": connections.close()})
            # "give_up" after the burst it was meant for ended by itself: nothing to stop
    finally:
        connections.close()


class Rank:
    """The coordinator's side of one rank: its channel and how to end it."""

    def __init__(self, index: int, channel: LineChannel) -> None:
        self.index = index
        self.channel = channel
        self.pid: int | None = None

    def wait_ready(self) -> None:
        """Wait for the rank's first message (it is serving). Raises RankGoneError."""
        message = self.channel.receive(START_TIMEOUT_S)
        self.pid = int(message["ready"])

    def stop(self) -> None:
        """Ask the rank to close its connections and end, and wait for it."""


class ThreadRank(Rank):
    """A rank that is a thread of this process, served on a socket pair."""

    def __init__(self, index: int, family: int, address: tuple[Any, ...]) -> None:
        self._ours, self._theirs = socket.socketpair()
        super().__init__(index, LineChannel(self._ours.fileno(), self._ours.fileno()))
        theirs = self._theirs.fileno()
        self._thread = threading.Thread(target=serve, args=(LineChannel(theirs, theirs), family, address),
                                        name=f"fdtrace-rank-{index}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        try:
            self.channel.send({"op": "exit"})
        except OSError:
            pass
        self._thread.join(timeout=30)
        self._ours.close()
        self._theirs.close()


class ProcessRank(Rank):
    """A rank that is a process of its own (``python -I -m fdtrace.rehearsal.rank``), served on
    its stdin and stdout; it inherits this process's descriptor limits, and nothing of the
    caller's working directory or environment (``fdtrace.children``): rehearse runs as root,
    often from a directory another user can write."""

    def __init__(self, index: int, family: int, host: str, port: int) -> None:
        self._process = subprocess.Popen(python_module_command("fdtrace.rehearsal.rank", str(family), host, str(port)),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                         env=child_environment(), cwd=CHILD_CWD, close_fds=True)
        assert self._process.stdin is not None and self._process.stdout is not None
        super().__init__(index, LineChannel(self._process.stdout.fileno(), self._process.stdin.fileno()))

    def stop(self) -> None:
        try:
            self.channel.send({"op": "exit"})
        except OSError:
            pass
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                stream.close()


def main(argv: list[str]) -> int:
    """A rank process: ``FAMILY HOST PORT``, then commands on stdin, answers on stdout."""
    family, host, port = int(argv[0]), argv[1], int(argv[2])
    address: tuple[Any, ...] = (host, port) if family == socket.AF_INET else (host, port, 0, 0)
    serve(LineChannel(sys.stdin.fileno(), sys.stdout.fileno()), family, address)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
