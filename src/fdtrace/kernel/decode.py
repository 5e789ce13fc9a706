"""Raw BPF event records to the columns of the event model, in bulk with numpy."""

from __future__ import annotations

import errno as errno_module
import signal as signal_module
import socket

import numpy as np
import pyarrow as pa

from fdtrace.procfs import StartTimeResolver
from fdtrace.procfs.containers import Placement
from fdtrace.schema import (
    KIND_LABELS,
    LIMIT_RESOURCES,
    RAW_EVENT_DTYPE,
    STACK_KINDS,
    STACK_SLOT,
    SYSCALL_NAMES,
    Kind,
    arrow_schema,
    slot,
)
from fdtrace.schema.codecs import host_column
from fdtrace.schema.records import ClockOffsets
from fdtrace.schema.tables import PARTITION_COLUMN

_KIND_DICT = [KIND_LABELS.get(i, "") for i in range(max(KIND_LABELS) + 1)]
_ERRNO_DICT = [""] + [errno_module.errorcode.get(i, f"E{i}") for i in range(1, 4096)]


def _enum_names(enum: type, numbers: range, prefix: str) -> list[str]:
    """Names of an enum's members by number (``PREFIX<n>`` for numbers it lacks)."""
    names = []
    for number in numbers:
        try:
            names.append(enum(number).name)
        except ValueError:
            names.append(f"{prefix}{number}")
    return names


_SIGNAL_NAMES = [""] + _enum_names(signal_module.Signals, range(1, 65), "SIG")


def _kinds_table(kinds: tuple[Kind, ...]) -> np.ndarray:
    """A lookup table by kind number: True for ``kinds`` (``table[raw["kind"]]`` is one gather)."""
    table = np.zeros(256, dtype=bool)
    table[[int(k) for k in kinds]] = True
    return table


_IS_SYSCALL = _kinds_table((Kind.SOCKET, Kind.ACCEPT, Kind.CONNECT, Kind.CLOSE, Kind.FD_ERROR))
_HAS_RET = _kinds_table((Kind.SOCKET, Kind.ACCEPT, Kind.CONNECT, Kind.CLOSE, Kind.FD_ERROR, Kind.LIMIT_CHANGE,
                         Kind.GO_THREAD_LIMIT))
_HAS_PEER = _kinds_table((Kind.CONNECT, Kind.ACCEPT))
_HAS_STACK = _kinds_table(STACK_KINDS)


def _dictionary(codes: np.ndarray, values: list[str] | pa.Array, mask: np.ndarray | None = None) -> pa.Array:
    """A dictionary column of int32 ``codes`` into ``values`` (a list, or an array made once)."""
    if not isinstance(values, pa.Array):
        values = pa.array(values, type=pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32, copy=False), mask=mask), values)


