"""Decoding raw event records (built here in the C layout) into the event model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from fdtrace.kernel.decode import decode
from fdtrace.procfs import TICK_NS, ProcFS, StartTimeResolver
from fdtrace.schema import EVENT_COLUMNS, RAW_EVENT_DTYPE, SYSCALL_IDS, Kind, arrow_schema
from fdtrace.schema.records import ClockOffsets

OFFSETS = ClockOffsets(mono_ns=0, realtime_offset_ns=1_700_000_000_000_000_000, boottime_offset_ns=5_000_000_000)


def record(kind: Kind, pid: int = 100, ts: int = 1_000, **fields: object) -> np.ndarray:
    rec = np.zeros(1, dtype=RAW_EVENT_DTYPE)
    rec["ts_ns"], rec["pid"], rec["tid"], rec["kind"], rec["fd"], rec["comm"] = ts, pid, pid, kind, -1, b"worker"
    for name, value in fields.items():
        rec[name] = value
    return rec


def decode_table(*records: np.ndarray, procfs_root: Path | None = None) -> pa.Table:
    raw = np.concatenate(records).tobytes()
    resolver = StartTimeResolver(ProcFS(procfs_root or "/nonexistent"))
    table = decode(raw, "host-a", OFFSETS, resolver)
    assert table.schema.equals(arrow_schema())
    return table


def decode_records(*records: np.ndarray, procfs_root: Path | None = None) -> list[dict]:
    return decode_table(*records, procfs_root=procfs_root).to_pylist()


def test_failed_socket_call_has_errno_name_and_no_fd() -> None:
    [row] = decode_records(record(Kind.SOCKET, syscall=SYSCALL_IDS["socket"], ret=-24, errno=24))
    assert list(row) == list(EVENT_COLUMNS)
    assert (row["kind"], row["syscall"], row["ret"]) == ("socket", "socket", -24)
    assert (row["errno"], row["fd"]) == ("EMFILE", None)
    assert row["host"] == "host-a" and row["comm"] == "worker"
    assert row["time"].value == 1_700_000_000_000_001_000


def test_lifecycle_fields_land_in_their_columns() -> None:
    rows = decode_records(
        record(Kind.PROCESS_START, pid=200, ts=2_000_000_000, extra=[100, 0, 0, 0]),
        record(Kind.THREAD_START, pid=200, tid=201, extra=[200, 0, 0, 0]),
        record(Kind.PROCESS_EXIT, pid=200, extra=[1, 3, 0, 0]),
        record(Kind.PROCESS_EXIT, pid=300, extra=[1, 0, 9, 0]),
        record(Kind.PROCESS_EXIT, pid=301, extra=[0, 0, 0, 0]),
        record(Kind.OOM_KILL, pid=400, ret=-500, extra=[2048, 1024, 512, 8]),
    )
    start, thread, exit_code, killed, unknown, oom = rows
    assert start["ppid"] == 100 and start["ret"] is None and start["syscall"] == ""
    assert start["start_ns"] == (2_000_000_000 + 5_000_000_000) // TICK_NS * TICK_NS
    assert exit_code["start_ns"] == start["start_ns"]
    assert thread["creator_tid"] == 200 and thread["tid"] == 201
    assert (exit_code["exit_code"], exit_code["signal"]) == (3, None)
    assert (killed["exit_code"], killed["signal"]) == (None, "SIGKILL")
    assert (unknown["exit_code"], unknown["signal"]) == (None, None)
    assert (oom["total_vm_kb"], oom["anon_rss_kb"], oom["file_rss_kb"], oom["shmem_rss_kb"]) == (2048, 1024, 512, 8)
    assert oom["oom_score_adj"] == -500 and oom["ret"] is None


def test_start_time_comes_from_proc_for_processes_already_running(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    fields = ["S"] + ["0"] * 18 + ["4242"] + ["0"] * 10
    (tmp_path / "77" / "stat").write_text("77 (a (weird) name) " + " ".join(fields) + "\n")
    [row] = decode_records(record(Kind.CLOSE, pid=77, syscall=SYSCALL_IDS["close"], fd=5), procfs_root=tmp_path)
    assert row["start_ns"] == 4242 * TICK_NS and row["fd"] == 5


def test_vanished_process_has_no_start_time() -> None:
    [row] = decode_records(record(Kind.SOCKET, pid=31337, syscall=SYSCALL_IDS["socket"], ret=3, fd=3))
    assert row["start_ns"] is None


def test_pid_reused_within_one_batch_gets_each_start() -> None:
    rows = decode_records(
        record(Kind.PROCESS_START, pid=500, ts=1_000_000_000),
        record(Kind.PROCESS_EXIT, pid=500, ts=1_100_000_000, extra=[1, 0, 0, 0]),
        record(Kind.PROCESS_START, pid=500, ts=9_000_000_000),
        record(Kind.SOCKET, pid=500, ts=9_100_000_000, syscall=SYSCALL_IDS["socket"], ret=3, fd=3),
    )
    assert rows[0]["start_ns"] == rows[1]["start_ns"] != rows[2]["start_ns"] == rows[3]["start_ns"]


def test_rows_between_a_reused_pids_starts_and_exits_take_the_process_they_belong_to(tmp_path: Path) -> None:
    """A pid running before the batch, exiting, started again, its rows among another pid's: each
    row gets the start of the process that made it (from /proc before the exit, from the start
    event after it)."""
    (tmp_path / "77").mkdir()
    fields = ["S"] + ["0"] * 18 + ["4242"] + ["0"] * 10
    (tmp_path / "77" / "stat").write_text("77 (old) " + " ".join(fields) + "\n")
    close = {"syscall": SYSCALL_IDS["close"], "fd": 5}
    rows = decode_records(
        *[record(Kind.CLOSE, pid=77, ts=1_000 + i, **close) for i in range(3)],
        record(Kind.CLOSE, pid=88, ts=2_000, **close),
        record(Kind.PROCESS_EXIT, pid=77, ts=3_000, extra=[1, 0, 0, 0]),
        record(Kind.CLOSE, pid=88, ts=3_500, **close),
        record(Kind.PROCESS_START, pid=77, ts=9_000_000_000),
        *[record(Kind.CLOSE, pid=77, ts=9_000_001_000 + i, **close) for i in range(3)],
        record(Kind.PROCESS_EXIT, pid=77, ts=9_100_000_000, extra=[1, 0, 0, 0]),
        procfs_root=tmp_path,
    )
    new = (9_000_000_000 + OFFSETS.boottime_offset_ns) // TICK_NS * TICK_NS
    assert [row["start_ns"] for row in rows] == [4242 * TICK_NS] * 3 + [None, 4242 * TICK_NS, None] + [new] * 5


def test_each_row_carries_its_process_placement_read_once_a_second_and_again_after_exec(tmp_path: Path) -> None:
    ident = "ab" * 32
    (tmp_path / "77").mkdir()
    cgroup_file = tmp_path / "77" / "cgroup"
    cgroup_file.write_text(f"0::/system.slice/docker-{ident}.scope\n")
    now = [0]
    resolver = StartTimeResolver(ProcFS(tmp_path), clock=lambda: now[0])
    socket = {"syscall": SYSCALL_IDS["socket"], "ret": 3, "fd": 3}
    first = decode(np.concatenate([
        record(Kind.SOCKET, pid=77, **socket),
        record(Kind.PROCESS_START, pid=78, extra=[77, 0, 0, 0]),  # its child, gone before it is read
        record(Kind.SOCKET, pid=78, **socket),
        record(Kind.SOCKET, pid=79, **socket),  # neither readable nor seen starting
    ]).tobytes(), "h", OFFSETS, resolver).to_pylist()
    assert [(r["pid"], r["container_id"], r["container_runtime"], r["unit"]) for r in first] == [
        (77, ident, "docker", f"docker-{ident}.scope"),
        (78, ident, "docker", f"docker-{ident}.scope"),
        (78, ident, "docker", f"docker-{ident}.scope"),
        (79, None, None, None),
    ]
    assert first[0]["cgroup"] == f"/system.slice/docker-{ident}.scope" and first[0]["pod_uid"] is None
    cgroup_file.write_text("0::/system.slice/cron.service\n")
    now[0] = 999_999_999
    again = decode(record(Kind.SOCKET, pid=77, **socket).tobytes(), "h", OFFSETS, resolver).to_pylist()
    assert again[0]["unit"] == f"docker-{ident}.scope"  # cached: one read of /proc per process a second
    after_exec = decode(np.concatenate([record(Kind.PROCESS_EXEC, pid=77), record(Kind.SOCKET, pid=77, **socket)])
                        .tobytes(), "h", OFFSETS, resolver).to_pylist()
    assert [(r["unit"], r["container_id"]) for r in after_exec] == [("cron.service", None)] * 2
    cgroup_file.write_text("0::/system.slice/moved.service\n")  # a write to cgroup.procs: no event says so
    now[0] += 999_999_999
    assert decode(record(Kind.SOCKET, pid=77, **socket).tobytes(), "h", OFFSETS, resolver).to_pylist()[0]["unit"] \
        == "cron.service"
    now[0] += 1
    assert decode(record(Kind.SOCKET, pid=77, **socket).tobytes(), "h", OFFSETS, resolver).to_pylist()[0]["unit"] \
        == "moved.service"
    resolver.max_rereads_per_s = 0  # re-reads spent for this second: it keeps what it has
    cgroup_file.write_text("0::/system.slice/later.service\n")
    now[0] += 1_000_000_000
    assert decode(record(Kind.SOCKET, pid=77, **socket).tobytes(), "h", OFFSETS, resolver).to_pylist()[0]["unit"] \
        == "moved.service"
    resolver.max_rereads_per_s = 1
    assert decode(record(Kind.SOCKET, pid=77, **socket).tobytes(), "h", OFFSETS, resolver).to_pylist()[0]["unit"] \
        == "later.service"
    cgroup_file.unlink()  # gone: it keeps what was read last
    now[0] += 5_000_000_000
    assert decode(record(Kind.SOCKET, pid=77, **socket).tobytes(), "h", OFFSETS, resolver).to_pylist()[0]["unit"] \
        == "later.service"


def test_a_process_whose_exit_is_in_the_batch_takes_its_parents_placement_unread(tmp_path: Path) -> None:
    """Issue 34: a child that started and exited in the batch is not looked up in /proc (gone,
    or its pid already another process's: here a file under its pid says another unit): it takes
    its parent's placement, read once."""
    for pid, unit in ((77, "parent.service"), (78, "reused.service")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(f"0::/system.slice/{unit}\n")
    resolver = StartTimeResolver(ProcFS(tmp_path))
    socket = {"syscall": SYSCALL_IDS["socket"], "ret": 3, "fd": 3}
    rows = decode(np.concatenate([
        record(Kind.SOCKET, pid=77, **socket),
        record(Kind.PROCESS_START, pid=78, extra=[77, 0, 0, 0]),
        record(Kind.PROCESS_EXIT, pid=78, extra=[1, 0, 0, 0]),
    ]).tobytes(), "h", OFFSETS, resolver).to_pylist()
    assert [(r["pid"], r["unit"]) for r in rows] == [(77, "parent.service"), (78, "parent.service"),
                                                     (78, "parent.service")]


def test_empty_input_gives_an_empty_table() -> None:
    assert decode(b"", "h", OFFSETS, StartTimeResolver()).num_rows == 0


def sockaddr(raw: bytes) -> list[int]:
    """A sockaddr's first 24 bytes as the four extra words of the record."""
    padded = raw[:24].ljust(32, b"\0")
    return list(np.frombuffer(padded, dtype="<u8"))


def test_connect_destinations_decode_from_the_sockaddr() -> None:
    import socket
    import struct

    v4 = struct.pack("<H", socket.AF_INET) + struct.pack(">H", 8080) + socket.inet_aton("10.1.2.3")
    v6 = (struct.pack("<H", socket.AF_INET6) + struct.pack(">H", 443) + b"\0" * 4
          + socket.inet_pton(socket.AF_INET6, "2001:db8::7"))
    unix = struct.pack("<H", socket.AF_UNIX) + b"/run/nscd/socket"
    connect = {"syscall": SYSCALL_IDS["connect"], "fd": 3}
    rows = decode_records(record(Kind.CONNECT, extra=sockaddr(v4), **connect),
                          record(Kind.CONNECT, extra=sockaddr(v6), ret=-111, errno=111, **connect),
                          record(Kind.CONNECT, extra=sockaddr(unix), **connect),
                          record(Kind.CONNECT, **connect),  # the entry could not read it
                          record(Kind.PROCESS_START, extra=sockaddr(v4)))  # not a connect: no peer
    assert [(r["family"], r["peer_addr"], r["peer_port"]) for r in rows] == [
        ("AF_INET", "10.1.2.3", 8080), ("AF_INET6", "2001:db8::7", 443), ("AF_UNIX", None, None),
        (None, None, None), (None, None, None)]


def test_a_comm_is_cut_at_its_first_nul() -> None:
    """oom:mark_victim once gave the bytes after the name's NUL too ("python\\0gnu")."""
    rows = [record(Kind.SOCKET, pid=1, syscall=SYSCALL_IDS["socket"]) for _ in range(2)]
    rows[0]["comm"] = b"python\x00gnu"
    rows[1]["comm"] = b"python"
    table = decode_table(np.concatenate(rows))
    assert table["comm"].cast(pa.string()).to_pylist() == ["python", "python"]
    assert len(table["comm"].combine_chunks().dictionary) == 1


def test_connection_records_go_to_their_own_table() -> None:
    import socket as socket_module

    import numpy as np

    from fdtrace.kernel.decode import decode_connections, split_connections
    from fdtrace.schema import RAW_EVENT_DTYPE, Kind
    from fdtrace.schema.records import ClockOffsets

    raw = np.zeros(3, dtype=RAW_EVENT_DTYPE)
    raw["kind"] = [Kind.TCP_ESTABLISHED, Kind.SOCKET, Kind.TCP_ESTABLISHED]
    raw["ts_ns"] = [10, 20, 30]
    for i, (role, family, local, lport, remote, rport) in enumerate(
            [(1, socket_module.AF_INET, "10.1.2.3", 40000, "10.9.8.7", 80),
             (0, 0, "", 0, "", 0),
             (2, socket_module.AF_INET6, "fd00::1", 443, "fd00::2", 51000)]):
        if not role:
            continue
        raw["ret"][i] = (role << 48) | (family << 32) | (lport << 16) | rport
        packed = bytearray(32)
        for offset, text in ((0, local), (16, remote)):
            address = socket_module.inet_pton(family, text)
            packed[offset:offset + len(address)] = address
        raw["extra"][i] = np.frombuffer(bytes(packed), dtype="<u8")
    events, established = split_connections(raw)
    assert list(events["kind"]) == [Kind.SOCKET]
    rows = decode_connections(established, ClockOffsets(0, 1000, 0)).to_pylist()
    assert [(r["role"], r["family"], r["local_addr"], r["local_port"], r["remote_addr"], r["remote_port"])
            for r in rows] == [("client", "AF_INET", "10.1.2.3", 40000, "10.9.8.7", 80),
                               ("server", "AF_INET6", "fd00::1", 443, "fd00::2", 51000)]
    assert [r["time"].value for r in rows] == [1010, 1030]
