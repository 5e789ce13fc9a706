"""Policy shared by the live view, doctor and the report: when usage is a warning or critical,
the margin a recommended limit gets, which errors are exhaustion, and the advice texts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Usage of a limit (count / limit) that turns amber, and red.
USAGE_WARN = 0.80
USAGE_CRITICAL = 0.95

#: A recommended limit is the need times this margin.
LIMIT_MARGIN = 1.2

#: The errno names that mean a descriptor table is full (the process's, or the system's).
FD_EXHAUSTION_ERRNOS: frozenset[str] = frozenset({"EMFILE", "ENFILE"})

#: What to do when a Go program nears its thread limit.
GO_THREADS_ADVICE = ("bound the goroutines blocked in syscalls or cgo (e.g. DNS: the pure-Go resolver, "
                     "netgo), or raise the limit with runtime/debug.SetMaxThreads")

#: What each kind of thread limit counts (``thread_count`` in the headroom series): only Go's
#: count the program's own threads; the others are shared with the user, the cgroup or the system.
THREADS_COUNTED = {"Go default": "threads", "Go SetMaxThreads": "threads", "RLIMIT_NPROC": "threads of its user",
                   "cgroup pids.max": "tasks in its cgroup", "threads-max": "tasks on the system"}


def with_margin(value: int) -> int:
    """A limit that leaves room above ``value`` (x LIMIT_MARGIN, rounded up)."""
    return math.ceil(value * LIMIT_MARGIN)


#: Descriptors a watched process must have free, read just before fdtrace does something that
#: costs it one (a connection to HAProxy's stats socket): at least this many, and this share of
#: its soft limit. fdtrace connects a few microseconds after the read, and the process takes the
#: connection at its next turn of its event loop; until then it goes on accepting. HAProxy 2.6
#: accepts at most tune.maxaccept (4 by default) connections in a row per listener and thread,
#: and gives each a server-side socket: one turn on two threads takes 2 x 4 x 2 = 16. The share
#: covers bigger processes (more threads and listeners, faster bursts): 5 % of 65,536 is 3,277.
#: (A connection fdtrace makes while the process is full costs it more than one failure: HAProxy
#: tries the accept4 again every 100 ms until a descriptor is free.)
PROBE_ROOM_MIN = 16
PROBE_ROOM_SHARE = 0.05


def probe_room(soft_limit: int) -> int:
    """Descriptors that must be free in a process whose soft limit is ``soft_limit`` before
    fdtrace makes it take one (``PROBE_ROOM_MIN``, or ``PROBE_ROOM_SHARE`` of the limit)."""
    return max(PROBE_ROOM_MIN, math.ceil(soft_limit * PROBE_ROOM_SHARE))


#: Frames of the C library and of Go's syscall plumbing: a site is named by the first frame below them.
_WRAPPER_MODULES = ("[libc.so", "[libpthread", "[ld-linux", "[libc-")
_WRAPPER_FUNCTIONS = ("syscall.", "runtime.", "runtime/", "internal/poll.", "internal/syscall",
                      "golang.org/x/sys/unix.")


def site_name(frames: Any) -> str:
    """The frame that names a call site: the first one outside libc and Go's syscall plumbing."""
    frames = list(frames) if frames is not None else []
    for frame in frames:
        function, _, module = str(frame).partition(" ")
        if module.startswith(_WRAPPER_MODULES) or function.startswith(_WRAPPER_FUNCTIONS):
            continue
        return str(frame)
    return str(frames[0]) if frames else "(no stack)"


#: Functions a thread's stack starts from: a walk that ends in one of them is whole, and a
#: creation site ends there (what lies past it on the stack is stale, not a caller).
THREAD_ENTRY_FUNCTIONS: frozenset[str] = frozenset({
    "_start", "__libc_start_main", "__libc_start_call_main", "start_thread", "clone", "__clone", "clone3",
    "__clone3", "__clone_internal", "runtime.goexit", "runtime.goexit.abi0", "runtime.rt0_go",
    "runtime.rt0_go.abi0", "runtime.mstart", "runtime.mstart.abi0", "runtime.mstart0", "thread_start",
})


def _function_of(frame: Any) -> str:
    return str(frame).partition(" ")[0].rsplit("+0x", 1)[0]


#: The calls that make a thread: on a creating stack they are the innermost frames, not its start.
_CLONE_FUNCTIONS = frozenset({"clone", "__clone", "clone3", "__clone3", "__clone_internal"})


def to_thread_start(frames: Any) -> list[str]:
    """A thread-creation stack cut at the creating thread's own start: the frames up to the first
    thread entry past the clone itself, which is kept; a Go thread's creator ends at
    runtime.mstart0, a C one at start_thread or __libc_start_call_main."""
    texts: list[str] = [str(f) for f in (frames if frames is not None else [])]
    for index, frame in enumerate(texts[1:], start=1):
        function = _function_of(frame)
        if function in THREAD_ENTRY_FUNCTIONS and function not in _CLONE_FUNCTIONS:
            return texts[:index + 1]
    return texts


