"""The two seams of the pipeline: a source of updates and a sink of them."""

from __future__ import annotations

from typing import Protocol

from fdtrace.pipeline.update import SourceInfo, Update


class Source(Protocol):
    """Yields updates: the live kernel with its /proc sampling, or a recording replayed."""

    @property
    def info(self) -> SourceInfo:
        """What sinks need to know of the source (valid after ``start()``)."""
        ...

    def start(self) -> None:
        """Begin (attach probes, open files). Raises FdtraceError with the reason."""

    def poll(self) -> Update:
        """Everything since the previous poll."""
        ...

    def finish(self) -> Update:
        """The last update: what is still pending, with final readings of counters and losses."""
        ...

    def stop(self) -> None:
        """Release what ``start()`` took; safe to call more than once."""


class Sink(Protocol):
    """Consumes updates: JSON lines, a Parquet recording, Prometheus metrics, the live view.

    Attributes:
        name: how messages name it ("recording to DIR").
        required: a required sink that fails stops the pipeline; an optional one is detached
            and its error kept in ``Pipeline.failures``, the rest goes on.
    """

    name: str
    required: bool

    def open(self, info: SourceInfo) -> None:
        """Prepare to take updates from a source. Raises FdtraceError with the reason."""

    def write(self, update: Update) -> None:
        """Take one update. Raises FdtraceError when it cannot."""

    def close(self, failed: bool = False) -> None:
        """Finish after the final update; with ``failed``, release quietly without finishing."""
