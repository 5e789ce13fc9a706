"""What a rehearsal is pointed at: the address, whether it is on this host (or in one of its
network namespaces), and the process to trace (the one listening there, or the one named)."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from dataclasses import dataclass, field

from fdtrace.display import shown
from fdtrace.errors import FdtraceError
from fdtrace.procfs import ProcessAccessDeniedError, ProcessGoneError, ProcFS
from fdtrace.procfs.reader import MAX_NET_TABLE_BYTES

#: /proc/net/tcp's state of a listening socket.
TCP_LISTEN = "0A"
#: Seconds a target that is not on this host has to accept the probe connection.
PROBE_TIMEOUT_S = 5.0


def _error(text: str) -> FdtraceError:
    return FdtraceError(text, exit_code=1)


@dataclass(frozen=True)
class Target:
    """A resolved target.

    Attributes:
        text: HOST:PORT as given.
        host: the host part as given.
        address: the address it resolved to.
        port: the TCP port.
        family: ``socket.AF_INET`` or ``AF_INET6``.
        namespace: the network namespace holding the address (``net:[...]``), None when the
            address is not on this host.
        listeners: the processes holding a socket that listens there (local targets).
    """

    text: str
    host: str
    address: str
    port: int
    family: int
    namespace: str | None
    listeners: tuple[int, ...] = field(default_factory=tuple)

    @property
    def local(self) -> bool:
        """Whether the address is on this host or in one of its network namespaces."""
        return self.namespace is not None

    @property
    def sockaddr(self) -> tuple[str, int] | tuple[str, int, int, int]:
        """The address as ``socket.connect`` takes it."""
        return (self.address, self.port) if self.family == socket.AF_INET else (self.address, self.port, 0, 0)


def split_target(text: str) -> tuple[str, int]:
    """HOST and PORT of ``HOST:PORT`` or ``[IPV6]:PORT``. Raises FdtraceError."""
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _error(f"--target {shown(text)}: give HOST:PORT (a port from 1 to 65535; [ADDRESS]:PORT for IPv6)")
    return host, int(port_text)


def resolve(text: str) -> tuple[str, str, int, int]:
    """(host, address, port, family) of HOST:PORT, from the system's resolver (the first TCP
    address it gives). Raises FdtraceError when the name does not resolve."""
    host, port = split_target(text)
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise _error(f"--target {shown(text)}: {shown(host)} does not resolve ({reason})") from None
    usable = [entry for entry in found if entry[0] in (socket.AF_INET, socket.AF_INET6)]
    if not usable:
        raise _error(f"--target {shown(text)}: {shown(host)} has no IPv4 or IPv6 address")
    family, _, _, _, sockaddr = usable[0]
    return host, str(sockaddr[0]), port, int(family)


def _namespace(procfs: ProcFS, pid: int) -> str | None:
    try:
        return os.readlink(procfs.root / str(pid) / "ns" / "net")
    except OSError:
        return None


def _binds_here(address: str, family: int) -> bool:
    """Whether the address is one of this network namespace's own (it can be bound to)."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def local_addresses(fib_trie: str) -> set[str]:
    """The IPv4 addresses that /proc/net/fib_trie says are this namespace's own (``/32 host
    LOCAL``)."""
    found, last = set(), ""
    for line in fib_trie.splitlines():
        text = line.strip()
        if text.startswith("|-- "):
            last = text[4:]
        elif text.startswith("/32 host LOCAL") and last:
            found.add(last)
    return found


def _tcp6_address(hex_text: str) -> str:
    """An address of /proc/net/tcp6: 32 hex digits, four 32-bit words each in host order."""
    raw = bytes.fromhex(hex_text)
    return str(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))


def _tcp_address(hex_text: str) -> str:
    """An address of /proc/net/tcp: 8 hex digits in host order."""
    return str(ipaddress.IPv4Address(bytes.fromhex(hex_text)[::-1]))


