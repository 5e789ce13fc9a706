"""Messages from the pipeline's thread to the interface."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from fdtrace.pipeline import Update


@dataclass
class FeedUpdated(Message):
    """The pipeline was polled; the update carries what happened since the previous one."""

    update: Update


@dataclass
class FeedFailed(Message):
    """The source stopped with an error."""

    error: str
