"""A synthetic fleet of recordings, written through fdtrace's own RecordingWriter: each host a
recording under a common root, shaped like the incident (DDP ranks' all-reduce bursts every step,
a checkpoint storm in which ranks run out of descriptors and one is OOM-killed, haproxy workers
failing accept4 with EMFILE on some hosts, a Go worker whose threads grow).

``generate_fleet`` returns what it wrote, per host, so that tests can assert exact counts and the
benchmark can say how many events it asked the engines to read. Deterministic for a seed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from fdtrace.recording.writer import RecordingWriter
from fdtrace.schema import SCHEMA_VERSION

SECOND = 1_000_000_000
#: Wall time of every host's first round.
EPOCH_NS = 1_795_000_000 * SECOND


@dataclass
class HostTruth:
    """What one host's recording holds."""

    host: str
    events: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    fd_errors: Counter[tuple[int, str, str]] = field(default_factory=Counter)  # (pid, syscall, errno)
    oom_kills: list[int] = field(default_factory=list)  # victims' pids
    ringbuf_full: int = 0
    first_failure_ns: int | None = None  # wall ns of the host's first EMFILE/ENFILE or OOM kill


@dataclass(frozen=True)
class Process:
    pid: int
    comm: str
    fd_limit: int


def _processes(index: int) -> list[Process]:
    base = 1000 + index * 10
    return [Process(base, "haproxy", 4096), Process(base + 1, "python", 1024), Process(base + 2, "python", 1024),
            Process(base + 3, "worker", 1 << 20)]


Segment = tuple[Process, str, str, str, int]  # (process, kind, syscall, errno, count)


def _round_segments(index: int, second: int, seconds: int, per_second: int,
                    procs: list[Process]) -> list[Segment]:
    """One second's events of one host, as runs of alike events."""
    haproxy, rank0, rank1, worker = procs
    checkpoint = seconds // 2 <= second < seconds // 2 + 3
    burst = 6.0 if checkpoint else 3.0 if second % 4 == 3 else 1.0  # a DDP step every 4 s: all-reduce last
    total = int(per_second * burst / 1.55)
    shares = {haproxy.pid: 0.45, rank0.pid: 0.25, rank1.pid: 0.25}
    segments: list[Segment] = []
    for proc in (haproxy, rank0, rank1):
        n = int(total * shares[proc.pid])
        opened, connects = n // 3, n // 6
        segments.append((proc, "accept", "accept4", "", opened) if proc is haproxy else
                        (proc, "socket", "socket", "", opened))
        segments += [(proc, "connect", "connect", "EINPROGRESS", connects),
                     (proc, "close", "close", "", n - opened - connects)]
    if checkpoint:  # the ranks open checkpoint shards until their tables are full
        segments += [(rank0, "fd_error", "openat", "EMFILE", 40 + index % 7),
                     (rank1, "fd_error", "openat", "EMFILE", 25 + index % 5)]
    if index % 4 == 0 and seconds // 2 - 2 <= second < seconds // 2 + 4:  # haproxy out of descriptors
        segments.append((haproxy, "accept", "accept4", "EMFILE", 200 + index))
    if second > seconds // 2 + 1:  # the ranks' peer on host 0 was OOM-killed: their connects fail
        segments.append((rank0, "connect", "connect", "ECONNREFUSED", 1 + index % 2))
    segments.append((worker, "thread_start", "", "", 2))
    return [s for s in segments if s[4] > 0]


def _peer(process: Process, kind: str) -> tuple[str | None, int | None]:
    """Where a connect goes: haproxy to its backend on loopback, the ranks to rank 0's store."""
    if kind != "connect":
        return None, None
    return ("127.0.0.1", 8080) if process.comm == "haproxy" else ("10.0.0.1", 29500)


#: How long after the client's row (SYN-ACK in) the server's row (final ACK in) is, in true time.
HANDSHAKE_NS = 30_000


def address(index: int) -> str:
    return f"10.0.{index // 250}.{index % 250 + 1}"