def _has_address(procfs: ProcFS, pid: int, address: str, family: int) -> bool:
    """Whether the network namespace of ``pid`` has ``address`` as its own."""
    try:
        if family == socket.AF_INET:
            return address in local_addresses(procfs.read(pid, "net/fib_trie", MAX_NET_TABLE_BYTES))
        wanted = ipaddress.IPv6Address(address)
        return any(ipaddress.IPv6Address(bytes.fromhex(line.split()[0])) == wanted
                   for line in procfs.read(pid, "net/if_inet6", MAX_NET_TABLE_BYTES).splitlines() if line.split())
    except (ProcessGoneError, ProcessAccessDeniedError, ValueError):
        return False


#: rtnetlink: the request and its answer (linux/rtnetlink.h, linux/netlink.h).
_RTM_NEWROUTE, _RTM_GETROUTE, _NLMSG_ERROR, _NLM_F_REQUEST = 24, 26, 2, 1
_RTA_DST, _RTA_OIF, _RTA_GATEWAY, _RTA_VIA = 1, 4, 5, 18
_RTN_LOCAL = 2
#: ioctl(2): an interface's flags, and the one a loopback device has (linux/if.h, linux/sockios.h).
_SIOCGIFFLAGS, _IFF_LOOPBACK = 0x8913, 0x8
#: Where ``ip netns add`` names the namespaces root made (a folder only root may write).
NAMED_NAMESPACES = "/run/netns"


@dataclass(frozen=True)
class Route:
    """How this network namespace reaches an address (the kernel's answer to ``ip route get``).

    Attributes:
        local: the kernel delivers it to this namespace itself (a route of type local).
        device: the interface it goes out through ("" when the kernel names none).
        loopback: that interface is a loopback device.
        gateway: it goes through a gateway (another machine forwards it).
    """

    local: bool
    device: str
    loopback: bool
    gateway: bool

    @property
    def here(self) -> bool:
        """Whether nothing sent there leaves this namespace: a local route on its loopback."""
        return self.local and self.loopback


def route_to(address: str, family: int) -> Route | None:
    """The route this network namespace's kernel takes to ``address`` (rtnetlink's RTM_GETROUTE,
    as ``ip route get`` asks); None when it has none (unreachable) or cannot say."""
    import struct

    packed = socket.inet_pton(family, address)
    attribute = struct.pack("=HH", 4 + len(packed), _RTA_DST) + packed
    body = struct.pack("=BBBBBBBBI", family, len(packed) * 8, 0, 0, 0, 0, 0, 0, 0) + attribute
    request = struct.pack("=IHHII", 16 + len(body), _RTM_GETROUTE, _NLM_F_REQUEST, 1, 0) + body
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as link:
            link.settimeout(2.0)
            link.send(request)
            answer = link.recv(65536)
    except OSError:
        return None
    if len(answer) < 16:
        return None
    length, kind = struct.unpack_from("=IH", answer)
    if kind != _RTM_NEWROUTE or length > len(answer) or length < 28:
        return None  # NLMSG_ERROR: no route (ENETUNREACH) or refused
    route_type = answer[16 + 7]
    oif, gateway, at = 0, False, 28
    while at + 4 <= length:
        size, attr = struct.unpack_from("=HH", answer, at)
        if size < 4:
            break
        if attr == _RTA_OIF and size >= 8:
            oif = struct.unpack_from("=I", answer, at + 4)[0]
        elif attr in (_RTA_GATEWAY, _RTA_VIA):
            gateway = True
        at += (size + 3) & ~3
    device = _interface_name(oif)
    return Route(route_type == _RTN_LOCAL, device, _is_loopback(device), gateway)


def _interface_name(index: int) -> str:
    try:
        return socket.if_indextoname(index) if index else ""
    except OSError:
        return ""


def _is_loopback(device: str) -> bool:
    """Whether an interface of this namespace is a loopback device (its IFF_LOOPBACK flag)."""
    import fcntl
    import struct

    if not device:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            answer = fcntl.ioctl(probe, _SIOCGIFFLAGS, struct.pack("16sH14x", device.encode()[:15], 0))
        except OSError:
            return False
    return bool(struct.unpack_from("16sH", answer)[1] & _IFF_LOOPBACK)


