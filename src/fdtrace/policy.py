"""Policy shared by the live view, doctor and the report: when usage is a warning or critical,
the margin a recommended limit gets, which errors are exhaustion, and the advice texts."""

from __future__ import annotations

import math
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


MIB = 1 << 20


def kib(value: float) -> str:
    """Bytes as KiB or MiB for people."""
    if abs(value) >= 10 * MIB:
        return f"{value / MIB:,.0f} MiB"
    return f"{value / 1024:,.0f} KiB" if abs(value) >= 10 * 1024 else f"{value / 1024:,.1f} KiB"


#: The first uid of a person's account (Debian's and most distributions' FIRST_UID): below it,
#: root and the system services, whose programs come first for what fdtrace shares out (the
#: flight recorder's incident budget).
FIRST_USER_UID = 1000


def is_system_uid(uid: int | None) -> bool:
    """Whether a process of this real uid is root's or a system service's; an unknown uid is a
    user's (a process cannot rank itself up by exiting before it is looked at)."""
    return uid is not None and 0 <= uid < FIRST_USER_UID
