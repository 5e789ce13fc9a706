"""What to do about threads: a Go program near its thread limit, threads held by DNS lookups."""

from __future__ import annotations

#: What to do when a Go program nears its thread limit.
GO_THREADS_ADVICE = ("bound the goroutines blocked in syscalls or cgo (e.g. DNS: the pure-Go resolver, "
                     "netgo), or raise the limit with runtime/debug.SetMaxThreads")


def dns_advice(go_program: bool) -> str | None:
    """What to do about threads held by DNS lookups: for a Go program, its pure-Go resolver."""
    if not go_program:
        return None
    return ("cgo DNS lookups hold a thread each until the name server answers: GODEBUG=netdns=go (or "
            "building with -tags netgo) resolves in goroutines instead")
