"""HAProxy: the limits in the configuration a process was started with, and its runtime
`show info` through the stats socket.

Anyone can start a process named haproxy and name any file with -f, so a configuration is read
as that process could read it (``read_process_configs``, the one rule for every caller): each
path is walked from the process's own root or working directory, each folder searched and the
file opened only where its user and groups may, and only a file its own user or root owns. No
value read from one is shown as it is written (a key that is not a number is named, its value
never)."""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fdtrace.advice.haproxy import CLI_MAXCONN, MAX_COUNT, HaproxyShape, ModelError
from fdtrace.policy import FIRST_USER_UID
from fdtrace.procfs.process_files import NotReadableError, ProcessFiles
from fdtrace.procfs.reader import READ_ERRORS, ProcFS
from fdtrace.procfs.room import refusal
from fdtrace.procfs.sockets import socket_holders, unix_listener_inodes
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
    listeners: int = 0  # the bind lines' addresses (``bind_listeners``): each holds one FD
    nbthread: int | None = None
    stats_maxconn: int | None = None  # global ``stats maxconn``: the stats CLI's connections
    checks: int = 0  # servers with health checks: each holds a descriptor HAProxy counts
    splice: bool = False  # a proxy splices (option splice-*): HAProxy sizes pipes for it
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
#: Of one process's command line (read up to ``ProcFS.cmdline``'s bound): -f paths followed at
#: most (one path given twice counts once), and bytes of configuration read in all its files (a
#: `-f .` given 400 times over 64 files of 1 MB read 25 GB before).
MAX_CONFIG_PATHS = 16
MAX_PROCESS_CONFIG_BYTES = 8 << 20
#: A stats socket's answer is read up to this size, within the timeout as a whole.
MAX_ANSWER_BYTES = 64 << 10


def read_bounded(path: Path, limit: int = MAX_CONFIG_BYTES) -> str:
    """A configuration file's text: a regular file only (the -f of a process's command line can
    name a FIFO or /dev/zero), up to ``limit`` bytes. Raises OSError otherwise. Links are
    followed here: configurations are often linked into place."""
    return read_regular(path.resolve(), limit).decode(errors="replace")


