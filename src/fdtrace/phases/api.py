"""`with phase("eval"):` marks what the shim cannot see, in the same records."""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _shim() -> Any:
    """The shim module when `fdtrace run` injected it, else None (then marks are no-ops)."""
    try:
        module = importlib.import_module("sitecustomize")
    except ImportError:
        return None
    return module if hasattr(module, "_write") and hasattr(module, "_TorchFinder") else None


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark a user-named phase (recorded with the current rank and step) around a block."""
    shim = _shim()
    token = shim._begin("user", name) if shim is not None else None
    start_mono, start_wall = time.monotonic_ns(), time.time_ns()
    try:
        yield
    finally:
        if shim is not None:
            shim._write("user", start_mono, start_wall, name=name, token=token)