def _connections(index: int, first: int, hosts: int, second: int, boot_ns: int, offset: int) -> pa.Table:
    """This host's rows of the round's connections with its neighbours: it connects to the next
    host and to the previous one, and each of them connects to it (true times alike on every
    host, before its own clock's error)."""
    after, before = first + (index - first + 1) % hosts, first + (index - first - 1) % hosts
    start = boot_ns + second * SECOND + 500_000_000  # the clients' rows, on every host's clock alike
    to_next, to_previous, server = 40000 + second, 41000 + second, 29500
    rows = {
        "ts_ns": [start, start, start + HANDSHAKE_NS, start + HANDSHAKE_NS],
        "role": ["client", "client", "server", "server"], "family": ["AF_INET"] * 4,
        "local_addr": [address(index)] * 4, "local_port": [to_next, to_previous, server, server],
        # the previous host's connection to its next one (this), and the next host's to its previous
        "remote_addr": [address(after), address(before), address(before), address(after)],
        "remote_port": [server, server, to_next, to_previous],
    }
    table = pa.table({**rows, "local_port": pa.array(rows["local_port"], pa.int32()),
                      "remote_port": pa.array(rows["remote_port"], pa.int32())})
    return table.append_column("time", pa.array([t + offset for t in rows["ts_ns"]], pa.timestamp("ns", tz="UTC")))


def _dictionary(values: list[str], counts: np.ndarray) -> pa.DictionaryArray:
    names = sorted(set(values))
    codes = np.repeat(np.array([names.index(v) for v in values], dtype=np.int32), counts)
    return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(names))


