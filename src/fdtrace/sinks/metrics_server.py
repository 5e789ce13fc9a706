"""The HTTP server of /metrics, bounded whatever its clients do: one thread reads every request
head (non-blocking, each within a deadline), a fixed pool of threads answers, and connections are
capped in all and per peer (on loopback a peer is a local user, told by the owner of its socket),
so that no client, however many connections it opens or however slowly it sends, can grow the
threads or descriptors of fdtrace past these bounds, or keep a scrape of another from being
answered."""

from __future__ import annotations

import gzip
import selectors
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from fdtrace.procfs.reader import ProcFS
from fdtrace.procfs.sockets import PeerLookup, is_loopback, local_peer_uids

#: Connections open at once, in all (each one descriptor) and per peer.
MAX_CONNECTIONS = 16
MAX_PER_PEER = 4
#: Threads that answer requests (the reader of request heads is one more).
WORKERS = 2
#: A request head must arrive whole, within this long and this many bytes; an answer must be sent
#: within this long.
HEAD_TIMEOUT_S = 5.0
MAX_HEAD_BYTES = 8192
SEND_TIMEOUT_S = 10.0
#: How often the reader looks at the deadlines and whether to stop.
TICK_S = 0.25
#: Connections accepted at a time before their peers are looked up (each a descriptor meanwhile),
#: and at most per tick.
ACCEPT_BATCH = 4
MAX_ACCEPTS_PER_TICK = 256
#: Descriptors the server holds at most: its listening socket, the connections, a batch being
#: accepted (connections refused are closed at once) and the netlink socket that asks who its
#: peers are, while it does.
DESCRIPTORS = 2 + MAX_CONNECTIONS + ACCEPT_BATCH


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    peer: tuple[Any, ...]  # who it counts against: ("uid", N) on loopback, else ("address", IP)
    deadline: float
    head: bytearray = field(default_factory=bytearray)
    released: bool = False


