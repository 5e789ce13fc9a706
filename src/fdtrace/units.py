"""Quantities written for people: bytes as KiB or MiB."""

from __future__ import annotations

MIB = 1 << 20


def kib(value: float) -> str:
    """Bytes as KiB or MiB for people."""
    if abs(value) >= 10 * MIB:
        return f"{value / MIB:,.0f} MiB"
    return f"{value / 1024:,.0f} KiB" if abs(value) >= 10 * 1024 else f"{value / 1024:,.1f} KiB"
