"""Checks made before loading BPF: privileges, tracefs, kernel headers and which tracepoints
this kernel has. Nothing here imports bcc, so the checks can explain what is missing."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from fdtrace.children import CHILD_CWD, child_environment, program
from fdtrace.errors import FdtraceError
from fdtrace.procfs import ProcFS
from fdtrace.schema import FD_ALLOC_SYSCALLS, SOCKET_SYSCALLS

TRACEFS = Path("/sys/kernel/tracing")
#: Tests point this at a copy of tracefs's format files to stand in for an older kernel.
FORMATS_ENV = "FDTRACE_TRACEFS_FORMATS"

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39

#: Tracepoints compiled in as TRACEPOINT_PROBE when present.
LIFECYCLE_TRACEPOINTS: tuple[tuple[str, str], ...] = (
    ("task", "task_newtask"),
    ("sched", "sched_process_exec"),
    ("sched", "sched_process_exit"),
    ("signal", "signal_generate"),
    ("signal", "signal_deliver"),
    ("oom", "mark_victim"),
)

#: The fields of sock:inet_sock_set_state that connections.bpf.c reads.
CONNECTION_FIELDS = frozenset({"oldstate", "newstate", "sport", "dport", "family", "protocol", "saddr", "daddr",
                               "saddr_v6", "daddr_v6"})

_FIELD_RE = re.compile(r"field:(?P<decl>[^;]+);\s*offset:(?P<offset>\d+);\s*size:(?P<size>\d+);")


def effective_capabilities(procfs: ProcFS | None = None) -> int:
    """The CapEff bit mask of this process."""
    return (procfs or ProcFS()).own_capabilities()


def check_privileges() -> None:
    """Raise unless this process may load and attach tracing BPF programs."""
    caps = effective_capabilities()
    if caps & (1 << CAP_SYS_ADMIN):
        return
    if caps & (1 << CAP_BPF) and caps & (1 << CAP_PERFMON):
        return
    raise FdtraceError(
        "tracing needs root, or CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN on kernels before 5.8): "
        "run fdtrace as root",
        exit_code=77,
    )


def ensure_tracefs(root: Path = TRACEFS, mount: bool = True) -> str | None:
    """Make sure tracefs is mounted at ``root``, mounting it when allowed.

    Returns:
        A note for the user when tracefs had to be mounted, else None.
    """
    try:
        if (root / "events").is_dir():
            return None
    except PermissionError:
        raise FdtraceError(f"tracefs at {root} cannot be read by this user: run as root, or with CAP_DAC_READ_SEARCH "
                           "besides CAP_BPF and CAP_PERFMON (fdtrace service prints a unit that grants them)",
                           exit_code=77) from None
    if mount:
        mount_program = program("/usr/bin/mount", "/bin/mount")
        if mount_program is None:
            raise FdtraceError(f"tracefs is not mounted at {root} and there is no mount program: "
                               f"run 'mount -t tracefs tracefs {root}' as root")
        try:
            result = subprocess.run(
                [mount_program, "-t", "tracefs", "tracefs", str(root)],
                capture_output=True, text=True, check=False, env=child_environment(), cwd=CHILD_CWD,
                stdin=subprocess.DEVNULL, timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise FdtraceError(f"tracefs is not mounted at {root} and mounting it failed ({exc}): "
                               f"run 'mount -t tracefs tracefs {root}' as root") from None
        if result.returncode == 0 and (root / "events").is_dir():
            return f"tracefs was not mounted: mounted it at {root}"
        reason = (result.stderr.strip().splitlines() or ["mount failed"])[-1]
    else:
        reason = "not mounted"
    raise FdtraceError(
        f"tracefs is not mounted at {root} ({reason}): "
        f"run 'mount -t tracefs tracefs {root}' as root",
    )


def check_kernel_headers(release: str | None = None) -> None:
    """Raise unless bcc can find headers for the running kernel."""
    release = release or os.uname().release
    build = Path("/lib/modules") / release / "build"
    if (build / "include").is_dir() or Path("/sys/kernel/kheaders.tar.xz").exists():
        return
    raise FdtraceError(
        f"no kernel headers for {release}: install them (Debian: apt-get install linux-headers-amd64) "
        f"and, when none match this kernel, link /lib/modules/{release}/build and .../source to the "
        "installed /usr/src/linux-headers-*-amd64 and -common folders (scripts/setup.sh does both), "
        "or load the kheaders module",
    )


def tracepoint_fields(category: str, event: str, root: Path | None = None) -> dict[str, tuple[int, int]] | None:
    """The fields of a tracepoint as {name: (offset, size)}, or None when the kernel lacks it."""
    base = root or Path(os.environ.get(FORMATS_ENV, TRACEFS / "events"))
    try:
        text = (base / category / event / "format").read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    fields = {}
    for match in _FIELD_RE.finditer(text):
        name = match["decl"].split()[-1].split("[")[0]
        fields[name] = (int(match["offset"]), int(match["size"]))
    return fields


@dataclass
class KernelFeatures:
    """What this kernel offers to fdtrace's programs."""

    syscall_exits: list[str] = field(default_factory=list)
    syscall_enters: list[str] = field(default_factory=list)
    lifecycle: list[str] = field(default_factory=list)
    group_dead: bool = False
    oom_details: bool = False
    connect_peer: bool = False
    accept_peer: bool = False  # sys_enter_accept{,4} have the address arguments where expected
    #: --stacks: entries whose arguments say where a descriptor goes (pipe, socketpair) or whether
    #: one is made (fcntl), found with the argument at the expected offset; close_range's exit
    descriptor_enters: list[str] = field(default_factory=list)
    close_range: bool = False
    #: setrlimit and prlimit64 whose entry arguments and exit are where bpf/limits.bpf.c reads them
    limit_syscalls: list[str] = field(default_factory=list)
    stack_top: bool = False  # has_task_pt_regs(), looked up only for --stacks
    missing: list[str] = field(default_factory=list)

    def cflags(self) -> list[str]:
        """Feature flags for the compiler."""
        flags = [f"-DFDT_HAVE_{name.split(':')[1]}" for name in self.lifecycle]
        if self.group_dead:
            flags.append("-DFDT_HAVE_GROUP_DEAD")
        if self.oom_details:
            flags.append("-DFDT_OOM_DETAILS")
        if self.connect_peer:
            flags.append("-DFDT_CONNECT_PEER")
        if self.limit_syscalls:
            flags.append("-DFDT_LIMITS")
        return flags


