"""One rank's connections: opened at one instant, answered or failed, held, checked, closed.

The standard library only: a rank process imports nothing else. Every socket is non-blocking
and one selector waits on all of them, so a rank's connections are really in flight at once.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

#: How a connection failed, as counted in a rank's outcome.
REFUSED = "refused"
RESET = "reset"
CLOSED = "closed unanswered"
UNANSWERED = "unanswered"
NOT_CONNECTED = "not connected"
CLOSED_IN_HOLD = "closed during the hold"
RESET_IN_HOLD = "reset during the hold"

#: Errors of this host, not of the target: the rehearsal stops and says so.
OWN_ERRNOS = {errno.EMFILE: "fdtrace's own descriptors ran out (EMFILE)",
              errno.ENFILE: "this host's file table is full (ENFILE)",
              errno.EADDRNOTAVAIL: "this host ran out of local ports for the target (EADDRNOTAVAIL)",
              errno.ENOBUFS: "this host ran out of socket buffers (ENOBUFS)",
              errno.ENOMEM: "this host ran out of memory for sockets (ENOMEM)"}

#: Connections that failed so say this host cannot reach the target at all (no route): the
#: rehearsal stops and says so, the target is not to blame.
UNREACHABLE = frozenset({"ENETUNREACH", "EHOSTUNREACH"})

#: Progress is reported at most this often while a burst waits for its answers.
PROGRESS_INTERVAL_S = 0.05


def reason_of(code: int) -> str:
    """A failure's name from an errno."""
    if code == errno.ECONNREFUSED:
        return REFUSED
    if code in (errno.ECONNRESET, errno.EPIPE):
        return RESET
    return errno.errorcode.get(code, f"errno {code}")


class RankConnections:
    """The connections one rank holds against one address.

    Args:
        family: the address family (``socket.AF_INET`` or ``AF_INET6``).
        address: the target as ``socket.connect`` takes it.
    """

    def __init__(self, family: int, address: tuple[Any, ...]) -> None:
        self.family = family
        self.address = address
        self.held: list[socket.socket] = []

    def open(self, count: int, at_ns: int, timeout_s: float, payload: bytes, reply: bool,
             woken: Callable[[], bool] = lambda: False, wake_fd: int | None = None,
             on_progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        """At ``at_ns`` (CLOCK_MONOTONIC), start ``count`` connections at once; each sends
        ``payload`` once connected and is held once answered (or, without ``reply``, once
        connected). Waits at most ``timeout_s`` for all of them, or until ``wake_fd`` is
        readable (or ``woken()``): then the ones still waiting count as unanswered.

        Returns the outcome: ``answered``, ``failures`` by reason, ``own`` (an error of this
        host that stopped the opening, else None) and the times of the first failure and the
        last answer."""
        failures: Counter[str] = Counter()
        first_failure_ns: int | None = None
        last_answer_ns: int | None = None
        own: str | None = None

        def failed(sock: socket.socket | None, reason: str) -> None:
            nonlocal first_failure_ns
            failures[reason] += 1
            if first_failure_ns is None:
                first_failure_ns = time.monotonic_ns()
            if sock is not None:
                if sock in waiting:
                    selector.unregister(sock)
                    del waiting[sock]
                sock.close()

        def answered(sock: socket.socket) -> None:
            nonlocal last_answer_ns
            selector.unregister(sock)
            del waiting[sock]
            self.held.append(sock)
            last_answer_ns = time.monotonic_ns()

        time.sleep(max(0.0, (at_ns - time.monotonic_ns()) / 1e9))
        deadline = time.monotonic() + timeout_s
        selector = selectors.DefaultSelector()
        waiting: dict[socket.socket, str] = {}  # socket -> "connecting" or "answering"
        try:
            for _ in range(count):
                try:
                    sock = socket.socket(self.family, socket.SOCK_STREAM)
                except OSError as exc:
                    if exc.errno in OWN_ERRNOS:
                        own = OWN_ERRNOS[exc.errno]
                        break
                    failed(None, reason_of(exc.errno or 0))
                    continue
                sock.setblocking(False)
                code = sock.connect_ex(self.address)
                if code in OWN_ERRNOS:
                    sock.close()
                    own = OWN_ERRNOS[code]
                    break
                if code not in (0, errno.EINPROGRESS):
                    failed(sock, reason_of(code))
                    continue
                waiting[sock] = "connecting"
                selector.register(sock, selectors.EVENT_WRITE)
            if wake_fd is not None:
                selector.register(wake_fd, selectors.EVENT_READ)
            next_progress = 0.0
            while waiting and own is None:
                now = time.monotonic()
                if now >= deadline or woken():
                    break
                if on_progress is not None and now >= next_progress:
                    on_progress(len(self.held))
                    next_progress = now + PROGRESS_INTERVAL_S
                ready = selector.select(min(deadline - now, PROGRESS_INTERVAL_S))
                if any(key.fileobj == wake_fd for key, _ in ready):
                    break
                for key, _ in ready:
                    sock = key.fileobj  # type: ignore[assignment]
                    if waiting.get(sock) == "connecting":
                        self._connected(sock, payload, reply, waiting, selector, failed, answered)
                    elif waiting.get(sock) == "answering":
                        self._answer(sock, failed, answered)
            for sock, state in list(waiting.items()):
                failed(sock, NOT_CONNECTED if state == "connecting" else UNANSWERED)
        finally:
            selector.close()
        if on_progress is not None:
            on_progress(len(self.held))
        return {"answered": len(self.held), "failures": dict(failures), "own": own,
                "first_failure_ns": first_failure_ns, "last_answer_ns": last_answer_ns}

    @staticmethod
    def _connected(sock: socket.socket, payload: bytes, reply: bool, waiting: dict[socket.socket, str],
                   selector: selectors.BaseSelector, failed: Callable[[socket.socket, str], None],
                   answered: Callable[[socket.socket], None]) -> None:
        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            failed(sock, reason_of(code))
            return
        if payload:
            try:
                sock.send(payload)
            except OSError as exc:
                failed(sock, reason_of(exc.errno or 0))
                return
        if not reply:
            answered(sock)
            return
        waiting[sock] = "answering"
        selector.modify(sock, selectors.EVENT_READ)

    @staticmethod
    def _answer(sock: socket.socket, failed: Callable[[socket.socket, str], None],
                answered: Callable[[socket.socket], None]) -> None:
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError as exc:
            failed(sock, reason_of(exc.errno or 0))
            return
        if data:
            answered(sock)
        else:
            failed(sock, CLOSED)

    def check(self) -> dict[str, int]:
        """The held connections that the target closed or reset meanwhile, by reason (they
        are closed and no longer held); answers still arriving are read and dropped."""
        lost: Counter[str] = Counter()
        kept = []
        for sock in self.held:
            try:
                while True:
                    data = sock.recv(65536)
                    if not data:
                        lost[CLOSED_IN_HOLD] += 1
                        sock.close()
                        break
            except BlockingIOError:
                kept.append(sock)
            except OSError:
                lost[RESET_IN_HOLD] += 1
                sock.close()
        self.held = kept
        return dict(lost)

    def close(self) -> int:
        """Close every held connection; returns how many there were."""
        closed = len(self.held)
        for sock in self.held:
            sock.close()
        self.held = []
        return closed
