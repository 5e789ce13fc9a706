"""The third seam of the pipeline: what a view's keys do to the pipeline it is given, and what it
says of it. The command builds the pipeline and its controls (`fdtrace top`: the live source
with the R key's recording; `fdtrace replay`: the player's clock), so a view never asks which
source it shows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol


@dataclass(frozen=True)
class Notice:
    """What a control has to say after a key: one line, and how loud."""

    text: str
    severity: Literal["information", "warning", "error"] = "information"


@dataclass(frozen=True)
class Position:
    """Where a replay is in its recording: the span, the virtual clock, the wall times of the
    incidents that ``next_problem`` stops at (the position bar marks them), and the name of the
    one the last jump reached ("incident 3 of 12: haproxy accept4 EMFILE ×1,891"; "" when none)."""

    start_ns: int
    end_ns: int
    now_ns: int
    problems_ns: Iterable[int] = field(default_factory=tuple)
    incident: str = ""


class Controls(Protocol):
    """The keys of a view over a pipeline that depend on its source, typed.

    Attributes:
        playback: whether time can be moved (a replay): the keys that pause, change the speed,
            seek and jump to the next problem exist (and show) only then.
        running: whether the processes shown run now (live): their doctor's checks can be read.
        skipped: files of the recording that could not be read (nothing, live).
    """

    @property
    def playback(self) -> bool: ...

    @property
    def running(self) -> bool: ...

    @property
    def skipped(self) -> Sequence[str]: ...

    def status(self) -> str:
        """One line saying what the view shows: live (and recording), or where the replay is."""
        ...

    def position(self) -> Position | None:
        """Where the replay is (None: live, nothing to place)."""
        ...

    def toggle_recording(self) -> Notice:
        """R: start recording what the view shows, or stop; what to tell."""
        ...

    def toggle_pause(self) -> None:
        """space: pause, or go on."""

    def faster(self) -> None:
        """+: twice as fast."""

    def slower(self) -> None:
        """-: half as fast."""

    def seek_by(self, seconds: float) -> None:
        """[ ] { }: jump forward or back."""

    def next_problem(self) -> bool:
        """n: jump to the next incident (another program's failure, or the same program's after a
        quiet gap); False when there is none."""
        ...

    def previous_problem(self) -> bool:
        """N: jump to the incident that began last before now; False when there is none."""
        ...

    def next_failed_call(self) -> bool:
        """>: step to the next failed call (or end) of an incident; False when there is none."""
        ...

    def previous_failed_call(self) -> bool:
        """<: step to the previous failed call; False when there is none."""
        ...


class NoPlayback:
    """The time keys of a source whose time runs on its own (live): they do nothing, and
    ``playback`` False hides them."""

    playback = False

    def position(self) -> Position | None:
        """Nothing to place: live."""
        return None

    def toggle_pause(self) -> None:
        """Live time does not stop (``p`` freezes the view instead)."""

    def faster(self) -> None:
        """Live time has one speed."""

    def slower(self) -> None:
        """Live time has one speed."""

    def seek_by(self, seconds: float) -> None:
        """Live time cannot be moved."""

    def next_problem(self) -> bool:
        """Nothing to jump to."""
        return False

    def previous_problem(self) -> bool:
        """Nothing to jump to."""
        return False

    def next_failed_call(self) -> bool:
        """Nothing to step to."""
        return False

    def previous_failed_call(self) -> bool:
        """Nothing to step to."""
        return False
