"""Phase state files another user plants where `fdtrace top` looks for running jobs: a FIFO must
not hang it, a well-formed file must not show a phase for a process that is not the planter's."""

from __future__ import annotations

import os
import pwd
import struct
import threading
import time
from pathlib import Path

import pytest

from fdtrace.integrations.phases.live import RUN_DIR_PREFIX, STATE_FORMAT, STATE_MAGIC, LivePhases
from fdtrace.procfs import TICK_NS, ProcFS

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as another user: needs root")
NOBODY = pwd.getpwnam("nobody").pw_uid


def state_of(pid: int, step: int) -> bytes:
    start = ProcFS().start_ns(pid)
    assert start is not None
    return struct.pack(STATE_FORMAT, STATE_MAGIC, 2, pid, 0, 0, 1, start // TICK_NS, step, time.time_ns(), 0,
                       b"allreduce", b"")


def test_a_planted_fifo_and_a_fake_state_are_ignored_without_blocking(tmp_path: Path) -> None:
    run = tmp_path / f"{RUN_DIR_PREFIX}planted"
    run.mkdir()
    os.chown(run, NOBODY, -1)
    os.mkfifo(run / "state-1.bin")
    fake = run / "state-2.bin"
    fake.write_bytes(state_of(1, 4242))  # "rank 0 pid 1 step 4242 allreduce", from nobody
    os.chown(fake, NOBODY, -1)
    own = run / f"state-{os.getpid()}.bin"
    own.write_bytes(state_of(os.getpid(), 7))  # root's own process, root's file: shown
    found: dict[int, object] = {}
    reader = threading.Thread(target=lambda: found.update(LivePhases(tmp_path).poll()), daemon=True)
    reader.start()
    reader.join(timeout=2)
    assert not reader.is_alive(), "the reader blocked on the FIFO"
    assert set(found) == {os.getpid()}