#: The largest number of descriptors a process can have (fs.nr_open's ceiling on 64-bit Linux).
NR_OPEN_MAX = 2_147_483_584
#: What each setting may be, as [low, high]: a value outside is no setting HAProxy runs with (it
#: refuses it, or it overflows its int), and advice made from it would be absurd ("sysctl -w
#: fs.nr_open=2399...", "set maxconn -150130569"). Each connection takes two descriptors, so a
#: maxconn above half the largest table cannot be served; HAProxy builds 4,096 threads at most.
SANE_RANGES = {"maxconn": (1, NR_OPEN_MAX // 4), "ulimit-n": (1, NR_OPEN_MAX), "nbthread": (1, 4096),
               # show info's fields
               "Maxconn": (1, NR_OPEN_MAX // 4), "Ulimit-n": (1, NR_OPEN_MAX), "Maxsock": (1, NR_OPEN_MAX)}


#: More listening sockets than bind lines can name in any configuration (each holds a descriptor).
MAX_LISTENERS = 1 << 20


def _number(words: list[str], config: HaproxyConfig, file: Path) -> int | None:
    """A global setting's number, range-checked before anything is computed from it: one that is
    no number, or outside ``SANE_RANGES``, is a problem named (its value is not shown: the file
    may hold what its reader should not see) and not used."""
    if len(words) < 2:
        return None
    try:
        value = int(words[1])
    except ValueError:
        config.problems.append(f"{file}: {words[0]} is not a number")
        return None
    low, high = SANE_RANGES.get(words[0], (0, NR_OPEN_MAX))
    if not low <= value <= high:
        config.problems.append(f"{file}: {words[0]} is outside {low:,} to {high:,}, no value HAProxy runs with: "
                               "not used")
        return None
    return value


def parse_config(path: Path) -> HaproxyConfig:
    """Read the global section's limits, the stats sockets and the number of bind lines of a
    configuration fdtrace may read as itself (a path of its own, not one a process named: for
    those, ``read_process_configs``). A value that is not a number is a problem noted in
    ``problems``, not an error. Raises OSError when the file cannot be read (``read_bounded``)."""
    files = sorted(path.glob("*.cfg"))[:MAX_CONFIG_FILES] if path.is_dir() else [path]
    return parse_config_texts(path, [(file, read_bounded(file)) for file in files])


def parse_config_texts(path: Path, texts: list[tuple[Path, str]]) -> HaproxyConfig:
    """``parse_config`` of texts already read: (file, text) of the configuration ``path`` (a
    file, or a directory's files)."""
    config = HaproxyConfig(path=path)
    for file, text in texts:
        section = ""
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            words = line.split()
            if not raw[:1].isspace() and words[0] in ("global", "defaults", "frontend", "backend", "listen",
                                                      "resolvers", "peers", "userlist", "program", "cache"):
                section = words[0]
                continue
            if words[0] == "bind" and len(words) > 1:
                config.listeners += bind_listeners(words[1])
            elif words[0] == "server" and "check" in words[3:]:
                config.checks += 1
            elif words[0] == "option" and len(words) > 1 and words[1].startswith("splice-"):
                config.splice = True
            if section != "global":
                continue
            if words[0] == "maxconn":
                config.maxconn = _number(words, config, file)
            elif words[0] == "ulimit-n":
                config.ulimit_n = _number(words, config, file)
            elif words[0] == "nbthread":
                config.nbthread = _number(words, config, file)
            elif words[:2] == ["stats", "maxconn"]:
                config.stats_maxconn = _number(words[1:], config, file)
            elif words[0] == "strict-limits":
                config.strict_limits = True
            elif words[:2] == ["no", "strict-limits"]:
                config.strict_limits = False
            elif words[:2] == ["stats", "socket"] and len(words) > 2:
                config.stats_sockets.append(words[2])
    if config.listeners > MAX_LISTENERS:
        config.problems.append(f"{path}: its bind lines name more than {MAX_LISTENERS:,} listening sockets, no "
                               "configuration HAProxy runs with: not counted")
        config.listeners = 0
    return config


def bind_listeners(addresses: str) -> int:
    """The listening sockets of a bind line's addresses: one per comma-separated address, one per
    port of a range ("127.0.0.1:80,:443" is 2, ":8000-8009" is 10)."""
    count = 0
    for address in addresses.split(","):
        low, sep, high = address.rpartition(":")[2].partition("-")
        if sep and low.isdigit() and high.isdigit() and int(high) >= int(low):
            count += min(int(high) - int(low) + 1, 65536)
        else:
            count += 1
    return count


@dataclass(frozen=True)
class ConfigRead:
    """One -f of a process's command line, as read on its behalf.

    Attributes:
        path: as the command line gives it.
        config: what it says; None when it was not read.
        not_read: why it was not read (None when it was).
    """

    path: Path
    config: HaproxyConfig | None
    not_read: str | None = None


def read_process_configs(procfs: ProcFS, pid: int, cmdline: list[str] | None = None) -> list[ConfigRead]:
    """Each configuration an haproxy process was started with (its -f), read only as that
    process could read it (``ProcessFiles``): the one rule for every reader of another
    process's configuration (doctor; top, record and export later). ``cmdline``: the process's,
    when already read."""
    if cmdline is None:
        try:
            cmdline = procfs.cmdline(pid)
        except READ_ERRORS:
            return []
    paths = list(dict.fromkeys(config_paths(cmdline)))  # Path("./a") == Path("a"): given once
    found = []
    budget = MAX_PROCESS_CONFIG_BYTES
    for path in paths[:MAX_CONFIG_PATHS]:
        if budget <= 0:
            found.append(ConfigRead(path, None, f"the {MAX_PROCESS_CONFIG_BYTES >> 20} MiB of configuration read "
                                                "for one process were read"))
            continue
        try:
            files = ProcessFiles(procfs, pid, limit=min(MAX_CONFIG_BYTES, budget))
            texts = []
            for name in files.files_of(str(path), ".cfg", MAX_CONFIG_FILES):
                data = files.read(name)
                budget -= len(data)
                texts.append((Path(name), data.decode(errors="replace")))
                files.limit = min(files.limit, budget)
                if budget <= 0:
                    break
        except NotReadableError as reason:
            found.append(ConfigRead(path, None, str(reason)))
            continue
        found.append(ConfigRead(path, parse_config_texts(path, texts)))
    if len(paths) > MAX_CONFIG_PATHS:
        found.append(ConfigRead(paths[MAX_CONFIG_PATHS], None,
                                f"{len(paths) - MAX_CONFIG_PATHS} more -f paths on the command line not followed "
                                f"(at most {MAX_CONFIG_PATHS})"))
    return found


class HeldBackError(Exception):
    """A stats socket not connected to: its haproxy has too little room (the message says why)."""


def show_info(socket_path: str, timeout: float = 1.0, limit: int = MAX_ANSWER_BYTES,
              room: Callable[[], str | None] | None = None) -> dict[str, str]:
    """`show info` from a stats socket, as {field: value}: only a Unix socket (not through a
    link), answered within ``timeout`` in all and in at most ``limit`` bytes. Raises OSError
    when it does not answer so. ``room`` is asked last before connecting (our socket already
    made): a reason it gives raises HeldBackError and nothing is connected."""
    if not stat.S_ISSOCK(os.lstat(socket_path).st_mode):
        raise OSError(errno.ENOTSOCK, "not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        held = room() if room is not None else None
        if held is not None:
            raise HeldBackError(held)
        deadline = time.monotonic() + timeout
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
    """A numeric field of `show info`, None when it is missing, not a number, or outside what
    HAProxy can say (``SANE_RANGES``; a socket anyone can answer on)."""
    value = info.get(name, "")
    if not value.isdigit() or len(value) > 20:
        return None
    low, high = SANE_RANGES.get(name, (0, 1 << 62))
    return int(value) if low <= int(value) <= high else None


#: The longest wait between two tries of a stats socket that does not answer.
MAX_BACKOFF_S = 60.0
NOT_ASKED = "not asked"
OWN_TRIES = ("; fdtrace tries again in {delay:.0f} s (each try of its own can fail one accept4 of haproxy's with "
             "EMFILE while haproxy is at its FD limit)")


class HaproxySampler:
    """Samples `show info` of stats sockets on its own thread, every ``interval_s``, so a slow or
    hostile socket never delays the pipeline; ``sample()`` hands out the rows taken since the
    previous call. A socket that does not answer gives a row with the error and no figures (it
    is reported, never fatal).

    fdtrace's own connection must not add to haproxy's failures: the haproxy behind a socket
    (the one whose configuration named it, the pid its last answer gave, or the haproxy processes
    that hold it) has its descriptors counted just before each connection (``procfs.room``), and
    one without room to spare is not connected to (its row says why); a socket that does not
    answer is tried again after 2, 4, 8 ... intervals, at most ``MAX_BACKOFF_S`` (its row's error
    says when)."""

    def __init__(self, sockets: list[str], interval_s: float = 1.0, timeout: float = 1.0,
                 clock: Any = time.monotonic, procfs: ProcFS | None = None) -> None:
        self.sockets = list(sockets)
        self.found: dict[str, int] = {}  # sockets found in configurations (not asked for): path -> haproxy pid
        self.interval_s = interval_s
        self.timeout = min(timeout, interval_s)
        self._clock = clock
        self._procfs = procfs or ProcFS()
        self._pids: dict[str, list[int]] = {}  # path -> the haproxy pids behind it (its answer's, or the holders)
        self._failures: dict[str, tuple[int, float]] = {}  # path -> (failures in a row, next try)
        self._rows: list[dict[str, int | str | None]] = []
        self._owners: dict[str, int] = {}  # found socket -> the uid of the haproxy that named it
        self._refused_paths: dict[str, None] = {}
        #: Found sockets left out for want of a slot, by the uid of their haproxy.
        self.refused: Counter[int] = Counter()
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

    def add(self, path: str, pid: int, uid: int | None = None) -> bool:
        """Sample a stats socket found in the configuration of haproxy ``pid`` (run by ``uid``)
        from now on (one that answers no more drops out: a found socket is not watched forever).

        The MAX_SOCKETS slots go by priority: the sockets asked for first, then those of root's
        and the system services' haproxys (uid below FIRST_USER_UID), which take the slot of
        another user's found socket when none is free, then the other users', FOUND_PER_USER
        each at most. Returns whether it is sampled; a socket left out is counted in ``refused``
        (by uid, once per socket)."""
        with self._lock:
            if path in self.sockets:
                return True
            owner = uid if uid is not None else FIRST_USER_UID  # unknown: not the system's
            if owner >= FIRST_USER_UID and sum(self._owners.get(p) == owner for p in self.found) >= FOUND_PER_USER:
                return self._refuse(path, owner)
            if len(self.sockets) >= MAX_SOCKETS:
                if owner >= FIRST_USER_UID:
                    return self._refuse(path, owner)
                users = Counter(self._owners[p] for p in self.found if self._owners.get(p, 0) >= FIRST_USER_UID)
                if not users:
                    return self._refuse(path, owner)
                most = users.most_common(1)[0][0]
                evicted = next(p for p in reversed(self.found) if self._owners.get(p) == most)
                self.sockets.remove(evicted)
                del self.found[evicted]
                self._owners.pop(evicted, None)
                self._refuse(evicted, most)
            self.sockets.append(path)
            self.found[path] = pid
            self._owners[path] = owner
            return True

    def _refuse(self, path: str, uid: int) -> bool:
        if path not in self._refused_paths:
            if len(self._refused_paths) >= 4096:
                self._refused_paths.pop(next(iter(self._refused_paths)))
            self._refused_paths[path] = None
            self.refused[uid] += 1
        return False

    def shortfalls(self) -> list[str]:
        """The stats sockets left unsampled for want of a slot, in words (one line), or nothing."""
        with self._lock:
            if not self.refused:
                return []
            total = sum(self.refused.values())
            users = ", ".join(f"uid {uid} {n}" for uid, n in sorted(self.refused.items(),
                                                                      key=lambda item: (-item[1], item[0]))[:5])
        return [f"{total} HAProxy stats socket{'s' if total != 1 else ''} of configurations not sampled: no slot "
                f"left for its user ({users}; {MAX_SOCKETS} slots, {FOUND_PER_USER} at most per user, root's and "
                "system services' first)"]

    def _behind(self, path: str) -> list[int]:
        """The haproxy processes whose descriptors a connection to ``path`` costs: the one whose
        configuration named it, else the pid of its last answer while that process lives, else
        the processes named haproxy that hold the listening socket bound there."""
        with self._lock:
            found = self.found.get(path)
        if found is not None:
            return [found]
        known = [pid for pid in self._pids.get(path, []) if os.path.exists(f"{self._procfs.root}/{pid}")]
        if known:
            return known
        inodes = unix_listener_inodes(self._procfs, path)
        haproxys = []
        for pid in self._procfs.pids() if inodes else []:
            try:
                if self._procfs.stat(pid).comm.startswith("haproxy"):
                    haproxys.append(pid)
            except READ_ERRORS:
                continue
        self._pids[path] = socket_holders(self._procfs, inodes, haproxys)
        return self._pids[path]

    def _room(self, pids: list[int], short: list[int] | None = None) -> str | None:
        """Why a connection must not be made now (one of ``pids`` is short of descriptors, appended
        to ``short``), or None."""
        for pid in pids:
            why = refusal(self._procfs, pid, f"haproxy [{pid}]")
            if why is not None:
                if short is not None:
                    short.append(pid)
                return f"{NOT_ASKED} while {why}"
        return None

    def _comm(self, pid: int) -> str:
        """The name of process ``pid`` (haproxy's, as the kernel has it), "haproxy" when unread."""
        try:
            return self._procfs.stat(pid).comm or "haproxy"
        except READ_ERRORS:
            return "haproxy"

    def _due(self, path: str, now: float) -> bool:
        return now >= self._failures.get(path, (0, 0.0))[1]

    def _failed(self, path: str, now: float) -> str:
        """Count a failure of ``path``; the words saying when it is tried again."""
        failures = self._failures.get(path, (0, 0.0))[0] + 1
        delay = min(self.interval_s * 2 ** failures, MAX_BACKOFF_S)
        self._failures[path] = (failures, now + delay)
        return OWN_TRIES.format(delay=delay)

    def sample_now(self) -> list[dict[str, int | str | None]]:
        """One row per socket due now: read, or why it was not asked (its haproxy at its FD limit);
        none for a socket waiting out its backoff. Each row names the haproxy behind its socket
        (``haproxy_pid`` and ``comm``) whether it answered or not: show info's Pid, else the one
        short of descriptors, else the first process behind it (none when no haproxy holds it)."""
        rows: list[dict[str, int | str | None]] = []
        with self._lock:
            sockets = list(self.sockets)
        for path in sockets:
            now = self._clock()
            row: dict[str, int | str | None] = {"socket": path, "error": None,
                                                "source": "found" if path in self.found else "asked"}
            if not self._due(path, now):
                continue
            info: dict[str, str] = {}
            held = False
            pids = self._behind(path)
            short: list[int] = []

            def room(pids: list[int] = pids, short: list[int] = short) -> str | None:
                return self._room(pids, short)

            try:
                info = show_info(path, timeout=self.timeout, room=room)
                self._failures.pop(path, None)
            except HeldBackError as reason:
                row["error"], held = str(reason), True
            except OSError as exc:
                row["error"] = (exc.strerror or str(exc)) + self._failed(path, now)
            for name, column in HAPROXY_INFO_FIELDS:
                row[column] = info_number(info, name)
            if row["haproxy_pid"] is not None:
                self._pids[path] = [int(row["haproxy_pid"])]
            elif short or pids:  # no answer: the haproxy it was asked of (a log line names it, never pid 0)
                row["haproxy_pid"] = (short or pids)[0]
            if row["haproxy_pid"] is not None:
                row["comm"] = self._comm(int(row["haproxy_pid"]))
            rows.append(row)
            if not held and row["error"] is not None and path in self.found:
                with self._lock:  # a socket of a configuration that no longer answers: forgotten
                    if path in self.found:
                        self.sockets.remove(path)
                        del self.found[path]
                        self._owners.pop(path, None)
        return rows


def shape_of(config: HaproxyConfig, nbthread: int) -> HaproxyShape:
    """The HAProxy model's shape of a configuration (``fdtrace.advice.haproxy``) with ``nbthread``
    threads. Raises ModelError for a value the model refuses (zero, negative or absurd)."""
    return HaproxyShape(nbthread=nbthread, binds=config.listeners, stats_sockets=len(config.stats_sockets),
                        cli_maxconn=config.stats_maxconn or CLI_MAXCONN, checks=config.checks, splice=config.splice)


def threads_of(config: HaproxyConfig, procfs: ProcFS, pid: int) -> int:
    """The threads HAProxy runs: ``nbthread``, else one per CPU it may run on (its default:
    the process's ``Cpus_allowed_list``)."""
    if config.nbthread:
        return config.nbthread
    try:
        allowed = procfs.status(pid, ("Cpus_allowed_list",)).get("Cpus_allowed_list", "")
    except READ_ERRORS:
        allowed = ""
    count = 0
    for part in allowed.split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            count += int(high or low) - int(low) + 1
    return count or os.cpu_count() or 1


def config_shape(config: HaproxyConfig, procfs: ProcFS, pid: int) -> HaproxyShape | None:
    """``shape_of`` a configuration with the threads that process runs; None when a value is
    refused by the model (the configuration's problem is noted in ``problems``)."""
    try:
        return shape_of(config, threads_of(config, procfs, pid))
    except ModelError as error:
        if str(error) not in config.problems:
            config.problems.append(f"{config.path}: {error}")
        return None


def config_maxconn(config: HaproxyConfig) -> int | None:
    """The configuration's maxconn when the model takes it (1 to its maximum), else None (with
    the problem noted): a maxconn of 0 or an absurd one is not used in any arithmetic."""
    if config.maxconn is None:
        return None
    if not 1 <= config.maxconn <= MAX_COUNT:
        problem = f"{config.path}: maxconn is not a count HAProxy takes (1 to {MAX_COUNT})"
        if problem not in config.problems:
            config.problems.append(problem)
        return None
    return config.maxconn


def config_fds(config: HaproxyConfig, procfs: ProcFS, pid: int) -> int | None:
    """The Maxsock of a configuration (None without a maxconn the model takes): what that haproxy
    demands of its FD limit."""
    maxconn = config_maxconn(config)
    shape = config_shape(config, procfs, pid)
    return None if maxconn is None or shape is None else shape.maxsock(maxconn)


#: Stats sockets sampled at most (those asked for and those found in configurations), and the
#: most that the haproxys of one user other than root and the system services have sampled.
MAX_SOCKETS = 16
FOUND_PER_USER = 4
#: HAProxy processes whose configurations are read at most while the watch runs.
MAX_WATCHED = 256


class HaproxyWatch:
    """Every haproxy process that the samples show: its configuration read once, as that process
    could read it (``read_process_configs``), what it demands of its FD limit (maxconn, nbthread,
    listeners, the Maxsock they make: rows of the ``haproxy`` table with ``source``
    "configuration"), and each stats socket it names that belongs to haproxy's own user, handed
    to ``sampler`` (``show info``'s exact Maxsock and connections, as with --haproxy-socket)."""

    def __init__(self, procfs: ProcFS, sampler: HaproxySampler | None) -> None:
        self.procfs = procfs
        self.sampler = sampler
        self._seen: dict[tuple[int, int], None] = {}
        # stats sockets a configuration named that did not exist yet (a haproxy sampled as it starts)
        self._missing: dict[tuple[int, int], list[str]] = {}

    def look(self, samples: list[Any]) -> list[dict[str, int | str | None]]:
        """The configuration rows of the haproxy processes first seen in ``samples`` (whether one
        has room for a stats connection is read by the sampler just before it connects, never
        from these samples: they are a round old)."""
        rows: list[dict[str, int | str | None]] = []
        for sample in samples:
            for socket_path in self._missing.pop((sample.pid, sample.start_ns), []):
                self._offer(socket_path, sample)  # named before haproxy had made it: looked at again
            if not str(sample.comm).startswith("haproxy") or (sample.pid, sample.start_ns) in self._seen:
                continue
            if len(self._seen) >= MAX_WATCHED:
                self._seen.pop(next(iter(self._seen)))
            self._seen[(sample.pid, sample.start_ns)] = None
            for read in read_process_configs(self.procfs, sample.pid):
                config = read.config
                if config is None:
                    rows.append({"socket": str(read.path), "source": "configuration", "haproxy_pid": sample.pid,
                                 "error": f"not read: {read.not_read}"})
                    continue
                row: dict[str, int | str | None] = {
                    "socket": str(read.path), "source": "configuration", "haproxy_pid": sample.pid, "error": None,
                    "maxconn": config_maxconn(config), "ulimit_n": config.ulimit_n,
                    "nbthread": threads_of(config, self.procfs, sample.pid),
                    "listeners": config.listeners + len(config.stats_sockets),
                    "maxsock": config_fds(config, self.procfs, sample.pid)}
                rows.append(row)
                for socket_path in config.stats_sockets:
                    self._offer(socket_path, sample)
        return rows

    def _offer(self, socket_path: str, sample: Any) -> None:
        """A stats socket of a configuration, sampled when it is a socket of haproxy's own user
        (under its root: a socket anyone else planted at that name is not spoken to)."""
        if self.sampler is None or not socket_path.startswith("/"):
            return
        try:
            info = os.lstat(socket_path)
        except OSError:
            key = (sample.pid, sample.start_ns)
            if key in self._missing or len(self._missing) < MAX_WATCHED:
                missing = self._missing.setdefault(key, [])
                if len(missing) < MAX_SOCKETS:
                    missing.append(socket_path)
            return
        if stat.S_ISSOCK(info.st_mode) and sample.uid is not None and info.st_uid == sample.uid:
            self.sampler.add(socket_path, sample.pid, sample.uid)

    def shortfalls(self) -> list[str]:
        """Stats sockets of configurations left unsampled for want of a slot (see
        ``HaproxySampler.add``), in words."""
        return self.sampler.shortfalls() if self.sampler is not None else []