class MetricsServer:
    """Serves ``registry`` on ADDRESS:PORT (port 0: any free one, then in ``port``).

    Attributes:
        refused: connections closed at once or cut off, by reason ("busy": the cap in all;
            "peer": the peer's cap; "timeout": the head came too slowly; "too large"; "bad
            request").
    """

    def __init__(self, address: str, port: int, registry: CollectorRegistry, procfs: ProcFS | None = None) -> None:
        self.registry = registry
        self.procfs = procfs or ProcFS()
        family, kind, proto, _name, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                                               flags=socket.AI_PASSIVE)[0]
        self._listener = socket.socket(family, kind, proto)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(where)
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.address, self.port = self._listener.getsockname()[:2]
        self.refused: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._open: Counter[tuple[Any, ...]] = Counter()  # connections held, per peer
        self._held = 0
        # poll(2): no descriptor of its own (epoll's would be one more), no FD_SETSIZE (select's)
        self._selector = selectors.PollSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._answering: set[_Connection] = set()  # handed to the pool, not answered yet
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="fdtrace-metrics")
        self._stopping = False
        self._reader = threading.Thread(target=self._serve, name="fdtrace-metrics-reader", daemon=True)
        self._reader.start()

    def close(self) -> None:
        """Stop serving (within ``TICK_S``): the listener and every connection are closed, the
        threads end."""
        self._stopping = True
        self._reader.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            left = list(self._answering)
        for connection in left:  # their answers were cancelled
            self._release(connection)

    # The reader thread: accepts, reads heads, hands whole requests to the pool.

    def _serve(self) -> None:
        heads: dict[int, _Connection] = {}
        try:
            while not self._stopping:
                try:
                    self._tick(heads)
                except Exception:  # noqa: BLE001 - counted; it serves on
                    self.refused["server error"] += 1
                    time.sleep(TICK_S)
        finally:
            for connection in list(heads.values()):
                self._drop(heads, connection)
            self._selector.close()
            self._listener.close()

    def _tick(self, heads: dict[int, _Connection]) -> None:
        """Wait for what comes within a tick, take it, and cut off the heads past their deadline."""
        ready = self._selector.select(timeout=TICK_S)
        accepted: list[_Connection] = []
        for key, _events in ready:
            if key.data is None:
                accepted += self._accept_all()
            else:
                self._read_head(heads, key.data)
        for connection in accepted:
            heads[connection.sock.fileno()] = connection
            self._selector.register(connection.sock, selectors.EVENT_READ, connection)
        now = time.monotonic()
        for connection in [c for c in heads.values() if c.deadline <= now]:
            self.refused["timeout"] += 1
            self._drop(heads, connection)

    def _accept_all(self) -> list[_Connection]:
        """Take what waits on the listener (a few at a time: each is a descriptor until its peer is
        known), admitting each connection whose peer has room; the rest are closed at once."""
        admitted: list[_Connection] = []
        for _ in range(MAX_ACCEPTS_PER_TICK // ACCEPT_BATCH):
            batch: list[socket.socket] = []
            while len(batch) < ACCEPT_BATCH:
                try:
                    sock, _ = self._listener.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:  # out of descriptors, or the client gave up: a tick later, again
                    self.refused["accept failed"] += 1
                    time.sleep(TICK_S)  # (the listener stays readable: not a busy loop meanwhile)
                    break
                batch.append(sock)
            admitted += self._admit(batch)
            if len(batch) < ACCEPT_BATCH:
                break
        return admitted

    def _admit(self, accepted: list[socket.socket]) -> list[_Connection]:
        """The accepted connections with room, in all and for their peer, each counted against it."""
        if not accepted:
            return []
        ends = []
        for sock in accepted:
            try:
                ends.append((sock.getsockname()[:2], sock.getpeername()[:2]))
            except OSError:
                ends.append((("", 0), ("", 0)))
        local = [i for i, (_ours, peer) in enumerate(ends) if peer[0] and is_loopback(peer[0])]
        uids = self._peer_uids([ends[i] for i in local]) if local else []
        peers: list[tuple[Any, ...]] = [("address", peer[0]) for _ours, peer in ends]
        for i, uid in zip(local, uids, strict=True):
            if uid is not None:
                peers[i] = ("uid", uid)
        admitted = []
        deadline = time.monotonic() + HEAD_TIMEOUT_S
        for sock, peer in zip(accepted, peers, strict=True):
            with self._lock:
                refused = "busy" if self._held >= MAX_CONNECTIONS else "peer" if self._open[peer] >= MAX_PER_PEER \
                    else None
                if refused is None:
                    self._open[peer] += 1
                    self._held += 1
            if refused is not None:
                self.refused[refused] += 1
                sock.close()
                continue
            sock.setblocking(False)
            admitted.append(_Connection(sock, peer, deadline))
        return admitted

    def _peer_uids(self, ends: list[tuple[tuple[str, int], tuple[str, int]]]) -> list[int | None]:
        """The uid owning each local peer's socket: asked of the kernel one socket at a time
        (``PeerLookup``: the same cost whether the host holds ten connections or ten thousand);
        read from /proc/net/tcp only where the kernel cannot be asked so."""
        try:
            lookup = PeerLookup()
        except OSError:
            return local_peer_uids(self.procfs, ends)
        with lookup:
            return [lookup.uid(ours, peer) for ours, peer in ends]

    def _read_head(self, heads: dict[int, _Connection], connection: _Connection) -> None:
        try:
            chunk = connection.sock.recv(MAX_HEAD_BYTES + 1 - len(connection.head))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(heads, connection)
            return
        connection.head += chunk
        end = connection.head.find(b"\r\n\r\n")
        if end < 0:
            end = connection.head.find(b"\n\n")
        if end < 0:
            if len(connection.head) > MAX_HEAD_BYTES:
                self.refused["too large"] += 1
                self._drop(heads, connection, b"431 Request Header Fields Too Large")
            return
        self._selector.unregister(connection.sock)
        del heads[connection.sock.fileno()]
        with self._lock:
            self._answering.add(connection)
        self._pool.submit(self._answer, connection, bytes(connection.head[:end]))

    def _drop(self, heads: dict[int, _Connection], connection: _Connection, status: bytes | None = None) -> None:
        heads.pop(connection.sock.fileno(), None)
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        if status is not None:
            try:
                connection.sock.send(b"HTTP/1.1 " + status + b"\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass
        self._release(connection)

    def _release(self, connection: _Connection) -> None:
        with self._lock:
            if connection.released:
                return
            connection.released = True
            self._answering.discard(connection)
        connection.sock.close()
        with self._lock:
            self._held -= 1
            self._open[connection.peer] -= 1
            if self._open[connection.peer] <= 0:
                del self._open[connection.peer]

    # The pool: one whole request each.

    def _answer(self, connection: _Connection, head: bytes) -> None:
        try:
            status, headers, body = self._respond(head)
            connection.sock.setblocking(True)
            connection.sock.settimeout(SEND_TIMEOUT_S)  # for the whole answer (sendall)
            lines = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in headers),
                     f"Content-Length: {len(body)}", "Connection: close", "", ""]
            connection.sock.sendall("\r\n".join(lines).encode("latin-1") + body)
        except OSError:
            self.refused["send failed"] += 1
        except Exception:  # noqa: BLE001 - a collector that failed: counted, never silent
            self.refused["answer failed"] += 1
        finally:
            self._release(connection)

    def _respond(self, head: bytes) -> tuple[str, list[tuple[str, str]], bytes]:
        lines = head.decode("latin-1").splitlines()
        parts = lines[0].split() if lines else []
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self.refused["bad request"] += 1
            return "400 Bad Request", [], b""
        method, target = parts[0], urlsplit(parts[1])
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", [("Allow", "GET, HEAD")], b""
        if target.path not in ("/", "/metrics"):
            return "404 Not Found", [], b""
        fields = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                fields[name.strip().lower()] = value.strip()
        encoder, content_type = choose_encoder(fields.get("accept", ""))
        registry: Any = self.registry
        names = parse_qs(target.query).get("name[]")
        if names:
            registry = registry.restricted_registry(names)
        body = encoder(registry)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(fields.get("accept-encoding", "")):
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        return "200 OK", headers, b"" if method == "HEAD" else body
