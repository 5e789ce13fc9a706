"""Telling a Go binary: its build info section, which every Go program since 1.13 carries."""

from __future__ import annotations

from pathlib import Path

#: The magic that starts the .go.buildinfo section.
BUILDINFO_MAGIC = b"\xff Go buildinf:"
#: Go's default limit on OS threads (runtime/debug.SetMaxThreads); past it the program dies.
GO_DEFAULT_MAX_THREADS = 10_000


def is_go_binary(exe: Path, scan_bytes: int = 64 << 20) -> bool:
    """Whether the executable carries Go build info (read in chunks, at most ``scan_bytes``)."""
    try:
        with open(exe, "rb") as binary:
            tail = b""
            read = 0
            while read < scan_bytes:
                chunk = binary.read(1 << 20)
                if not chunk:
                    return False
                if BUILDINFO_MAGIC in tail + chunk:
                    return True
                tail = chunk[-len(BUILDINFO_MAGIC):]
                read += len(chunk)
    except OSError:
        return False
    return False