def _syscall_arg_at_16(category_event: str, field_name: str) -> bool:
    fields = tracepoint_fields("syscalls", category_event)
    return fields is not None and fields.get(field_name, (0, 0))[0] == 16


#: (syscall, the argument the --stacks entry program reads, its offset in the entry's format)
DESCRIPTOR_ENTER_ARGS: tuple[tuple[str, str, int], ...] = (
    ("pipe", "fildes", 16), ("pipe2", "fildes", 16), ("socketpair", "usockvec", 40), ("fcntl", "cmd", 24),
)


#: The entry arguments bpf/limits.bpf.c reads, and their offsets in each entry's format.
LIMIT_ENTER_ARGS: dict[str, tuple[tuple[str, int], ...]] = {
    "prlimit64": (("pid", 16), ("resource", 24), ("new_rlim", 32)),
    "setrlimit": (("resource", 16), ("rlim", 24)),
}


def has_task_pt_regs(kallsyms: Path | None = None) -> bool:
    """Whether this kernel has the bpf_task_pt_regs helper (Linux 5.15), which lets --stacks read
    the user stack pointer and so name the caller of a frameless libc syscall wrapper."""
    kallsyms = kallsyms or ProcFS().root / "kallsyms"
    try:
        with kallsyms.open("rb") as symbols:
            return any(line.rstrip().endswith(b" bpf_task_pt_regs") for line in symbols)
    except OSError:
        return False


def probe_kernel() -> KernelFeatures:
    """Find which of the tracepoints fdtrace uses this kernel has, with the layouts expected."""
    features = KernelFeatures()
    for name in SOCKET_SYSCALLS + FD_ALLOC_SYSCALLS:
        if _syscall_arg_at_16(f"sys_exit_{name}", "ret"):
            features.syscall_exits.append(name)
        elif tracepoint_fields("syscalls", f"sys_exit_{name}") is not None or name in SOCKET_SYSCALLS:
            features.missing.append(f"syscalls:sys_exit_{name}")
    for name, arg in (("close", "fd"), ("connect", "fd"), ("exit_group", "error_code")):
        if _syscall_arg_at_16(f"sys_enter_{name}", arg):
            features.syscall_enters.append(name)
        else:
            features.missing.append(f"syscalls:sys_enter_{name}")
    for name, arg, offset in DESCRIPTOR_ENTER_ARGS:
        entry = tracepoint_fields("syscalls", f"sys_enter_{name}") or {}
        if entry.get(arg, (0, 0))[0] == offset and name in features.syscall_exits:
            features.descriptor_enters.append(name)
    features.close_range = _syscall_arg_at_16("sys_exit_close_range", "ret")
    for name, arguments in LIMIT_ENTER_ARGS.items():
        entry = tracepoint_fields("syscalls", f"sys_enter_{name}") or {}
        if all(entry.get(arg, (0, 0))[0] == at for arg, at in arguments) and _syscall_arg_at_16(f"sys_exit_{name}",
                                                                                                 "ret"):
            features.limit_syscalls.append(name)
        else:
            features.missing.append(f"syscalls:sys_enter_{name}")
    connect = tracepoint_fields("syscalls", "sys_enter_connect") or {}
    features.connect_peer = (connect.get("uservaddr", (0, 0))[0], connect.get("addrlen", (0, 0))[0]) == (24, 32)
    accepts = [tracepoint_fields("syscalls", f"sys_enter_{name}") or {} for name in ("accept", "accept4")]
    features.accept_peer = all((a.get("upeer_sockaddr", (0, 0))[0], a.get("upeer_addrlen", (0, 0))[0]) == (24, 32)
                               for a in accepts)
    for category, event in LIFECYCLE_TRACEPOINTS:
        fields = tracepoint_fields(category, event)
        if fields is None:
            features.missing.append(f"{category}:{event}")
            continue
        features.lifecycle.append(f"{category}:{event}")
        if event == "sched_process_exit":
            features.group_dead = "group_dead" in fields
        if event == "mark_victim":
            features.oom_details = {"anon_rss", "file_rss", "shmem_rss", "comm"} <= fields.keys()
    state = tracepoint_fields("sock", "inet_sock_set_state")
    if state is not None and CONNECTION_FIELDS <= state.keys():
        features.lifecycle.append("sock:inet_sock_set_state")
    else:
        features.missing.append("sock:inet_sock_set_state")
    if not features.syscall_exits:
        raise FdtraceError(
            "this kernel has no syscall tracepoints (CONFIG_FTRACE_SYSCALLS is off): fdtrace cannot trace it",
        )
    return features
