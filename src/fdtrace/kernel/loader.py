"""Compiles fdtrace's BPF programs with bcc, attaches them and reads what they collect.

bcc itself (its Python module and libbcc, with LLVM's compiler) is loaded only to compile
(``programs.compile_image``); programs kept from an earlier start are made and read through
libbcc_bpf alone. It hands out raw material (event record bytes and map contents); decoding into
the event model happens in the sources.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import stat
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from fdtrace.errors import FdtraceError
from fdtrace.kernel.bpf_cache import load_or_compile
from fdtrace.kernel.features import KernelFeatures
from fdtrace.kernel.programs import BpfMap, LoadedPrograms, ProbeError
from fdtrace.kernel.ringbuf import RingReader, bulk_read_supported
from fdtrace.policy import FIRST_USER_UID
from fdtrace.procfs import ProcFS
from fdtrace.procfs.elf import ElfError, ElfFile
from fdtrace.procfs.golang import go_register_abi, go_version, is_go_binary
from fdtrace.schema import COUNTERS, RAW_EVENT_DTYPE, SOCKET_SYSCALLS, STATS, SYSCALL_NAMES, bpf_cflags

#: The live /proc, where the loader looks at the processes it attaches uprobes to.
_PROCFS = ProcFS()

#: Go binaries watched for their thread-limit message at most (each one is a uprobe).
MAX_GO_BINARIES = 256
#: Of those slots, the ones kept for the programs of root and system services (uid below
#: FIRST_USER_UID), which also take any other free slot; and the most that the programs of one
#: other user take: 300 crafted binaries of one user cannot leave root's Go program unwatched.
GO_SYSTEM_SLOTS = MAX_GO_BINARIES // 2
GO_USER_SLOTS = MAX_GO_BINARIES // 8
#: Other binaries remembered as not Go (looked at once each while remembered).
MAX_OTHER_BINARIES = 4096

BPF_SOURCES = ("descriptors.bpf.c", "sockets.bpf.c", "fd_errors.bpf.c", "lifecycle.bpf.c", "connections.bpf.c",
               "go_runtime.bpf.c", "limits.bpf.c")


@dataclass(frozen=True)
class TraceOptions:
    """What to trace and how much memory the kernel side may use."""

    pids: tuple[int, ...] = ()
    follow: bool = False  # with pids: also the processes they start, and theirs
    errors_only: bool = False
    ring_pages: int = 4096  # 16 MiB of ring buffer with 4 KiB pages
    max_processes: int = 65536
    max_exited: int = 65536
    max_error_keys: int = 16384
    max_peers: int = 65536  # connect() calls in flight whose destination is kept until they return
    bulk_read: bool = True  # read the ring buffer's memory directly where the CPU allows it
    stacks: bool = False  # user stacks of failures and thread starts; descriptors remembered by call site
    max_stacks: int = 16384  # distinct (process, stack) pairs kept; more are counted as stacks_full
    max_fds: int = 262144  # descriptors remembered at once; more are counted as fds_full
    connections: bool = False  # TCP connections becoming established (recordings: clock offsets between hosts)


def bpf_source_dir() -> Path:
    """The folder holding the BPF C sources: inside the installed package, or the checkout's."""
    packaged = resources.files("fdtrace") / "_bpf"
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[3] / "bpf"
    if checkout.is_dir():
        return checkout
    raise FdtraceError("fdtrace's BPF sources are missing from this installation (bpf/*.c)")


def program_text() -> str:
    """The C program handed to bcc: the shared header, then each source file."""
    src = bpf_source_dir()
    parts = [(src / "fdtrace.h").read_text()]
    parts += [f"/* {name} */\n" + (src / name).read_text() for name in BPF_SOURCES]
    return "\n".join(parts)


def tid_slots() -> int:
    """A power of two at least pid_max, so every live tid has its own slot."""
    pid_max = _PROCFS.system_number("sys/kernel/pid_max") or 4194304
    slots = 1
    while slots < pid_max:
        slots <<= 1
    return slots