#: Why the Go runtime made a thread, by a function on the creating stack: (function, the reason).
GO_THREAD_REASONS: tuple[tuple[str, str], ...] = (
    ("runtime.handoffp", "a goroutine blocked in a syscall: its P was handed to a new thread (runtime.handoffp)"),
    ("runtime.startTemplateThread", "the runtime's template thread, for threads LockOSThread needs"),
    ("runtime.cgocall", "a cgo call (a C function, e.g. getaddrinfo: the pure-Go resolver, netgo, avoids it)"),
    ("runtime.asmcgocall", "a cgo call (a C function, e.g. getaddrinfo: the pure-Go resolver, netgo, avoids it)"),
    ("runtime.wakep", "an idle P woken to run runnable goroutines (runtime.wakep)"),
    ("runtime.main", "the runtime's own start (sysmon, the first threads)"),
)


def thread_reason(frames: Any) -> str:
    """Why a thread was made, in words, where its creating stack says (Go's runtime), else ""."""
    functions = {_function_of(f) for f in (frames if frames is not None else [])}
    return next((reason for function, reason in GO_THREAD_REASONS if function in functions), "")


#: glibc's DNS resolver: a thread stopped in one of these waits for a name server (in a Go
#: program, a cgo lookup: one thread held per lookup in flight).
_RESOLVER_FUNCTIONS = ("getaddrinfo", "gaih_inet", "_nss_dns_", "__res_context_", "__res_nquery", "__res_nsearch",
                       "send_dg", "send_vc", "gethostbyname", "__libc_res_n")
#: The site of a thread waiting in the C library's DNS resolver.
DNS_LOOKUP_SITE = "the C library's DNS lookup (getaddrinfo)"


def code_site(frames: Any) -> str | None:
    """The function of the program a stack is in: its first frame outside libc and Go's syscall
    plumbing, as a name ("main.holdThread"); DNS_LOOKUP_SITE for a stack in the C library's
    resolver before any frame of the program's own; None where no frame is the program's own."""
    for frame in list(frames) if frames is not None else []:
        function, _, module = str(frame).partition(" ")
        if module.startswith(_WRAPPER_MODULES) and function.startswith(_RESOLVER_FUNCTIONS):
            return DNS_LOOKUP_SITE
        if module.startswith(_WRAPPER_MODULES) or function.startswith(_WRAPPER_FUNCTIONS):
            continue
        if function.startswith(("0x", "[")):
            return None  # an address no symbol names: not a site to group by
        return function.rsplit("+0x", 1)[0]
    return None


def dns_advice(go_program: bool) -> str | None:
    """What to do about threads held by DNS lookups: for a Go program, its pure-Go resolver."""
    if not go_program:
        return None
    return ("cgo DNS lookups hold a thread each until the name server answers: GODEBUG=netdns=go (or "
            "building with -tags netgo) resolves in goroutines instead")


def _known(value: Any) -> bool:
    """Whether a figure is there (not None, NaN or pandas' NA; no pandas needed)."""
    return value is not None and type(value).__name__ != "NAType" and value == value


def need_of(soft: Any, peak: Any, emfile: int, worst_second: int, maxsock: Any,
            config_need: int | None = None, source: str | None = None,
            maxsock_from: str | None = None) -> tuple[int, str]:
    """(descriptors needed, why) for one process's RLIMIT_NOFILE: the one needs model of the live
    view, doctor (live and --from), info and the report.

    The need is the largest of its peak of open descriptors and what the program demands of
    itself (HAProxy's Maxsock from `show info`, else what its configuration's maxconn makes);
    only when it demands nothing known does a process that failed with EMFILE need its limit in
    force then (``soft``, set by ``source``) plus the opens it refused in its worst second (a
    retry counted again: a guess, which the program's own demand replaces)."""
    known = [(int(peak), f"peak {int(peak)} open")] if _known(peak) else []
    demanded = []
    if _known(maxsock):
        said = "its configuration's maxconn, nbthread and listeners" if maxsock_from == "configuration" else "show info"
        demanded.append((int(maxsock), f"HAProxy's Maxsock {int(maxsock)} ({said})"))
    if config_need is not None:
        demanded.append((config_need, f"its maxconn needs ~{config_need}"))
    known += demanded
    if emfile and _known(soft) and not demanded:
        set_by = f" ({source})" if source else ""
        known.append((int(soft) + int(worst_second), f"its limit {int(soft)}{set_by} plus the {int(worst_second)} "
                                                     "opens refused with EMFILE in its worst second"))
    if not known:
        return 0, "nothing recorded"
    return max(known, key=lambda item: item[0])


