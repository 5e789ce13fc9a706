"""A flood's backlog is decoded a bounded part per poll: no poll holds its caller (the live view's
pipeline, the check for new failures between polls) for the whole backlog, and every event is
still handed out once, in the order the ring gave them."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import python_child

pytestmark = pytest.mark.bpf

SOCKETS = 20_000
FLOOD_ON_CUE = f"""
import socket, sys
sys.stdin.readline()
for _ in range({SOCKETS}):
    socket.socket().close()
"""


def test_a_backlog_is_decoded_a_bounded_part_per_poll_and_every_event_once() -> None:
    if os.geteuid() != 0:
        pytest.skip("attaching BPF programs needs root")
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.kernel.session import DECODE_AT, KernelSession

    child = subprocess.Popen(python_child(FLOOD_ON_CUE), stdin=subprocess.PIPE, text=True)
    session = KernelSession(TraceOptions(pids=(child.pid,)))
    try:
        session.start()
        assert session.poll().events.num_rows == 0
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.close()
        assert child.wait(timeout=120) == 0
        # 20,000 sockets and their closes wait in the ring: more than one poll decodes.
        sizes, behind, tables = [], [], []
        while True:
            batch = session.poll()
            sizes.append(batch.events.num_rows)
            behind.append(session.behind)
            tables.append(batch.events)
            if not session.behind and batch.events.num_rows == 0:
                break
        assert sizes[0] == DECODE_AT and behind[0]
        assert max(sizes) == DECODE_AT and not behind[-1]
        import pyarrow as pa

        events = pa.concat_tables(tables).to_pydict()
        kinds = events["kind"]
        assert kinds.count("socket") == SOCKETS
        assert kinds.count("close") >= SOCKETS
        assert sum(sizes) == len(kinds) and set(events["pid"]) == {child.pid}
        stamps = list(zip(events["ts_ns"], events["tid"], events["kind"], strict=True))
        assert len(set(stamps)) == len(stamps)  # none handed out twice
        assert not any(batch.losses.get(name) for name in ("ringbuf_full",))
    finally:
        child.kill()
        child.wait()
        session.stop()