def program_cflags(options: TraceOptions, features: KernelFeatures) -> list[str]:
    """All compiler flags: numbering from the schema, kernel features and the options."""
    fd_alloc = [name for name in features.syscall_exits if name not in SOCKET_SYSCALLS]
    flags = bpf_cflags() + features.cflags()
    flags += [
        f"-DFDT_RING_PAGES={options.ring_pages}",
        f"-DFDT_MAX_PROCESSES={options.max_processes}",
        f"-DFDT_MAX_EXITED={options.max_exited}",
        f"-DFDT_MAX_ERROR_KEYS={options.max_error_keys}",
        f"-DFDT_TID_SLOTS={tid_slots()}",
        f"-DFDT_MAX_PEERS={options.max_peers}",
        "-DFDT_FD_ALLOC_PROBES=" + " ".join(f"FDT_FD_ALLOC_PROBE({name})" for name in fd_alloc),
    ]
    if options.errors_only:
        flags.append("-DFDT_ERRORS_ONLY")
    if options.connections:
        flags.append("-DFDT_CONNECTIONS")
    if options.stacks:
        flags += ["-DFDT_STACKS", f"-DFDT_MAX_STACKS={options.max_stacks}", f"-DFDT_MAX_FDS={options.max_fds}"]
        if features.stack_top:
            flags.append("-DFDT_STACK_TOP")
    if carries_close_fd(options):
        flags.append("-DFDT_CLOSE_FD")
    if carries_accept_peer(options, features):
        flags.append("-DFDT_ACCEPT_PEER")
    if options.pids:
        flags.append("-DFDT_FILTER_PIDS")
        flags.append(f"-DFDT_MAX_FILTERED={options.max_processes if options.follow else 1024}")
        if options.follow:
            flags.append("-DFDT_FOLLOW_CHILDREN")
    return flags


def carries_accept_peer(options: TraceOptions, features: KernelFeatures) -> bool:
    """Whether accept events carry the client's address, which takes a probe on every accept()
    entry: left out under --errors-only (a failed accept has no client)."""
    return features.accept_peer and not options.errors_only


def carries_close_fd(options: TraceOptions) -> bool:
    """Whether close() events carry their fd, which takes a second probe on every close().

    Under --errors-only that probe is left out (about 4 % of a socket()+close() loop's speed,
    for the fd of failed closes only), unless --stacks needs it to forget closed descriptors."""
    return not options.errors_only or options.stacks


def syscall_probes(features: KernelFeatures, options: TraceOptions) -> list[tuple[str, str]]:
    """The syscall tracepoints ``BpfTracer`` attaches for these options on this kernel, each with
    its program, in attach order: entries first, so that no exit is seen without the entry that
    carries its fd. The one declaration of the plan (``session.planned_probes`` counts it)."""
    probes = []
    for name in features.syscall_enters:
        if name == "close" and not carries_close_fd(options):
            continue
        fn = {"exit_group": "fdt_enter_exit_group", "connect": "fdt_enter_connect"}.get(name, "fdt_enter_fd_syscall")
        probes.append((f"syscalls:sys_enter_{name}", fn))
    if carries_accept_peer(options, features):
        probes += [(f"syscalls:sys_enter_{name}", "fdt_enter_accept") for name in ("accept", "accept4")
                   if name in features.syscall_exits]
    if options.stacks:
        for name in features.descriptor_enters:
            fn = {"socketpair": "fdt_enter_socketpair", "fcntl": "fdt_enter_fcntl"}.get(name, "fdt_enter_pipe")
            probes.append((f"syscalls:sys_enter_{name}", fn))
        if features.close_range:
            probes.append(("syscalls:sys_exit_close_range", "fdt_exit_close_range"))
    probes += [(f"syscalls:sys_enter_{name}", f"fdt_enter_{name}") for name in features.limit_syscalls]
    probes += [(f"syscalls:sys_exit_{name}", f"fdt_exit_{name}") for name in features.syscall_exits]
    probes += [(f"syscalls:sys_exit_{name}", f"fdt_exit_{name}") for name in features.limit_syscalls]
    return probes