#: A memory-per-connection fit needs this many samples, over at least this many distinct socket
#: counts spanning at least MIN_SOCKET_SPAN sockets.
MIN_FIT_POINTS, MIN_FIT_LEVELS, MIN_SOCKET_SPAN = 5, 3, 10
#: At most this many points go into a fit (evenly chosen): its pairwise slopes stay bounded.
MAX_FIT_POINTS = 120
MIB = 1 << 20


@dataclass(frozen=True)
class MemoryFit:
    """Memory against sockets, fitted over one process's samples (Theil-Sen: the median of the
    slopes between every two samples, robust to the odd sample taken during a burst).

    Attributes:
        per_connection: bytes each socket held adds (the slope).
        base: bytes at no sockets (the median intercept).
        spread: half the interquartile range of the pairwise slopes, bytes.
        points: samples used; sockets_from, sockets_to: the range of sockets they cover.
        measure: what memory was fitted: "cgroup usage" or "RSS".
    """

    per_connection: float
    base: float
    spread: float
    points: int
    sockets_from: int
    sockets_to: int
    measure: str

    def at(self, connections: int) -> int:
        """The memory ``connections`` sockets take, bytes."""
        return max(int(self.base + self.per_connection * connections), 0)

    def describe(self) -> str:
        """"about 100 KiB per connection (± 3 KiB; 48 samples, 12 to 1,380 sockets, cgroup usage)"."""
        return (f"about {kib(self.per_connection)} per connection (± {kib(self.spread)}; {self.points} samples, "
                f"{self.sockets_from:,} to {self.sockets_to:,} sockets, {self.measure})")


def kib(value: float) -> str:
    """Bytes as KiB or MiB for people."""
    if abs(value) >= 10 * MIB:
        return f"{value / MIB:,.0f} MiB"
    return f"{value / 1024:,.0f} KiB" if abs(value) >= 10 * 1024 else f"{value / 1024:,.1f} KiB"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def memory_fit(points: list[tuple[int, int]], measure: str) -> MemoryFit | None:
    """The memory a connection costs, from (sockets, bytes) samples of one process; None unless
    the samples cover enough distinct socket counts (its memory must have been seen growing with
    its connections) and the slope is positive."""
    usable = [(int(s), int(b)) for s, b in points if _known(s) and _known(b)]
    if len(usable) < MIN_FIT_POINTS or len({s for s, _ in usable}) < MIN_FIT_LEVELS:
        return None
    low, high = min(s for s, _ in usable), max(s for s, _ in usable)
    if high - low < MIN_SOCKET_SPAN:
        return None
    if len(usable) > MAX_FIT_POINTS:
        step = len(usable) / MAX_FIT_POINTS
        usable = [usable[int(i * step)] for i in range(MAX_FIT_POINTS)]
    slopes = [(b2 - b1) / (s2 - s1) for i, (s1, b1) in enumerate(usable) for s2, b2 in usable[i + 1:] if s2 != s1]
    slope = _median(slopes)
    if slope <= 0:
        return None
    ordered = sorted(slopes)
    spread = (ordered[3 * len(ordered) // 4] - ordered[len(ordered) // 4]) / 2
    base = _median([b - slope * s for s, b in usable])
    return MemoryFit(slope, base, spread, len(usable), low, high, measure)


def memory_advice(comm: str, fit: MemoryFit, connections: int, what: str, limit: int | None) -> tuple[int, str, str]:
    """(bytes needed, why, what to change) for ``connections`` of a process whose memory grows by
    ``fit``, against its memory cgroup's ``limit``: the memory half of the needs model, the same
    words in doctor, info and the report. ``what`` says where the connection count comes from."""
    need = fit.at(connections)
    why = f"at {connections:,} connections ({what}) {comm} needs about {kib(need)}, {fit.describe()}"
    if limit is None:
        return need, why, ""
    if need * LIMIT_MARGIN <= limit:
        return need, f"{why}; its cgroup allows {kib(limit)}", ""
    fits = max(int((limit / LIMIT_MARGIN - fit.base) / fit.per_connection), 0)
    raise_to = math.ceil(need * LIMIT_MARGIN / MIB)
    fewer = f"lower maxconn to {fits:,}" if comm.startswith("haproxy") else f"hold at most {fits:,} connections"
    change = (f"{fewer} (what its cgroup holds with the margin) or raise MemoryMax= of its unit (memory.max, "
              f"memory.limit_in_bytes) to {raise_to}M" + (" (and tune.bufsize)" if comm.startswith("haproxy") else ""))
    return need, f"{why}; its cgroup allows {kib(limit)}", change
