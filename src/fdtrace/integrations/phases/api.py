"""`with phase("eval"):` marks what the shim cannot see, in the same records; ``Marks`` does the
same for phases that one callback opens and another closes (the Lightning and Hugging Face
callbacks)."""

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


class Marks:
    """Phases begun in one hook and ended in another, recorded with ``source`` (``"lightning"``,
    ``"huggingface"``). Without `fdtrace run` every call does nothing."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._shim = _shim()
        self._open: dict[tuple[str, str | None], tuple[Any, int, int, int]] = {}

    def begin(self, phase_name: str, name: str | None = None) -> None:
        """``phase_name`` (a fixed phase, or ``"user"`` with ``name``) begins now."""
        if self._shim is None:
            return
        self.end(phase_name, name)  # a begin without its end (an exception between): close it
        token = self._shim._begin(phase_name, name)
        step = self._shim._state["step"]  # the step it began in, the one it is recorded with
        self._open[(phase_name, name)] = (token, time.monotonic_ns(), time.time_ns(), step)

    def end(self, phase_name: str, name: str | None = None) -> None:
        """The phase begun with the same arguments ends now; nothing if it was not begun."""
        opened = self._open.pop((phase_name, name), None)
        if opened is None or self._shim is None:
            return
        token, start_mono, start_wall, step = opened
        self._shim._write(phase_name, start_mono, start_wall, name=name, token=token, source=self.source, step=step)
