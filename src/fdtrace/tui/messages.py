"""Messages from the feed thread to the interface."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from fdtrace.feeds import FeedUpdate


@dataclass
class FeedUpdated(Message):
    """The feed was polled; the update carries what happened since the previous one."""

    update: FeedUpdate


@dataclass
class FeedFailed(Message):
    """The feed stopped with an error."""

    error: str
