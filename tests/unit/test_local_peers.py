"""The owner of the other end of a loopback connection, from /proc/net/tcp and tcp6, and asked of
the kernel one socket at a time (sock_diag)."""

from __future__ import annotations

import os
import socket

import pytest

from fdtrace.procfs import ProcFS
from fdtrace.procfs.sockets import PeerLookup, is_loopback, local_peer_uids


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
                with PeerLookup() as lookup:
                    assert lookup.uid(*ends) == os.getuid()
                    assert lookup.uid(("127.0.0.1", 1), ("127.0.0.1", 2)) is None
                assert client.fileno() >= 0


def test_loopback_addresses() -> None:
    assert [is_loopback(a) for a in ("127.0.0.1", "127.9.8.7", "::1", "::ffff:127.0.0.1", "10.0.0.1", "x")] == [
        True, True, True, True, False, False]


def test_a_peer_that_hung_up_has_no_owner() -> None:
    """A closed client's socket lingers in TIME_WAIT, which the kernel shows as root's: nobody's."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = socket.create_connection(listener.getsockname())
        served, _ = listener.accept()
        ends = (served.getsockname()[:2], served.getpeername()[:2])
        client.close()  # the client closes first: its end goes through FIN_WAIT to TIME_WAIT
        served.recv(1)
        served.close()
        with PeerLookup() as lookup:
            assert lookup.uid(*ends) is None
        assert local_peer_uids(ProcFS(), [ends]) == [None]
