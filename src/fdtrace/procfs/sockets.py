"""Who owns the other end of a local TCP connection: the user id the kernel gives the socket whose
local address is the connection's peer (asked one socket at a time through sock_diag, or read from
/proc/net/tcp and tcp6 where that cannot be asked). On loopback every peer has one address, so
its user tells one local user's connections from another's."""

from __future__ import annotations

import ipaddress
import socket
import struct
import sys

from fdtrace.procfs.reader import MAX_NET_TABLE_BYTES, READ_ERRORS, ProcFS


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
        for line in (procfs.system_text(table, MAX_NET_TABLE_BYTES) or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 8:
                continue
            at = wanted.get((table, fields[1], fields[2]))
            if at is not None and fields[7].isdigit() and len(fields) > 9 and fields[9] != "0":  # 0: closed
                found[at] = int(fields[7])
    return found



_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_INET_DIAG_NOCOOKIE = 0xFFFFFFFF
_TCP_STATES = 0xFFF  # every TCP state
#: Where inet_diag_msg's idiag_uid lies, after the 16-byte netlink header (its idiag_inode follows:
#: 0 for a socket its owner has closed, in FIN_WAIT or TIME_WAIT, whose uid the kernel gives as 0).
_UID_AT = 16 + 4 + 48 + 12


class PeerLookup:
    """The user owning the peer's socket of a local TCP connection, asked of the kernel one socket
    at a time (sock_diag: a lookup by the connection's 4-tuple), so the cost of one lookup does not
    grow with the connections the host holds (a read of /proc/net/tcp parses all of them). Holds
    one netlink descriptor while open; ``uid`` gives None where the kernel does not answer."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
        self._sock.settimeout(1.0)
        self._seq = 0

    def close(self) -> None:
        """Let go of the netlink descriptor."""
        self._sock.close()

    def __enter__(self) -> PeerLookup:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def uid(self, ours: tuple[str, int], peer: tuple[str, int]) -> int | None:
        """The uid owning the socket whose local end is ``peer`` and remote end ``ours``."""
        try:
            source, destination = ipaddress.ip_address(peer[0]), ipaddress.ip_address(ours[0])
        except ValueError:
            return None
        if isinstance(source, ipaddress.IPv6Address) and source.ipv4_mapped is not None:
            source = source.ipv4_mapped  # a v4 client of a v6 listener: its own socket is a v4 one
        if isinstance(destination, ipaddress.IPv6Address) and destination.ipv4_mapped is not None:
            destination = destination.ipv4_mapped
        if source.version != destination.version:
            return None
        family = socket.AF_INET if source.version == 4 else socket.AF_INET6
        self._seq += 1
        request = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, _TCP_STATES) + struct.pack(
            "!HH", peer[1], ours[1]) + source.packed.ljust(16, b"\0") + destination.packed.ljust(16, b"\0") + \
            struct.pack("=III", 0, _INET_DIAG_NOCOOKIE, _INET_DIAG_NOCOOKIE)
        header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, self._seq, 0)
        try:
            self._sock.send(header + request)
            while True:
                answer = self._sock.recv(8192)
                if len(answer) < 16:
                    return None
                _length, kind, _flags, seq, _port = struct.unpack_from("=IHHII", answer)
                if seq != self._seq:
                    continue  # an answer to an earlier question that timed out
                if kind == _NLMSG_ERROR or kind != _SOCK_DIAG_BY_FAMILY or len(answer) < _UID_AT + 8:
                    return None
                uid, inode = struct.unpack_from("=II", answer, _UID_AT)
                if inode == 0:
                    return None  # a peer that already hung up (no file left): the kernel says root for it
                return int(uid)
        except OSError:
            return None


#: Lines of /proc/net/unix read at most to find one socket (a busy host has hundreds of thousands).
MAX_UNIX_LINES = 200_000


def bound_at(name: str, path: str) -> bool:
    """Whether a Unix socket /proc/net/unix names ``name`` is the one at ``path``: that name, or
    the one HAProxy bound before renaming it into place (``PATH.PID.tmp``: the kernel keeps the
    name it was bound with)."""
    if name == path:
        return True
    middle = name[len(path) + 1:-len(".tmp")] if name.startswith(path + ".") and name.endswith(".tmp") else ""
    return middle.isdigit()


def unix_listener_inodes(procfs: ProcFS, path: str) -> set[int]:
    """The inodes of the listening Unix sockets bound at ``path`` (/proc/net/unix, read a line at a
    time up to ``MAX_UNIX_LINES``; HAProxy's bound under a temporary name and renamed too); none
    when it cannot be read."""
    found: set[int] = set()
    try:
        with open(procfs.root / "net" / "unix", encoding="utf-8", errors="replace") as table:
            for number, line in enumerate(table):
                if number > MAX_UNIX_LINES:
                    break
                fields = line.split(maxsplit=7)
                # Num RefCount Protocol Flags Type St Inode Path; Flags 00010000: listening
                if len(fields) == 8 and bound_at(fields[7].rstrip("\n"), path) and fields[3] == "00010000" \
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
