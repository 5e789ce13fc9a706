"""HAProxy: the limits in the configuration a process was started with, and its runtime
`show info` through the stats socket."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from fdtrace.schema.tables import HAPROXY_INFO_FIELDS


@dataclass
class HaproxyConfig:
    """The global settings that decide how many FDs HAProxy needs and may use."""

    path: Path
    maxconn: int | None = None
    ulimit_n: int | None = None
    strict_limits: bool | None = None  # None: not set (HAProxy 2.6 default: strict)
    stats_sockets: list[str] = field(default_factory=list)
    listeners: int = 0  # bind lines: each holds one FD


def config_paths(cmdline: list[str]) -> list[Path]:
    """The -f files (or directories) of an haproxy command line."""
    paths = []
    for i, arg in enumerate(cmdline):
        if arg == "-f" and i + 1 < len(cmdline):
            paths.append(Path(cmdline[i + 1]))
        elif arg.startswith("-f") and len(arg) > 2:
            paths.append(Path(arg[2:]))
    return paths


def parse_config(path: Path) -> HaproxyConfig:
    """Read the global section's limits, the stats sockets and the number of bind lines."""
    config = HaproxyConfig(path=path)
    files = sorted(path.glob("*.cfg")) if path.is_dir() else [path]
    for file in files:
        section = ""
        for raw in file.read_text(errors="replace").splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            words = line.split()
            if not raw[:1].isspace() and words[0] in ("global", "defaults", "frontend", "backend", "listen",
                                                      "resolvers", "peers", "userlist", "program", "cache"):
                section = words[0]
                continue
            if words[0] == "bind":
                config.listeners += 1
            if section != "global":
                continue
            if words[0] == "maxconn" and len(words) > 1:
                config.maxconn = int(words[1])
            elif words[0] == "ulimit-n" and len(words) > 1:
                config.ulimit_n = int(words[1])
            elif words[0] == "strict-limits":
                config.strict_limits = True
            elif words[:2] == ["no", "strict-limits"]:
                config.strict_limits = False
            elif words[:2] == ["stats", "socket"] and len(words) > 2:
                config.stats_sockets.append(words[2])
    return config


def show_info(socket_path: str, timeout: float = 1.0) -> dict[str, str]:
    """`show info` from a stats socket, as {field: value}. Raises OSError when it does not answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(b"show info\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    info = {}
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        name, sep, value = line.partition(":")
        if sep:
            info[name.strip()] = value.strip()
    return info


class HaproxySampler:
    """Samples `show info` of stats sockets; a socket that does not answer gives a row with the
    error and no figures (it is reported, never fatal)."""

    def __init__(self, sockets: list[str]) -> None:
        self.sockets = list(sockets)

    def sample(self) -> list[dict[str, int | str | None]]:
        """One row per socket."""
        rows: list[dict[str, int | str | None]] = []
        for path in self.sockets:
            row: dict[str, int | str | None] = {"socket": path, "error": None}
            try:
                info = show_info(path)
            except OSError as exc:
                row["error"] = exc.strerror or str(exc)
                info = {}
            for name, column in HAPROXY_INFO_FIELDS:
                value = info.get(name)
                row[column] = int(value) if value is not None and value.isdigit() else None
            rows.append(row)
        return rows


def fds_needed(maxconn: int, listeners: int) -> int:
    """FDs HAProxy needs at maxconn: about two per proxied connection (client and server side),
    plus its listeners and a few of its own."""
    return 2 * maxconn + listeners + 16