def named_namespaces() -> set[str]:
    """The network namespaces root named (``ip netns add``: /run/netns, a folder only root may
    write), as ``net:[INODE]``."""
    found: set[str] = set()
    try:
        folder = os.stat(NAMED_NAMESPACES)
        if folder.st_uid != 0 or folder.st_mode & 0o022:
            return found  # not root's alone: nothing there is believed
        names = os.listdir(NAMED_NAMESPACES)
    except OSError:
        return found
    for name in names:
        try:
            found.add(f"net:[{os.stat(os.path.join(NAMED_NAMESPACES, name)).st_ino}]")
        except OSError:
            continue
    return found


def namespace_of(procfs: ProcFS, address: str, family: int) -> tuple[str, int] | None:
    """(the network namespace, a process in it) holding ``address``: this process's own when
    the address can be bound here, else the first other namespace of this host (seen through
    its processes) that has it; None when no namespace of this host has it."""
    own = os.getpid()
    own_namespace = _namespace(procfs, own) or "net:[self]"
    if _binds_here(address, family):
        return own_namespace, own
    seen = {own_namespace}
    for pid in procfs.pids():
        namespace = _namespace(procfs, pid)
        if namespace is None or namespace in seen:
            continue
        seen.add(namespace)
        if _has_address(procfs, pid, address, family):
            return namespace, pid
    return None


def listening_inodes(tcp: str, tcp6: str, address: str, port: int) -> set[str]:
    """The inodes of the sockets that listen on ``address:port`` (or on any address), from the
    text of /proc/net/tcp and /proc/net/tcp6."""
    wanted = ipaddress.ip_address(address)
    inodes = set()
    for text, v6 in ((tcp, False), (tcp6, True)):
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            local, _, port_hex = fields[1].partition(":")
            try:
                if int(port_hex, 16) != port:
                    continue
                bound = ipaddress.ip_address(_tcp6_address(local) if v6 else _tcp_address(local))
            except ValueError:
                continue
            mapped = getattr(bound, "ipv4_mapped", None)
            # A wildcard listens on every address of its family, and IPv6's on IPv4's too (unless
            # the socket is IPV6_V6ONLY, which /proc does not say: it is counted).
            wildcard = bound.is_unspecified and (bound.version == wanted.version or bound.version == 6)
            if bound == wanted or mapped == wanted or wildcard:
                inodes.add(fields[9])
    return inodes


def listeners(procfs: ProcFS, namespace: str, member: int, address: str, port: int) -> tuple[int, ...]:
    """The processes of ``namespace`` (``member`` is one of them) holding a socket that
    listens on ``address:port``."""
    try:
        tcp = procfs.read(member, "net/tcp")
        tcp6 = procfs.read(member, "net/tcp6")
    except (ProcessGoneError, ProcessAccessDeniedError):
        return ()
    inodes = {f"socket:[{inode}]" for inode in listening_inodes(tcp, tcp6, address, port)}
    if not inodes:
        return ()
    holders = []
    for pid in procfs.pids():
        if _namespace(procfs, pid) != namespace:
            continue
        try:
            if any(link in inodes for link in procfs.fd_targets(pid)):
                holders.append(pid)
        except (ProcessGoneError, ProcessAccessDeniedError):
            continue
    return tuple(sorted(holders))


def local_namespace(procfs: ProcFS, address: str, family: int) -> tuple[str, int] | str:
    """(the network namespace, a process in it) of a target on this host, or why it is not: an
    address is on this host only when this namespace's kernel routes it to its own loopback, or
    when a namespace root named (``ip netns add``) holds it and the route there goes through no
    gateway. An address that another namespace holds (any user can make one, and give it any
    address) while the route to it leaves the machine is elsewhere."""
    route = route_to(address, family)
    if route is None:
        return "no route to it here"
    if route.here:
        own = os.getpid()
        return _namespace(procfs, own) or "net:[self]", own
    found = namespace_of(procfs, address, family)
    how = f"its route goes out through {route.device or 'no device'}" + (" via a gateway" if route.gateway else "")
    if found is None:
        return how
    if found[0] in named_namespaces() and not route.gateway and not route.local:
        return found
    return f"{how}, not this namespace's loopback; the network namespace {found[0]} holds it"


