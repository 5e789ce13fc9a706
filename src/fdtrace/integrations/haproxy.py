"""HAProxy: the limits in the configuration a process was started with, and its runtime
`show info` through the stats socket."""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fdtrace.safe_files import read_regular
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
    problems: list[str] = field(default_factory=list)  # values that could not be read


def config_paths(cmdline: list[str]) -> list[Path]:
    """The -f files (or directories) of an haproxy command line."""
    paths = []
    for i, arg in enumerate(cmdline):
        if arg == "-f" and i + 1 < len(cmdline):
            paths.append(Path(cmdline[i + 1]))
        elif arg.startswith("-f") and len(arg) > 2:
            paths.append(Path(arg[2:]))
    return paths


#: A configuration file (or one of a directory's) is read up to this size, a directory up to this
#: many files: the files are named by a process's command line, which anyone can write.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_FILES = 64
#: A stats socket's answer is read up to this size, within the timeout as a whole.
MAX_ANSWER_BYTES = 64 << 10


def read_bounded(path: Path, limit: int = MAX_CONFIG_BYTES) -> str:
    """A configuration file's text: a regular file only (the -f of a process's command line can
    name a FIFO or /dev/zero), up to ``limit`` bytes. Raises OSError otherwise. Links are
    followed here: configurations are often linked into place."""
    return read_regular(path.resolve(), limit).decode(errors="replace")


def _number(words: list[str], config: HaproxyConfig, file: Path) -> int | None:
    if len(words) < 2:
        return None
    try:
        return int(words[1])
    except ValueError:
        config.problems.append(f"{file}: {words[0]} {words[1][:40]!r} is not a number")
        return None


def parse_config(path: Path) -> HaproxyConfig:
    """Read the global section's limits, the stats sockets and the number of bind lines. A value
    that is not a number is a problem noted in ``problems``, not an error. Raises OSError when
    the file cannot be read (see ``read_bounded``)."""
    config = HaproxyConfig(path=path)
    files = sorted(path.glob("*.cfg"))[:MAX_CONFIG_FILES] if path.is_dir() else [path]
    for file in files:
        section = ""
        for raw in read_bounded(file).splitlines():
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
            if words[0] == "maxconn":
                config.maxconn = _number(words, config, file)
            elif words[0] == "ulimit-n":
                config.ulimit_n = _number(words, config, file)
            elif words[0] == "strict-limits":
                config.strict_limits = True
            elif words[:2] == ["no", "strict-limits"]:
                config.strict_limits = False
            elif words[:2] == ["stats", "socket"] and len(words) > 2:
                config.stats_sockets.append(words[2])
    return config


def show_info(socket_path: str, timeout: float = 1.0, limit: int = MAX_ANSWER_BYTES) -> dict[str, str]:
    """`show info` from a stats socket, as {field: value}: only a Unix socket (not through a
    link), answered within ``timeout`` in all and in at most ``limit`` bytes. Raises OSError
    when it does not answer so."""
    if not stat.S_ISSOCK(os.lstat(socket_path).st_mode):
        raise OSError(errno.ENOTSOCK, "not a socket")
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(b"show info\n")
        chunks: list[bytes] = []
        size = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError(errno.ETIMEDOUT, "answered too slowly")
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"answered more than {limit} bytes")
    info = {}
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        name, sep, value = line.partition(":")
        if sep:
            info[name.strip()] = value.strip()
    return info


def info_number(info: dict[str, str], name: str) -> int | None:
    """A numeric field of `show info`, None when it is missing or not a number."""
    value = info.get(name, "")
    return int(value) if value.isdigit() else None


class HaproxySampler:
    """Samples `show info` of stats sockets on its own thread, every ``interval_s``, so a slow or
    hostile socket never delays the pipeline; ``sample()`` hands out the rows taken since the
    previous call. A socket that does not answer gives a row with the error and no figures (it
    is reported, never fatal)."""

    def __init__(self, sockets: list[str], interval_s: float = 1.0, timeout: float = 1.0) -> None:
        self.sockets = list(sockets)
        self.interval_s = interval_s
        self.timeout = min(timeout, interval_s)
        self._rows: list[dict[str, int | str | None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin sampling (the first round at once)."""
        self._thread = threading.Thread(target=self._run, name="fdtrace-haproxy", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop sampling; a socket still being read is abandoned (the thread is a daemon)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            rows = self.sample_now()
            with self._lock:
                self._rows.extend(rows)
                del self._rows[: max(0, len(self._rows) - 100 * len(self.sockets))]  # bounded if nobody reads
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def sample(self) -> list[dict[str, int | str | None]]:
        """The rows taken since the previous call."""
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    def sample_now(self) -> list[dict[str, int | str | None]]:
        """One row per socket, read now."""
        rows: list[dict[str, int | str | None]] = []
        for path in self.sockets:
            row: dict[str, int | str | None] = {"socket": path, "error": None}
            try:
                info = show_info(path, timeout=self.timeout)
            except OSError as exc:
                row["error"] = exc.strerror or str(exc)
                info = {}
            for name, column in HAPROXY_INFO_FIELDS:
                row[column] = info_number(info, name)
            rows.append(row)
        return rows


def fds_needed(maxconn: int, listeners: int) -> int:
    """FDs HAProxy needs at maxconn: about two per proxied connection (client and server side),
    plus its listeners and a few of its own."""
    return 2 * maxconn + listeners + 16
