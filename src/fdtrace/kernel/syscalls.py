"""Syscall names by number, for this machine's architecture (bcc's table)."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1024)
def syscall_name(number: int) -> str:
    """The name of syscall ``number`` ("read"), or "syscall_NUMBER" when bcc's table lacks it."""
    try:
        from bcc.syscall import syscall_name as bcc_syscall_name  # type: ignore[import-not-found,unused-ignore]

        name = bcc_syscall_name(number)
    except Exception:  # noqa: BLE001 - bcc missing, or a number it does not know
        return f"syscall_{number}"
    text = name.decode() if isinstance(name, bytes) else str(name)
    return text if text and not text.startswith("[unknown") else f"syscall_{number}"
