"""nginx: the limits of the configuration a master was started with (``-c``, else Debian's
/etc/nginx/nginx.conf), read as that process could read it (``procfs.process_files.ProcessFiles``: anyone can
start a process named nginx and name any file), and which of its processes accept (the workers:
the master holds the listening sockets too but accepts nothing). No value read is shown as it is
written."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fdtrace.advice.haproxy import ModelError
from fdtrace.advice.nginx import DEFAULT_WORKER_CONNECTIONS, NginxShape
from fdtrace.procfs.process_files import NotReadableError, ProcessFiles
from fdtrace.procfs.reader import READ_ERRORS, ProcFS

#: The configuration nginx reads without -c (Debian's build).
DEFAULT_CONFIG = "/etc/nginx/nginx.conf"
_TOKEN = re.compile(r"[{};]|[^\s{};]+")


@dataclass
class NginxConfig:
    """What decides the connections and descriptors of nginx's workers."""

    path: str
    worker_connections: int | None = None
    worker_processes: int | None = None  # None: "auto" or not set
    worker_rlimit_nofile: int | None = None
    listeners: int = 0
    problems: list[str] = field(default_factory=list)

    def shape(self) -> NginxShape | None:
        """The model's shape; None (the problem noted) when a value is refused."""
        try:
            return NginxShape(self.path, self.worker_connections or DEFAULT_WORKER_CONNECTIONS,
                              self.worker_processes, self.worker_rlimit_nofile, max(self.listeners, 1))
        except ModelError as error:
            self.problems.append(f"{self.path}: {error}")
            return None


def parse_nginx(path: str, text: str) -> NginxConfig:
    """The main context's worker_processes and worker_rlimit_nofile, the events block's
    worker_connections and the listen directives of a configuration's text (includes are not
    followed). A value that is not a number is a problem, named without its value."""
    config = NginxConfig(path)
    blocks: list[str] = []  # the block names around the directive being read
    words: list[str] = []
    body = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    for token in _TOKEN.findall(body):
        if token == "{":
            blocks.append(words[0] if words else "")
            words = []
        elif token == "}":
            if blocks:
                blocks.pop()
            words = []
        elif token == ";":
            _directive(config, blocks, words)
            words = []
        else:
            words.append(token)
    return config


def _directive(config: NginxConfig, blocks: list[str], words: list[str]) -> None:
    if not words:
        return
    name, value = words[0], words[1] if len(words) > 1 else ""
    if name == "listen":
        config.listeners += 1
        return
    wanted = {("worker_connections", ("events",)), ("worker_processes", ()), ("worker_rlimit_nofile", ())}
    if (name, tuple(blocks)) not in wanted:
        return
    if name == "worker_processes" and value == "auto":
        return
    if not value.isdigit():
        config.problems.append(f"{config.path}: {name} is not a number")
        return
    setattr(config, name, int(value))


def config_path(cmdline: list[str]) -> str:
    """The -c of an nginx master's command line, else DEFAULT_CONFIG (nginx rewrites its own as
    "nginx: master process /usr/sbin/nginx -c FILE": its words are read)."""
    words = " ".join(cmdline).split()
    for index, arg in enumerate(words):
        if arg == "-c" and index + 1 < len(words):
            return words[index + 1]
        if arg.startswith("-c") and len(arg) > 2:
            return arg[2:]
    return DEFAULT_CONFIG


def master_of(procfs: ProcFS, pid: int) -> int:
    """The nginx master of ``pid``: its parent when that is nginx too, else ``pid`` itself."""
    try:
        parent = int(procfs.status(pid, ("PPid",)).get("PPid", "0") or 0)
        if parent > 1 and procfs.stat(parent).comm == "nginx":
            return parent
    except (*READ_ERRORS, ValueError):
        pass
    return pid


def read_nginx_config(procfs: ProcFS, pid: int) -> NginxConfig | str:
    """The configuration of the nginx ``pid`` belongs to (its master's -c), read as the master
    could read it; why not, in words, when it cannot be."""
    master = master_of(procfs, pid)
    try:
        cmdline = procfs.cmdline(master)
    except READ_ERRORS:
        return "its master's command line cannot be read"
    path = config_path(cmdline)
    try:
        text = ProcessFiles(procfs, master).read(path).decode(errors="replace")
    except NotReadableError as reason:
        return f"{path}: not read: {reason}"
    return parse_nginx(path, text)
