"""The start-up line: redrawn on a terminal while bcc compiles, cleared before the view or the
first output; nothing at all when stderr is not a terminal."""

from __future__ import annotations

import io

from fdtrace.cli.common import StartupProgress
from tests.helpers import eventually


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def redraws_of(screen: Terminal) -> list[str]:
    return [part for part in screen.getvalue().split("\r\033[K") if part]


def test_the_line_names_each_step_with_its_seconds_and_is_cleared() -> None:
    screen = Terminal()
    with StartupProgress(screen) as progress:
        progress.stage("compiling the BPF programs (6 files)")
        # its ticks, counted as they come (a busy machine ticks late, not never)
        eventually(lambda: len([r for r in redraws_of(screen) if r.startswith("fdtrace: compiling")]) >= 3,
                   "three redraws while compiling", timeout=30, every=StartupProgress.TICK_S / 4)
        progress.stage("attaching the probes")
    shown = screen.getvalue()
    redraws = redraws_of(screen)
    assert redraws[0] == "fdtrace: compiling the BPF programs (6 files)... 0.0 s"
    assert len([r for r in redraws if r.startswith("fdtrace: compiling")]) >= 3  # it ticks while compiling
    assert redraws[-1].startswith("fdtrace: attaching the probes... ")
    assert shown.endswith("\r\033[K")  # nothing of it is left on the screen


def test_not_on_a_terminal_it_says_nothing() -> None:
    log = io.StringIO()
    with StartupProgress(log) as progress:
        progress.stage("compiling the BPF programs (6 files)")
    assert log.getvalue() == ""
