"""The owner of the other end of a loopback connection, from /proc/net/tcp and tcp6."""

from __future__ import annotations

import os
import socket

import pytest

from fdtrace.procfs import ProcFS
from fdtrace.procfs.sockets import is_loopback, local_peer_uids


@pytest.mark.parametrize("family, address", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_the_peer_of_a_loopback_connection_is_its_owners(family: socket.AddressFamily, address: str) -> None:
    with socket.socket(family) as listener:
        listener.bind((address, 0))
        listener.listen(1)
        with socket.create_connection(listener.getsockname()[:2]) as client:
            served, _ = listener.accept()
            with served:
                ends = (served.getsockname()[:2], served.getpeername()[:2])
                assert local_peer_uids(ProcFS(), [ends, (("127.0.0.1", 1), ("127.0.0.1", 2))]) == [os.getuid(), None]
                assert client.fileno() >= 0


def test_loopback_addresses() -> None:
    assert [is_loopback(a) for a in ("127.0.0.1", "127.9.8.7", "::1", "::ffff:127.0.0.1", "10.0.0.1", "x")] == [
        True, True, True, True, False, False]
