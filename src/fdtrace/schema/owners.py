"""What a distributed job's rank holds a descriptor for (its owner): the one rule that the ledger
(``fdtrace.analysis.rank_ledger``), ``fdtrace scale``, the report and ``top``'s detail of a rank apply.
Standard library only: the live view imports it without pandas."""

from __future__ import annotations

#: Owners in the order tables show them, with the words a reader sees.
OWNERS: dict[str, str] = {
    "store_server": "rendezvous store (server side)",
    "store_client": "rendezvous store (client)",
    "pairs": "collective pairs",
    "listeners": "listeners",
    "other_sockets": "other sockets",
    "files_pipes": "files and pipes",
}
SOCKET_OWNERS = tuple(o for o in OWNERS if o != "files_pipes")
#: The phases whose connections are the collectives' (each makes a process group).
GROUP_PHASES = ("init_process_group", "new_group")
#: Thread names of PyTorch's TCPStore server (libuv and the older backend).
STORE_THREADS = ("pt_tcpstore",)
#: Thread names of the collectives' own threads (Gloo's loop, NCCL's bootstrap and proxy).
COLLECTIVE_THREADS = ("gloo", "nccl", "NCCL")
#: The connect() answers after which the socket is connected, or is being connected.
CONNECTED_ERRNOS = ("", "EINPROGRESS", "EALREADY", "EISCONN")


def owner_of(side: str, family: str | None, peer_port: int | None, threads: tuple[str, ...], phase: str | None,
             store_port: int | None, store_server: bool = False) -> str:
    """The owner of one socket of a rank.

    Args:
        side: ``connected``, ``accepted`` or ``unconnected`` (made by socket(), never connected).
        family: the connect's address family (AF_INET, AF_INET6, AF_UNIX).
        peer_port: the port it connected to.
        threads: the names of the threads that made it and connected it.
        phase: the rank's phase when it was made (init_process_group, new_group, ...).
        store_port: the rendezvous store's port (None: unknown).
        store_server: it was accepted by the store's thread (also true of any thread named pt_tcpstore*).
    """
    if side == "unconnected":
        return "listeners"
    if side == "connected" and family == "AF_UNIX":
        return "other_sockets"
    if side == "connected" and store_port is not None and peer_port == store_port:
        return "store_client"
    if side == "accepted" and (store_server or any(t.startswith(STORE_THREADS) for t in threads)):
        return "store_server"
    if phase in GROUP_PHASES or any(t.startswith(COLLECTIVE_THREADS) for t in threads):
        return "pairs"
    return "other_sockets"