def lifecycle_probes(features: KernelFeatures, options: TraceOptions) -> list[str]:
    """The lifecycle tracepoints (their programs attach themselves: bcc's TRACEPOINT_PROBE) for
    these options: inet_sock_set_state for recordings only."""
    return [name for name in features.lifecycle if name != "sock:inet_sock_set_state" or options.connections]


class BpfTracer:
    """The loaded programs: attach on construction, then poll and read maps until close().

    Attributes:
        from_cache: whether the compiled programs were kept from an earlier start
            (``kernel/bpf_cache.py``); ``programs_note`` says so to the user.
    """

    def __init__(self, options: TraceOptions, features: KernelFeatures,
                 on_stage: Callable[[str], None] | None = None) -> None:
        stage = on_stage or (lambda _text: None)
        self.options = options
        self.features = features
        self.attached: list[str] = []
        self.skipped: list[str] = list(features.missing)
        self._chunks: list[bytes] = []
        self._error_keys: dict[tuple[int, int], list[Any]] = {}
        self._go_binaries: dict[tuple[int, int], str | None] = {}  # (st_dev, st_ino) -> Go version
        self._go_slots: Counter[int] = Counter()  # uprobes on Go binaries, by the uid of who ran each first
        self._go_refused: OrderedDict[tuple[tuple[int, int], int], None] = OrderedDict()  # (binary, uid): no slot
        #: Go binaries left unwatched because no slot was left for their user, by uid.
        self.go_slots_refused: Counter[int] = Counter()
        self._not_go: OrderedDict[tuple[int, int], None] = OrderedDict()  # binaries looked at, not Go
        text, cflags = program_text().encode(), program_cflags(options, features)
        stage("loading the BPF programs (compiled ones kept from an earlier start, or compiling them)")
        loaded = load_or_compile(text, cflags)
        self.from_cache = loaded.from_cache
        self.programs_note = loaded.note
        self._programs = LoadedPrograms(loaded.image)
        try:
            self._programs["settings"][ctypes.c_uint32(0)] = ctypes.c_uint32(os.getpid())  # FDT_SETTING_SELF_PID
            if options.pids:
                pid_filter = self._programs["pid_filter"]
                for pid in options.pids:
                    pid_filter[ctypes.c_uint32(pid)] = ctypes.c_uint8(1)
            stage("attaching the probes")
            self._attach_syscalls()
            auto, failed = self._programs.autoload_tracepoints()
            self.skipped += failed
            for name in lifecycle_probes(features, options):
                if name in auto:
                    self.attached.append(name)
                elif name not in self.attached and not any(s.startswith(name + " ") for s in failed):
                    self.skipped.append(f"{name} (not attached)")
            self._ring: RingReader | None = None
            self._consume: Callable[[], Any] | None = None
            if options.bulk_read and bulk_read_supported():
                self._ring = RingReader(self._programs["events"].map_fd, options.ring_pages * mmap.PAGESIZE,
                                        RAW_EVENT_DTYPE)
            else:
                self._consume = self._programs.open_ring("events", self._on_event)
        except BaseException:
            self._programs.close()
            raise

    def _attach(self, tracepoint: str, fn_name: str) -> None:
        try:
            self._programs.attach_tracepoint(tracepoint, fn_name)
            self.attached.append(tracepoint)
        except ProbeError as exc:
            self.skipped.append(f"{tracepoint} ({_one_line(exc)})")

    def _attach_syscalls(self) -> None:
        for tracepoint, fn_name in syscall_probes(self.features, self.options):
            self._attach(tracepoint, fn_name)

    def _on_event(self, data: Any, size: int) -> None:
        self._chunks.append(ctypes.string_at(data, size))

    def poll(self) -> np.ndarray:
        """Take every event record waiting in the ring buffer (``RAW_EVENT_DTYPE`` records)."""
        if self._ring is not None:
            return self._ring.read()
        assert self._consume is not None
        self._consume()
        raw = b"".join(self._chunks)
        self._chunks.clear()
        return np.frombuffer(raw, dtype=RAW_EVENT_DTYPE)

    def watch_go_runtime(self, pid: int) -> str | None:
        """Attach the Go thread-limit uprobe (bpf/go_runtime.bpf.c) to the binary a process runs
        when it is a Go binary, once per binary (others are remembered as such, bounded).
        Returns a note when a Go binary cannot be watched (once per binary), else None."""
        exe = str(_PROCFS.exe(pid))
        try:
            info = os.stat(exe)
            target = os.readlink(exe)
        except OSError:  # it exited meanwhile: its binary is looked at again when it runs again
            return None
        binary = (info.st_dev, info.st_ino)
        if binary in self._go_binaries:
            return None
        if binary in self._not_go:
            self._not_go.move_to_end(binary)
            return None
        uid = _PROCFS.real_uid(pid)
        if uid is None:  # it exited meanwhile
            return None
        if (binary, uid) in self._go_refused:  # refused for this user: another (root) may still get a slot
            self._go_refused.move_to_end((binary, uid))
            return None
        if not stat.S_ISREG(info.st_mode) or not is_go_binary(Path(exe), scan_bytes=0):  # symbols need sections
            self._not_go[binary] = None
            while len(self._not_go) > MAX_OTHER_BINARIES:
                self._not_go.popitem(last=False)
            return None
        version = go_version(Path(exe))
        if not go_register_abi(version) or platform.machine() not in ("x86_64", "aarch64"):
            self._unwatchable(binary)
            return (f"pid {pid}: Go {version or 'before 1.18'} on {platform.machine()}: its thread-limit message "
                    "is not read (needs Go 1.18 or later on x86_64 or arm64)")
        offset = _symbol_offset(exe, "runtime.gwrite")
        if offset is None:
            self._unwatchable(binary)
            return f"pid {pid}: its Go thread-limit message is not read (no runtime.gwrite symbol: a stripped binary)"
        if not self._slot_left(uid):
            self._go_refused[binary, uid] = None
            while len(self._go_refused) > MAX_OTHER_BINARIES:
                self._go_refused.popitem(last=False)
            self.go_slots_refused[uid] += 1
            return None  # counted (go_shortfalls), not a note per binary: a flood of them is one line
        try:
            self._programs.attach_uprobe(exe, offset, "fdt_go_gwrite", f"runtime.gwrite of {target}")
        except ProbeError as exc:
            self._unwatchable(binary)
            return f"pid {pid}: its Go thread-limit message is not read ({_one_line(exc)})"
        self._go_binaries[binary] = version
        self._go_slots[uid] += 1
        self.attached.append(f"uprobe:runtime.gwrite of {target}")
        return None

    def _unwatchable(self, binary: tuple[int, int]) -> None:
        """A Go binary whose message cannot be read (said once while remembered)."""
        self._not_go[binary] = None
        while len(self._not_go) > MAX_OTHER_BINARIES:
            self._not_go.popitem(last=False)

    def _slot_left(self, uid: int) -> bool:
        """Whether a Go binary first run by ``uid`` gets a uprobe: root's and the system services'
        (uid below FIRST_USER_UID) while any slot is free; another user's only outside the
        GO_SYSTEM_SLOTS kept for those, and up to GO_USER_SLOTS of them per user."""
        if sum(self._go_slots.values()) >= MAX_GO_BINARIES:
            return False
        if uid < FIRST_USER_UID:
            return True
        users = sum(n for owner, n in self._go_slots.items() if owner >= FIRST_USER_UID)
        return users < MAX_GO_BINARIES - GO_SYSTEM_SLOTS and self._go_slots[uid] < GO_USER_SLOTS

    def go_shortfalls(self) -> list[str]:
        """The Go binaries left unwatched for want of a slot, in words (one line), or nothing."""
        if not self.go_slots_refused:
            return []
        total = sum(self.go_slots_refused.values())
        users = ", ".join(f"uid {uid} {n}" for uid, n in sorted(self.go_slots_refused.items(),
                                                                  key=lambda item: (-item[1], item[0]))[:5])
        return [f"{total} Go binar{'y' if total == 1 else 'ies'} not watched for its thread-limit message: no "
                f"uprobe slot left for its user ({users}; {sum(self._go_slots.values())} of {MAX_GO_BINARIES} "
                f"slots taken, {GO_USER_SLOTS} at most per user, {GO_SYSTEM_SLOTS} kept for root and system "
                "services)"]

    def stats(self) -> dict[str, int]:
        """Loss and overflow counters since load, summed over CPUs."""
        table = self._programs["stats"]
        return {name: int(sum(table[ctypes.c_int(i)])) for i, name in enumerate(STATS)}

    def live_counters(self) -> list[dict[str, Any]]:
        """Counters of the processes alive now, one dict per process."""
        return [_counters_row(getattr(k, "value", k), v) for k, v in _items(self._programs["counters"])]

    def take_exited(self) -> list[dict[str, Any]]:
        """Final counters of the processes that exited since the last call (removed from BPF)."""
        table = self._programs["exited"]
        rows = []
        for key, value in _items(table):
            rows.append(_counters_row(key.pid, value))
            del table[key]
        return rows

    def error_counts(self) -> list[dict[str, Any]]:
        """Failed calls per (process instance, syscall, errno)."""
        rows = []
        self._error_keys = {}
        for key, value in _items(self._programs["errors"]):
            self._error_keys.setdefault((key.pid, key.first_ts), []).append(key)
            rows.append({"pid": key.pid, "first_ts": key.first_ts, "syscall": SYSCALL_NAMES[key.syscall],
                         "errno": key.errno_, "count": int(getattr(value, "value", value))})
        return rows

    def take_ending_events(self) -> np.ndarray:
        """The OOM kills and Go thread-limit exits kept in the kernel beside the ring
        (``ending_events`` in bpf/fdtrace.h) since the last call, removed there
        (``RAW_EVENT_DTYPE`` records; the ring holds a copy of each unless it was full)."""
        table = self._programs["ending_events"]
        entries = _items(table)
        for key, _ in entries:
            try:
                del table[key]
            except KeyError:
                continue
        return np.frombuffer(b"".join(bytes(value) for _, value in entries), dtype=RAW_EVENT_DTYPE)

    def failed_instances(self, errnos: frozenset[int]) -> set[tuple[int, int]]:
        """The process instances (pid, first_ts) with a failed call of one of ``errnos`` counted:
        the error table read alone (it holds failing processes only), cheap enough for each poll."""
        return {(key.pid, key.first_ts) for key, _ in _items(self._programs["errors"]) if key.errno_ in errnos}

    def forget_errors(self, instances: set[tuple[int, int]]) -> None:
        """Remove the error counts of exited process instances (pid, first_ts), as last read by
        ``error_counts()`` (an exited process makes no new errors)."""
        table = self._programs["errors"]
        for instance in instances:
            for key in self._error_keys.pop(instance, []):
                del table[key]

    def read_stack(self, stack_id: int) -> tuple[int, list[int], list[int]] | None:
        """One kept stack (--stacks): (pid, the words from its stack pointer up, return addresses
        innermost first), or None when the id is unknown."""
        try:
            value = self._programs["stacks"][ctypes.c_uint64(stack_id)]
        except KeyError:
            return None
        depth = min(int(value.depth), len(value.ips))
        return int(value.tgid), [int(w) for w in value.scan], [int(value.ips[i]) for i in range(depth)]

    def live_fds(self) -> list[tuple[int, int, int, int]]:
        """The descriptors remembered now (--stacks): (pid, fd, stack id, CLOCK_MONOTONIC ns made)."""
        return [(int(k.tgid), int(k.fd), int(v.stack_id), int(v.ts)) for k, v in _items(self._programs["live_fds"])]

    def forget_fds(self, keys: list[tuple[int, int]]) -> None:
        """Remove remembered descriptors (pid, fd) that are known to be closed."""
        table = self._programs["live_fds"]
        for pid, fd in keys:
            try:
                del table[table.Key(pid, fd)]
            except KeyError:
                pass  # closed (or replaced and closed) in the meantime

    def take_fd_site_counts(self) -> dict[int, tuple[int, int]]:
        """Descriptors made and closed per stack id since the last call (--stacks): each entry is
        read and deleted in one step, so no count is lost to a race with the programs."""
        table = self._programs["fd_sites"]
        try:
            taken = table.items_lookup_and_delete_batch()
        except OSError:  # kernels before 5.6: read, then delete (a count made in between is lost)
            taken = table.items()
            for key, _value in taken:
                try:
                    del table[key]
                except KeyError:
                    pass
        return {int(getattr(k, "value", k)): (int(v.opened), int(v.closed)) for k, v in taken}

    def prefix_sites(self) -> list[tuple[Any, int, int]]:
        """The call sites known by their innermost frames (--stacks): (key, stack id, pid)."""
        return [(key, int(value.stack_id), int(value.tgid)) for key, value in _items(self._programs["prefix_sites"])]

    def forget_prefixes(self, keys: Iterable[Any]) -> None:
        """Remove call sites known by their innermost frames (those of processes that are gone)."""
        table = self._programs["prefix_sites"]
        for key in keys:
            try:
                del table[key if isinstance(key, ctypes._SimpleCData) else table.Key(key)]
            except KeyError:
                pass

    def forget_stacks(self, stack_ids: Iterable[int]) -> None:
        """Remove kept stacks (read already, or no longer needed) from the kernel's table."""
        table = self._programs["stacks"]
        for stack_id in stack_ids:
            try:
                del table[ctypes.c_uint64(stack_id)]
            except KeyError:
                pass

    def take_fd_changes(self) -> dict[int, tuple[int, int, int]]:
        """Bulk changes of descriptor tables since the last call (--stacks): pid -> (CLOCK_MONOTONIC
        ns of its last exec or close_range, of its exit, of its last exec; 0 when none). Exited
        ones are removed."""
        table = self._programs["fd_changes"]
        changes = {}
        for key, value in _items(table):
            pid = int(getattr(key, "value", key))
            changes[pid] = (int(value.changed_ts), int(value.gone_ts), int(value.exec_ts))
            if value.gone_ts:
                try:
                    del table[table.Key(pid)]
                except KeyError:
                    pass
        return changes

    def close(self) -> None:
        """Detach everything and close every descriptor of the programs, each once (a second
        call does nothing). The detaches run from threads: each waits for an RCU grace period in
        the kernel (about 70 ms here), 53 one after the other took 3.9 s."""
        ring, self._ring = self._ring, None
        if ring is not None:
            ring.close()
        self._programs.close()


def _items(table: BpfMap) -> list[tuple[Any, Any]]:
    try:
        return table.items_lookup_batch()
    except OSError:  # kernels before 5.6 have no batch lookups
        return table.items()


def _symbol_offset(path: str, name: str) -> int | None:
    """The file offset of a function of a binary (where a uprobe on it is attached)."""
    try:
        with ElfFile.open(path) as elf:
            symbols = elf.function_symbols()
            address = symbols.address_of(name) if symbols is not None else None
            return elf.offset_of_vaddr(address) if address is not None else None
    except (OSError, ElfError):
        return None


def _counters_row(pid: int, value: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "pid": int(pid),
        "first_ts": int(value.first_ts),
        "exit_ts": int(value.exit_ts) or None,
        "comm": bytes(value.comm).split(b"\0", 1)[0].decode("utf-8", "replace"),
    }
    for i, name in enumerate(COUNTERS):
        row[name] = int(value.n[i])
    return row


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] if text else type(exc).__name__
