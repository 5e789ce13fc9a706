"""Who owns the other end of a local TCP connection: the user id /proc/net/tcp (or tcp6) gives the
socket whose local address is the connection's peer. On loopback every peer has one address, so
its user tells one local user's connections from another's."""

from __future__ import annotations

import ipaddress
import sys

from fdtrace.procfs.reader import READ_ERRORS, ProcFS


def _hex_address(address: str, port: int) -> tuple[str, str]:
    """(table, ADDRESS:PORT) as /proc/net/tcp{,6} prints a socket's address: each 32-bit word of
    the address in the machine's byte order, the port in hex."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a v4 client of a v6 listener: its own socket is a v4 one
    packed = ip.packed
    words = "".join(f"{int.from_bytes(packed[i:i + 4], sys.byteorder):08X}" for i in range(0, len(packed), 4))
    return ("net/tcp" if ip.version == 4 else "net/tcp6"), f"{words}:{port:04X}"


def is_loopback(address: str) -> bool:
    """Whether an address is this host's loopback (127.0.0.0/8, ::1, or v4-mapped 127/8)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def local_peer_uids(procfs: ProcFS, connections: list[tuple[tuple[str, int], tuple[str, int]]]) -> list[int | None]:
    """The user id owning the peer's socket of each local connection ((our address, port), (peer
    address, port)); None where it is not found (not local, or closed meanwhile). One read of
    each table for all of them."""
    wanted: dict[tuple[str, str, str], int] = {}
    for index, (ours, peer) in enumerate(connections):
        table, peer_hex = _hex_address(*peer)
        _table, ours_hex = _hex_address(*ours)
        wanted[table, peer_hex, ours_hex] = index
    found: list[int | None] = [None] * len(connections)
    for table in sorted({key[0] for key in wanted}):
        for line in (procfs.system_text(table) or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 8:
                continue
            at = wanted.get((table, fields[1], fields[2]))
            if at is not None and fields[7].isdigit():
                found[at] = int(fields[7])
    return found



#: Lines of /proc/net/unix read at most to find one socket (a busy host has hundreds of thousands).
MAX_UNIX_LINES = 200_000


def unix_listener_inodes(procfs: ProcFS, path: str) -> set[int]:
    """The inodes of the listening Unix sockets bound at ``path`` (/proc/net/unix, read a line at a
    time up to ``MAX_UNIX_LINES``); none when it cannot be read."""
    found: set[int] = set()
    try:
        with open(procfs.root / "net" / "unix", encoding="utf-8", errors="replace") as table:
            for number, line in enumerate(table):
                if number > MAX_UNIX_LINES:
                    break
                fields = line.split(maxsplit=7)
                # Num RefCount Protocol Flags Type St Inode Path; Flags 00010000: listening
                if len(fields) == 8 and fields[7].rstrip("\n") == path and fields[3] == "00010000" \
                        and fields[6].isdigit():
                    found.add(int(fields[6]))
    except OSError:
        return set()
    return found


def socket_holders(procfs: ProcFS, inodes: set[int], pids: list[int]) -> list[int]:
    """Which of ``pids`` hold a descriptor of one of these socket inodes (gone or unreadable
    processes left out)."""
    links = {f"socket:[{inode}]" for inode in inodes}
    holders = []
    for pid in pids:
        try:
            if links.intersection(procfs.fd_targets(pid)):
                holders.append(pid)
        except READ_ERRORS:
            continue
    return holders