def _masked(values: np.ndarray, valid: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    if not valid.any():
        return pa.nulls(len(values), arrow_type)
    return pa.array(values, type=arrow_type, mask=~valid)


def _run_heads(columns: list[np.ndarray]) -> np.ndarray:
    """Where a row differs from the row before it in any of ``columns`` (the first row always):
    events come in runs of one process and one name, so the distinct values are found among
    the heads of the runs, not by sorting every row."""
    n = len(columns[0])
    heads = np.empty(n, dtype=bool)
    if n:
        heads[0] = True
        np.not_equal(columns[0][1:], columns[0][:-1], out=heads[1:])
        for column in columns[1:]:
            heads[1:] |= column[1:] != column[:-1]
    return heads


def _distinct(values: np.ndarray, words: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` (the distinct values sorted, and each row's
    index among them), sorting only the heads of the runs of equal values (``words``: the
    values as integer columns to compare, when ``values`` are not integers)."""
    heads = _run_heads(words if words is not None else [values])
    distinct, inverse = np.unique(values[heads], return_inverse=True)
    return distinct, inverse.reshape(-1)[np.cumsum(heads) - 1]


def _comm_column(comms: np.ndarray) -> pa.Array:
    """Task names, each cut at its first NUL: a tracepoint may copy the bytes that follow it
    (oom:mark_victim gave "python\\0gnu"). Names that are equal once cut share one entry."""
    comms = np.ascontiguousarray(comms)
    words = comms.view(np.uint64).reshape(len(comms), 2)
    unique, inverse = _distinct(comms, [words[:, 0], words[:, 1]])
    codes, names, _ = _encoded([raw.split(b"\0", 1)[0].decode("utf-8", "replace") for raw in unique])
    return _dictionary(codes[inverse], names)


def _encoded(texts: list[str | None]) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Dictionary codes of ``texts`` (equal texts share one), the distinct texts in order of
    first sight, and where a text is None (its code is 0)."""
    values: list[str] = []
    index: dict[str, int] = {}
    codes = np.zeros(len(texts), dtype=np.int32)
    missing = np.zeros(len(texts), dtype=bool)
    for i, text in enumerate(texts):
        if text is None:
            missing[i] = True
            continue
        code = index.get(text)
        if code is None:
            code = index[text] = len(values)
            values.append(text)
        codes[i] = code
    return codes, values, missing


_FAMILY_NAMES = _enum_names(socket.AddressFamily, range(256), "AF_")
_FAMILY_VALUES = pa.array(_FAMILY_NAMES, type=pa.string())


def _peer_columns(raw: np.ndarray, kinds: np.ndarray) -> tuple[pa.Array, pa.Array, pa.Array]:
    """The peer from the first 24 bytes of a sockaddr (extra[0..2]): connect()'s destination or
    accept()'s client: family, address (IPv4, IPv6) and port. Null where it could not be read."""
    n = len(raw)
    first = slot(Kind.CONNECT, "sockaddr0")
    assert slot(Kind.ACCEPT, "sockaddr0") == first
    rows = np.flatnonzero(_HAS_PEER[kinds])  # only these rows hold a sockaddr
    if not len(rows):
        none = pa.nulls(n, pa.int32())
        return (pa.DictionaryArray.from_arrays(none, _FAMILY_VALUES),
                pa.DictionaryArray.from_arrays(none, pa.array([], pa.string())), none)
    family = np.zeros(n, dtype=np.int32)
    port = np.zeros(n, dtype=np.int32)
    codes = np.zeros(n, dtype=np.int32)
    sockaddr = np.ascontiguousarray(raw["extra"][rows, first:first + 3]).view(np.uint8).reshape(len(rows), 24)
    family[rows] = sockaddr[:, 0].astype(np.int32) | (sockaddr[:, 1].astype(np.int32) << 8)
    port[rows] = (sockaddr[:, 2].astype(np.int32) << 8) | sockaddr[:, 3].astype(np.int32)
    row_family = family[rows]
    row_inet = (row_family == socket.AF_INET) | (row_family == socket.AF_INET6)
    codes[rows], values = _inet_texts(sockaddr, np.where(row_inet, row_family, 0), ipv4_at=4, ipv6_at=8)
    known = _HAS_PEER[kinds] & (family != 0) & (family < 256)
    inet = known & ((family == socket.AF_INET) | (family == socket.AF_INET6))
    return (_dictionary(np.where(known, family, 0), _FAMILY_VALUES, mask=~known),
            _dictionary(codes, values, mask=~inet),
            _masked(port, inet, pa.int32()))


def _inet_texts(data: np.ndarray, family: np.ndarray, ipv4_at: int, ipv6_at: int) -> tuple[np.ndarray, list[str]]:
    """Dictionary codes and texts of the addresses in the bytes of each row (``data``, uint8 rows),
    an IPv4 address at ``ipv4_at`` where ``family`` is AF_INET, IPv6 at ``ipv6_at`` for AF_INET6
    (other rows get code 0, to be masked). The text of each distinct address is made once,
    however many rows share it."""
    codes = np.zeros(len(data), dtype=np.int32)
    values: list[str] = []
    for af, start, width, key_type in ((socket.AF_INET, ipv4_at, 4, "<u4"), (socket.AF_INET6, ipv6_at, 16, "V16")):
        rows = np.flatnonzero(family == af)
        if not len(rows):
            continue
        keys = np.ascontiguousarray(data[rows, start:start + width]).view(key_type).reshape(-1)
        distinct, inverse = np.unique(keys, return_inverse=True)
        codes[rows] = len(values) + inverse.reshape(-1)
        values += [socket.inet_ntop(af, key.tobytes()) for key in distinct]
    return codes, values


def _start_times(raw: np.ndarray, offsets: ClockOffsets, resolver: StartTimeResolver,
                 unique: np.ndarray, inverse: np.ndarray) -> pa.Array:
    pids = raw["pid"]
    kinds = raw["kind"]
    lifecycle = (kinds == Kind.PROCESS_START) | (kinds == Kind.PROCESS_EXIT)
    ordered_pids = np.unique(pids[lifecycle])
    # One lookup per distinct pid, spread over its rows.
    in_order = set(ordered_pids.tolist())
    per_pid = [None if pid in in_order else resolver.lookup(pid) for pid in unique.tolist()]
    known_per_pid = np.array([s is not None for s in per_pid], dtype=bool)
    starts = np.array([s or 0 for s in per_pid], dtype=np.int64)[inverse]
    known = known_per_pid[inverse]
    if len(ordered_pids):
        _lifecycle_starts(raw, offsets, resolver, ordered_pids, starts, known)
    return _masked(starts, known, pa.int64())


def _lifecycle_starts(raw: np.ndarray, offsets: ClockOffsets, resolver: StartTimeResolver,
                      ordered_pids: np.ndarray, starts: np.ndarray, known: np.ndarray) -> None:
    """The start of each row of the processes that start or exit in this batch, so that a pid
    reused within the batch gets each process's own start: as if their rows were walked in order
    (a start is noted, an exit forgets the process, any other row looks it up), asking the
    resolver only where its answer can change (a pid's first row, a start or an exit, the row
    after an exit); every other row has the answer of the row of its pid before it."""
    pids = raw["pid"]
    rows = np.flatnonzero(np.isin(pids, ordered_pids))
    grouped = rows[np.argsort(pids[rows], kind="stable")]  # by pid, each pid's rows in order
    group_pids = pids[grouped]
    group_kinds = raw["kind"][grouped]
    exits = group_kinds == Kind.PROCESS_EXIT
    first = np.ones(len(grouped), dtype=bool)
    first[1:] = group_pids[1:] != group_pids[:-1]
    asked = first | exits | (group_kinds == Kind.PROCESS_START)
    asked[1:] |= exits[:-1] & ~first[1:]
    points = np.flatnonzero(asked)
    values = np.zeros(len(grouped), dtype=np.int64)
    valid = np.zeros(len(grouped), dtype=bool)
    for point in points[np.argsort(grouped[points], kind="stable")].tolist():  # in the batch's order
        row = int(grouped[point])
        pid = int(pids[row])
        if int(group_kinds[point]) == Kind.PROCESS_START:
            start: int | None = resolver.started(pid, int(raw["ts_ns"][row]), offsets.boottime_offset_ns)
        else:
            start = resolver.lookup(pid)
        values[point] = start or 0
        valid[point] = start is not None
        if exits[point]:
            resolver.exited(pid)
    source = np.maximum.accumulate(np.where(asked, np.arange(len(grouped)), 0))
    starts[grouped] = values[source]
    known[grouped] = valid[source]


#: The placement columns of an event and the Placement attribute each one is.
_PLACEMENT_COLUMNS = (("cgroup", "cgroup"), ("unit", "unit"), ("container_id", "container_id"),
                      ("container_runtime", "runtime"), ("pod_uid", "pod_uid"))
_NO_PLACEMENT = pa.dictionary(pa.int32(), pa.string())


def _placements(raw: np.ndarray, resolver: StartTimeResolver, unique: np.ndarray,
                inverse: np.ndarray) -> dict[str, pa.Array]:
    """Each row's cgroup, unit, container and pod: one lookup per distinct pid of the batch (read
    before its exits are seen, so a process that ends in the batch is still placed). A pid reused
    within one batch gets its first process's placement."""
    kinds = raw["kind"]
    pids = raw["pid"]
    started = kinds == Kind.PROCESS_START
    parents: dict[int, int] = {}
    if started.any():
        ppids = _slot(raw["extra"], Kind.PROCESS_START, "ppid")[started]
        parents = dict(zip(pids[started].tolist(), ppids.tolist(), strict=True))
    execed = set(pids[kinds == Kind.PROCESS_EXEC].tolist())
    exited = set(pids[kinds == Kind.PROCESS_EXIT].tolist())  # not read: gone, or their pid reused
    per_pid: dict[int, Placement | None] = {}
    # Parents before the children they started, so that a child already gone takes theirs.
    now_ns = resolver.clock()
    for pid in sorted(unique.tolist(), key=lambda pid: pid in parents):
        per_pid[pid] = resolver.placement_of(pid, parents.get(pid), reread=pid in execed, now_ns=now_ns,
                                             gone=pid in exited)
    placed = [per_pid[pid] for pid in unique.tolist()]
    n = len(raw)
    columns = {}
    for column, attribute in _PLACEMENT_COLUMNS:
        texts = [getattr(where, attribute) if where is not None else None for where in placed]
        if all(text is None for text in texts):
            columns[column] = pa.nulls(n, _NO_PLACEMENT)
            continue
        codes, values, missing = _encoded(texts)
        columns[column] = _dictionary(codes[inverse], values, mask=missing[inverse] if missing.any() else None)
    return columns


def _slot(extra: np.ndarray, kind: Kind, name: str, dtype: type = np.int32) -> np.ndarray:
    """One kind's named extra slot, over every record (meaningful only in that kind's rows)."""
    return extra[:, slot(kind, name)].astype(dtype)


def _stack_ids(raw: np.ndarray, kinds: np.ndarray) -> pa.Array:
    """--stacks: the stack id in the last slot of the kinds that have one (0: none)."""
    stacked = _HAS_STACK[kinds]
    if not stacked.any():
        return pa.nulls(len(kinds), pa.int64())
    ids = np.ascontiguousarray(raw["extra"][:, STACK_SLOT]).view(np.int64)
    return _masked(ids, stacked & (ids != 0), pa.int64())


def decode(
    raw: bytes | np.ndarray, host: str, offsets: ClockOffsets, resolver: StartTimeResolver
) -> pa.Table:
    """Decode ``struct fdt_event`` records into an events table.

    Args:
        raw: records as read from the ring buffer: concatenated bytes, or an array of
            ``RAW_EVENT_DTYPE``.
        host: the traced machine's name.
        offsets: clock offsets sampled at the poll that read the records.
        resolver: gives process start times; updated with the processes that start and exit.
    """
    if isinstance(raw, bytes):
        raw = np.frombuffer(raw, dtype=RAW_EVENT_DTYPE)
    n = len(raw)
    kinds = np.ascontiguousarray(raw["kind"])  # read by most columns: once out of the records
    extra = raw["extra"]
    is_syscall = _IS_SYSCALL[kinds]
    is_limit = kinds == _LIMIT_CHANGE
    is_oom = kinds == _OOM_KILL
    exit_known, exit_signal, signaled = _exits(extra, kinds == _PROCESS_EXIT)
    ts = raw["ts_ns"].astype(np.int64)
    family, peer_addr, peer_port = _peer_columns(raw, kinds)
    pids = raw["pid"]
    unique_pids, pid_rows = _distinct(pids)
    placements = _placements(raw, resolver, unique_pids, pid_rows)
    fds = raw["fd"]
    columns = {
        "ts_ns": pa.array(ts, type=pa.int64()),
        "time": pa.array(ts + offsets.realtime_offset_ns, type=_TIME),
        PARTITION_COLUMN: host_column(host, n),
        "pid": pa.array(pids.astype(np.int32)),
        "tid": pa.array(raw["tid"].astype(np.int32)),
        "start_ns": _start_times(raw, offsets, resolver, unique_pids, pid_rows),
        "comm": _comm_column(raw["comm"]),
        "kind": _dictionary(kinds, _KIND_VALUES),
        "syscall": _dictionary(raw["syscall"], _SYSCALL_VALUES),
        "ret": _masked(raw["ret"], _HAS_RET[kinds], pa.int64()),
        "errno": _dictionary(np.minimum(raw["errno"], 4095), _ERRNO_VALUES),
        "fd": _masked(fds, (fds >= 0) & is_syscall, pa.int32()),
        "family": family,
        "peer_addr": peer_addr,
        "peer_port": peer_port,
        "ppid": _slot_column(extra, kinds, Kind.PROCESS_START, "ppid"),
        "creator_tid": _slot_column(extra, kinds, Kind.THREAD_START, "creator_tid"),
        "old_tid": _slot_column(extra, kinds, Kind.PROCESS_EXEC, "old_tid"),
        "exit_code": _masked(_slot(extra, Kind.PROCESS_EXIT, "exit_code"), exit_known & ~signaled, pa.int32()),
        "signal": _dictionary(np.minimum(exit_signal, 64), _SIGNAL_VALUES, mask=~signaled),
        **{name: _slot_column(extra, kinds, Kind.OOM_KILL, name, is_oom) for name in _OOM_SLOTS},
        "oom_score_adj": _masked(raw["ret"].astype(np.int16), is_oom, pa.int16()),
        "stack_id": _stack_ids(raw, kinds),
        **_limit_columns(extra, is_limit),
        **placements,
    }
    return pa.Table.from_arrays([columns[name] for name in _EVENT_NAMES], schema=_EVENT_SCHEMA)


def _exits(extra: np.ndarray, is_exit: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """process_exit: the rows whose exit is known, the signal slot, and the rows killed by a signal."""
    if not is_exit.any():
        return is_exit, np.zeros(len(is_exit), dtype=np.uint64), is_exit
    exit_known = is_exit & (extra[:, slot(Kind.PROCESS_EXIT, "exit_known")] == 1)
    exit_signal = extra[:, slot(Kind.PROCESS_EXIT, "signal")]
    return exit_known, exit_signal, exit_known & (exit_signal != 0)


_LIMIT_CHANGE, _OOM_KILL, _PROCESS_EXIT = int(Kind.LIMIT_CHANGE), int(Kind.OOM_KILL), int(Kind.PROCESS_EXIT)
_TIME = pa.timestamp("ns", tz="UTC")
_EVENT_SCHEMA = arrow_schema()
_EVENT_NAMES = _EVENT_SCHEMA.names
_KIND_VALUES = pa.array(_KIND_DICT, type=pa.string())
_SYSCALL_VALUES = pa.array(list(SYSCALL_NAMES), type=pa.string())
_ERRNO_VALUES = pa.array(_ERRNO_DICT, type=pa.string())
_SIGNAL_VALUES = pa.array(_SIGNAL_NAMES, type=pa.string())
_OOM_SLOTS = ("total_vm_kb", "anon_rss_kb", "file_rss_kb", "shmem_rss_kb")


def _slot_column(extra: np.ndarray, kinds: np.ndarray, kind: Kind, name: str,
                 rows: np.ndarray | None = None) -> pa.Array:
    """One kind's named extra slot as a column, null in the other kinds' rows (int32, or int64
    for the OOM figures)."""
    valid = kinds == int(kind) if rows is None else rows
    arrow_type = pa.int64() if kind == Kind.OOM_KILL else pa.int32()
    if not valid.any():
        return pa.nulls(len(kinds), arrow_type)
    return _masked(_slot(extra, kind, name, np.int64 if kind == Kind.OOM_KILL else np.int32), valid, arrow_type)


_RESOURCE_NAMES = pa.array([LIMIT_RESOURCES.get(i, f"RLIMIT_{i}") for i in range(16)], type=pa.string())
_UNLIMITED = np.uint64(2**64 - 1)


def _limit_columns(extra: np.ndarray, is_limit: np.ndarray) -> dict[str, pa.Array]:
    """limit_change: whose limit, which one, and the soft and hard values asked for (null where
    unlimited)."""
    if not is_limit.any():
        n = len(is_limit)
        return {"limit_target": pa.nulls(n, pa.int32()),
                "limit_resource": _dictionary(np.zeros(n, dtype=np.int32), _RESOURCE_NAMES, mask=~is_limit),
                "limit_soft": pa.nulls(n, pa.int64()), "limit_hard": pa.nulls(n, pa.int64())}
    columns: dict[str, pa.Array] = {
        "limit_target": _masked(_slot(extra, Kind.LIMIT_CHANGE, "target"), is_limit, pa.int32()),
        "limit_resource": _dictionary(np.minimum(_slot(extra, Kind.LIMIT_CHANGE, "resource"), 15), _RESOURCE_NAMES,
                                      mask=~is_limit),
    }
    for name in ("soft", "hard"):
        values = extra[:, slot(Kind.LIMIT_CHANGE, name)]
        columns[f"limit_{name}"] = _masked(np.minimum(values, np.uint64(2**63 - 1)).astype(np.int64),
                                           is_limit & (values != _UNLIMITED), pa.int64())
    return columns


def split_connections(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the records that are events, the TCP_ESTABLISHED records, which go to their own table)."""
    is_connection = raw["kind"] == Kind.TCP_ESTABLISHED
    if not is_connection.any():
        return raw, raw[:0]
    # Selected as rows of bytes: numpy selects records field by field, several times slower.
    rows = np.ascontiguousarray(raw).view(np.uint8).reshape(len(raw), raw.dtype.itemsize)
    return rows[~is_connection].view(raw.dtype).reshape(-1), rows[is_connection].view(raw.dtype).reshape(-1)


def decode_connections(raw: np.ndarray, offsets: ClockOffsets) -> pa.Table:
    """TCP_ESTABLISHED records as rows of the ``connections`` table."""
    packed = raw["ret"].astype(np.int64).view(np.uint64)
    role = (packed >> np.uint64(48)) & np.uint64(0xFFFF)
    family = ((packed >> np.uint64(32)) & np.uint64(0xFFFF)).astype(np.int32)
    local_port = ((packed >> np.uint64(16)) & np.uint64(0xFFFF)).astype(np.int32)
    remote_port = (packed & np.uint64(0xFFFF)).astype(np.int32)
    addresses = np.ascontiguousarray(raw["extra"]).view(np.uint8).reshape(len(raw), 32)

    def text(start: int) -> pa.Array:
        codes, values = _inet_texts(addresses, family, ipv4_at=start, ipv6_at=start)
        return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(values, pa.string())).cast(pa.string())

    ts = raw["ts_ns"].astype(np.int64)
    schema = arrow_schema("connections")
    columns = {
        "ts_ns": pa.array(ts, pa.int64()),
        "role": pa.array(np.where(role == 1, "client", "server")),
        "family": pa.array(np.where(family == socket.AF_INET, "AF_INET", "AF_INET6")),
        "local_addr": text(0), "local_port": pa.array(local_port),
        "remote_addr": text(16), "remote_port": pa.array(remote_port),
        "time": pa.array(ts + offsets.realtime_offset_ns, type=pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
    }
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)
