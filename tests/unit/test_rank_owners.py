"""top's detail of a training rank: its descriptors by owner, from its calls decoded as the live
source decodes them (the rule is fdtrace.schema.owners', which the ledger applies too)."""

from __future__ import annotations

import socket
import struct

import numpy as np

from fdtrace.schema import SYSCALL_IDS, Kind
from fdtrace.schema.records import PhaseNow, ProcessSample
from fdtrace.tui.adapters import process_detail
from fdtrace.tui.state import IncidentState
from tests.unit.test_decode import decode_table, record, sockaddr

RANK0 = 42


def _call(kind: Kind, fd: int, comm: bytes = b"python", port: int | None = None, errno: int = 0,
          family: int = socket.AF_INET) -> np.ndarray:
    name = {Kind.SOCKET: "socket", Kind.ACCEPT: "accept4", Kind.CONNECT: "connect", Kind.CLOSE: "close"}[kind]
    extra = sockaddr(struct.pack("<H", family) + struct.pack(">H", port) + socket.inet_aton("127.0.0.1")) \
        if port is not None else [0, 0, 0, 0]
    rec = record(kind, pid=RANK0, syscall=SYSCALL_IDS[name], fd=fd, ret=-errno if errno else fd, errno=errno,
                 extra=extra)
    rec["comm"] = comm
    return rec


def test_a_ranks_detail_counts_its_descriptors_by_owner() -> None:
    state = IncidentState()
    state.apply_phases({RANK0: PhaseNow(RANK0, 0, 0, 3, 0, "init_process_group", "127.0.0.1:29500", 0)})
    calls = [_call(Kind.SOCKET, 10),  # the store's listener
             _call(Kind.SOCKET, 11), _call(Kind.CONNECT, 11, port=29500, errno=115),  # its own client
             *(_call(Kind.ACCEPT, fd, comm=b"pt_tcpstore_uv") for fd in (12, 13, 14)),  # every rank's
             _call(Kind.SOCKET, 15),  # Gloo's listener
             _call(Kind.SOCKET, 16), _call(Kind.CONNECT, 16, port=40001, errno=115),  # a pair it connects
             _call(Kind.ACCEPT, 17, comm=b"gloo_tcp_loop"),  # a pair it accepts
             _call(Kind.SOCKET, 18), _call(Kind.CONNECT, 18, port=53, errno=101),  # a lookup's retry
             _call(Kind.CLOSE, 18), _call(Kind.SOCKET, 19), _call(Kind.CLOSE, 19)]
    state.apply_events(decode_table(*calls))
    state.apply_samples([ProcessSample(pid=RANK0, start_ns=1, comm="python", open_fds=29, fd_soft_limit=1024,
                                       fd_hard_limit=4096, threads=7, sockets=8)], 1_000_000_000)
    view = state.processes[RANK0]
    assert view.store_port == 29500
    assert view.descriptors_by_owner() == {"store_server": 3, "store_client": 1, "pairs": 2, "listeners": 2,
                                           "other_sockets": 0, "files_pipes": 21}
    shown = process_detail(view).plain
    assert ("descriptors by owner: rendezvous store (server side) 3  rendezvous store (client) 1  collective pairs 2"
            "  listeners 2  files and pipes 21") in shown