def find_target(text: str, allow_remote: bool = False, procfs: ProcFS | None = None) -> Target:
    """Resolve ``HOST:PORT`` and find who listens there. A target on this host (see
    ``local_namespace``) must have a listener; one elsewhere needs ``allow_remote`` and must
    accept a probe connection. Raises FdtraceError (one line, exit status 1)."""
    procfs = procfs or ProcFS()
    host, address, port, family = resolve(text)
    found = local_namespace(procfs, address, family)
    if isinstance(found, str):
        if not allow_remote:
            raise _error(f"--target {shown(text)}: {address} is not on this host ({found}); give --allow-remote to "
                         "rehearse a balancer elsewhere on purpose")
        probe(address, port, family, text)
        return Target(text, host, address, port, family, None)
    namespace, member = found
    held_by = listeners(procfs, namespace, member, address, port)
    if not held_by:
        where = "" if member == os.getpid() else f" (network namespace {namespace})"
        raise _error(f"--target {shown(text)}: nothing listens on {address} port {port}{where}")
    return Target(text, host, address, port, family, namespace, held_by)


def probe(address: str, port: int, family: int, text: str) -> None:
    """One connection to a target elsewhere, closed at once. Raises FdtraceError when it is
    not accepted."""
    sockaddr = (address, port) if family == socket.AF_INET else (address, port, 0, 0)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(PROBE_TIMEOUT_S)
        try:
            sock.connect(sockaddr)
        except TimeoutError:
            raise _error(f"--target {shown(text)}: no answer within {PROBE_TIMEOUT_S:.0f} s") from None
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            if exc.errno == errno.ECONNREFUSED:
                reason = "connection refused: nothing listens there"
            raise _error(f"--target {shown(text)}: {reason}") from None


def accepting(procfs: ProcFS, holders: tuple[int, ...]) -> tuple[int, ...]:
    """Of the processes holding a listening socket, those that accept on it: where a parent and
    its children all hold it (nginx's master and workers, a pre-forking server), the children
    (the parent keeps the socket only to hand it to new workers); else all of them."""
    children = []
    for pid in holders:
        try:
            parent = int(procfs.status(pid, ("PPid",)).get("PPid", "0") or 0)
        except (ProcessGoneError, ProcessAccessDeniedError, ValueError):
            continue
        if parent in holders:
            children.append(pid)
    return tuple(children) or holders


def choose_pids(target: Target, pids: tuple[int, ...], comm: str | None,
                procfs: ProcFS | None = None) -> tuple[int, ...]:
    """The process to trace: the one ``--pid`` names, the one of name ``comm`` (the listener
    among several of that name), or the listener of a local target (where a master and its
    workers hold it, the workers: the first stands for all, their descriptors summed); none for
    a target elsewhere that names none. Raises FdtraceError."""
    procfs = procfs or ProcFS()
    if pids:
        for pid in pids:
            try:
                procfs.stat(pid)
            except (ProcessGoneError, ProcessAccessDeniedError):
                raise _error(f"--pid {pid}: no such process") from None
        return tuple(sorted(set(pids)))
    if comm is not None:
        named = []
        for pid in procfs.pids():
            try:
                if procfs.stat(pid).comm == comm:
                    named.append(pid)
            except (ProcessGoneError, ProcessAccessDeniedError):
                continue
        if not named:
            raise _error(f"--comm {shown(comm)}: no process of that name")
        listening = [pid for pid in named if pid in target.listeners]
        workers = accepting(procfs, tuple(listening))
        if listening and workers != tuple(listening):  # a master and its workers: the workers
            return workers
        chosen = listening or named
        if len(chosen) > 1:
            raise _error(f"--comm {shown(comm)}: {len(chosen)} processes of that name "
                         f"({', '.join(map(str, chosen[:8]))}){' listen there' if listening else ''}: "
                         "choose one with --pid")
        return tuple(chosen)
    if len(target.listeners) > 1:
        workers = accepting(procfs, target.listeners)
        if workers != target.listeners:  # the workers of one master: all of them (summed)
            return workers
        raise _error(f"--target {shown(target.text)}: {len(target.listeners)} processes hold the listening socket "
                     f"({', '.join(map(str, target.listeners[:8]))}): choose one with --pid")
    return target.listeners