def generate_fleet(root: Path, hosts: int, events_per_host: int, seconds: int = 120, seed: int = 7,
                   flush_every: int = 10, clock_errors_ns: dict[int, int] | None = None,
                   index_offset: int = 0, fleet_hosts: int | None = None) -> list[HostTruth]:
    """Write ``hosts`` recordings under ``root`` (``root/host-NN``), about ``events_per_host``
    events each over ``seconds`` seconds, a part file per ``flush_every`` seconds.
    ``clock_errors_ns``: host index -> how far that host's wall clock is off (added to its time).
    ``index_offset``: the first host's index, ``fleet_hosts``: how many hosts the whole fleet has
    (hosts written by several workers: each connects to its neighbours in the whole fleet)."""
    rng = np.random.default_rng(seed)
    # The shape (bursts, the storm) makes some seconds busier: scale so the host gets its events.
    probe = 1_000_000
    shaped = sum(n for second in range(seconds) for *_, n in _round_segments(0, second, seconds, probe,
                                                                          _processes(0)))
    per_second = max(1, round(events_per_host * probe / shaped))
    truths = []
    for index in range(index_offset, index_offset + hosts):
        name = f"host-{index:02d}"
        truth = HostTruth(name)
        boot_ns = (1000 + 37 * index) * SECOND  # CLOCK_MONOTONIC at the first round differs per host
        offset = EPOCH_NS - boot_ns + (clock_errors_ns or {}).get(index, 0)
        writer = RecordingWriter(root / name, name, {"schema_version": SCHEMA_VERSION, "host": name,
                                                     "kernel": "synthetic", "fdtrace_version": "bench"})
        procs = _processes(index)
        for second in range(seconds):
            segments = _round_segments(index, second, seconds, per_second, procs)
            if index == 0 and second == seconds // 2 + 1:  # one rank is OOM-killed in the storm
                segments.append((procs[2], "oom_kill", "", "", 1))
                truth.oom_kills.append(procs[2].pid)
            counts = np.array([s[4] for s in segments])
            count = int(counts.sum())
            # Events of a second in time order; the OOM kill (last segment) comes last.
            ts = boot_ns + second * SECOND + np.sort(rng.integers(0, SECOND - 1, count))
            order = np.argsort(rng.random(count) + np.repeat([s[1] == "oom_kill" for s in segments], counts),
                               kind="stable")
            pids = np.repeat(np.array([s[0].pid for s in segments], dtype=np.int32), counts)[order]
            errno = _dictionary([s[3] for s in segments], counts).take(pa.array(order))
            events = pa.table({
                "ts_ns": pa.array(ts, pa.int64()),
                "time": pa.array(ts + offset, pa.timestamp("ns", tz="UTC")),
                "host": _dictionary([name], np.array([count])),
                "pid": pa.array(pids), "tid": pa.array(pids),
                "start_ns": pa.array(np.full(count, boot_ns // 2), pa.int64()),
                "comm": _dictionary([s[0].comm for s in segments], counts).take(pa.array(order)),
                "kind": _dictionary([s[1] for s in segments], counts).take(pa.array(order)),
                "syscall": _dictionary([s[2] for s in segments], counts).take(pa.array(order)),
                "errno": errno,
                "ret": pa.array(np.repeat(np.array([-24 if s[3] else 3 for s in segments]), counts)[order], pa.int64()),
                "peer_addr": pa.array(np.repeat(np.array([_peer(s[0], s[1])[0] for s in segments], dtype=object),
                                                counts)[order], pa.string()).dictionary_encode(),
                "peer_port": pa.array(np.repeat(np.array([_peer(s[0], s[1])[1] for s in segments], dtype=object),
                                                counts)[order], pa.int32()),
            })
            writer.add("events", events)
            truth.events += count
            for proc, kind, syscall, err, n in segments:
                truth.kinds[kind] += n
                if err in ("EMFILE", "ENFILE"):
                    truth.fd_errors[(proc.pid, syscall, err)] += n
            failing = np.repeat([s[3] in ("EMFILE", "ENFILE") or s[1] == "oom_kill" for s in segments], counts)[order]
            if failing.any() and truth.first_failure_ns is None:
                truth.first_failure_ns = int(ts[failing].min() + offset)
            now = boot_ns + (second + 1) * SECOND
            storm = seconds // 2 <= second < seconds // 2 + 3
            opened = [min(p.fd_limit, 200 + second * 3) if p.comm == "haproxy" and index % 4 == 0 else
                      (p.fd_limit if storm and p.comm == "python" else 64 + second % 16) for p in procs]
            writer.add("samples", pa.table({
                "ts_ns": pa.array([now] * len(procs), pa.int64()),
                "pid": pa.array([p.pid for p in procs], pa.int64()),
                "start_ns": pa.array([boot_ns // 2] * len(procs), pa.int64()),
                "comm": [p.comm for p in procs], "open_fds": pa.array(opened, pa.int64()),
                "fd_soft_limit": pa.array([p.fd_limit for p in procs], pa.int64()),
                "fd_hard_limit": pa.array([p.fd_limit for p in procs], pa.int64()),
                "threads": pa.array([8, 12, 12, 10 + 2 * second], pa.int64()),
                "go_max_threads": pa.array([None, None, None, 10000], pa.int64()),
                "time": pa.array([now + offset] * len(procs), pa.timestamp("ns", tz="UTC")),
            }))
            lost = 5 if index == 1 and second == 3 else 0
            truth.ringbuf_full += lost
            writer.add("losses", pa.table({"ts_ns": pa.array([now], pa.int64()),
                                           "ringbuf_full": pa.array([lost], pa.int64()),
                                           "time": pa.array([now + offset], pa.timestamp("ns", tz="UTC"))}))
            writer.add("clock", pa.table({"ts_ns": pa.array([now], pa.int64()),
                                          "realtime_offset_ns": pa.array([offset], pa.int64()),
                                          "boottime_offset_ns": pa.array([0], pa.int64())}))
            ring = fleet_hosts or hosts
            if ring > 1 and second % 10 == 5:  # a connection to the next host and one from the previous
                writer.add("connections", _connections(index, 0 if fleet_hosts else index_offset, ring, second,
                                                       boot_ns, offset))
            writer.add("system", pa.table({
                "ts_ns": pa.array([now], pa.int64()), "file_nr": pa.array([5000], pa.int64()),
                "file_max": pa.array([1 << 20], pa.int64()), "threads_max": pa.array([100000], pa.int64()),
                "threads_total": pa.array([400 + 2 * second], pa.int64()),
                "time": pa.array([now + offset], pa.timestamp("ns", tz="UTC"))}))
            if (second + 1) % flush_every == 0 or second == seconds - 1:
                writer.flush()
        writer.write_meta(complete=True)
        writer.close()
        truths.append(truth)
    return truths
