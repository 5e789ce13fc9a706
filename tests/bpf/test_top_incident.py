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


@pytest.mark.xfail(strict=True, reason="issue 34, open: after bounding the view's per-update work, 2 to 5 of six "
                   "failing programs on screen within 2 s, RSS 360-417 MB, q after 2.1-3.3 s (load 10-20 on the 2 "
                   "cores: top gets about a quarter of a core and the flood fills the 16 MiB ring between polls; "
                   "docs/benchmarks.md)")
def test_failing_programs_show_within_2_s_under_churn_and_flood() -> None:
    figures = run(FDTRACE, programs=6, gap_s=5.0, hold_s=4.0, timeout_s=2.0)
    assert all(after is not None for after in figures.shown_after_s.values()), figures
    assert max(rss for _, rss in figures.rss_mb) < 300, figures
    assert figures.quit_s is not None and figures.quit_s < 2.0, figures
    assert figures.processes_started > 1000, figures  # the churn ran
