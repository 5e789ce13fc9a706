"""`fdtrace top` on the incident host (issue 34), in a real terminal (tmux): two fork-and-exit
loops and a socket flood run while six programs fail with EMFILE, 5 s apart (the issue's 90 s
run is bench/live_incident): each is on screen within 2 s of its failure, top stays under 300 MB,
and q quits within 2 s."""

from __future__ import annotations

import shutil

import pytest

from tests.bpf.incident_host import run
from tests.conftest import needs_root
from tests.helpers import FDTRACE

pytestmark = [needs_root(), pytest.mark.bpf,
              pytest.mark.skipif(shutil.which("tmux") is None or shutil.which("cc") is None,
                                 reason="needs tmux and a C compiler")]


@pytest.mark.xfail(strict=True, reason="issue 34, open: 18 of 18 failing programs on screen within 2 s in 3 runs "
                   "(0.12-1.03 s) and q under 0.6 s, but top's RSS peaks at 311-339 MB, over the 300 MB asked "
                   "(docs/benchmarks.md, 'Freed memory returned')")
def test_failing_programs_show_within_2_s_under_churn_and_flood() -> None:
    figures = run(FDTRACE, programs=6, gap_s=5.0, hold_s=4.0, timeout_s=2.0)
    assert all(after is not None for after in figures.shown_after_s.values()), figures
    assert max(rss for _, rss in figures.rss_mb) < 300, figures
    assert figures.quit_s is not None and figures.quit_s < 2.0, figures
    assert figures.processes_started > 1000, figures  # the churn ran
