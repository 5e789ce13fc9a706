"""How a call site is named from its stack: the frame that names it (past libc and Go's syscall
plumbing), a thread-creation stack cut at its creator's start, the Go runtime's reason for a
thread, and the function of the program a stack is in (or the C library's DNS lookup)."""

from __future__ import annotations

from typing import Any

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
