"""The HTML report in a real headless Chromium: it loads offline with no console message, Plotly
draws every panel, and the screenshot shows them."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from fdtrace.analysis import load
from fdtrace.analysis.report import build, to_html
from fdtrace.analysis.report.charts import PALETTE, panels_of

DATA = Path(__file__).parents[1] / "data"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/setup.sh installs it)")


def chromium(page: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Chromium, headless, without network: any request beyond the file itself would fail."""
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--log-level=0", "--proxy-server=127.0.0.1:9",
                           "--virtual-time-budget=5000", "--window-size=1200,2000", *options, page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.parametrize("name", ["emfile", "ddp"])
def test_the_report_draws_its_panels_in_chromium(name: str, tmp_path: Path) -> None:
    report = build(load(DATA / name))
    page = tmp_path / "report.html"
    page.write_text(to_html(report))
    titles = panels_of(report)
    assert len(titles) >= 3
    dom = chromium(page, "--dump-dom")
    assert not re.findall(r"CONSOLE[^\n]*", dom.stderr)  # no error, warning or log line from the page
    # Plotly drew the figures: one x axis per panel of the timeline (all one zoom) and one per kind
    # of rank of the scale chart (a DDP job's), each panel's title, the legend.
    scale_panels = report.scale_curve["role"].nunique() if len(report.scale_laws) else 0
    assert scale_panels == (0 if name == "emfile" else 2)
    assert dom.stdout.count('class="xaxislayer-above"') == len(titles) + scale_panels
    drawn = set(re.findall(r'data-unformatted="([^"]*)"', dom.stdout))
    assert {html.escape(title) for title in titles} <= drawn
    legend = set(re.findall(r'class="legendtext"[^>]*data-unformatted="([^"]*)"', dom.stdout))
    if name == "emfile":
        assert {"emfile-child [15007]", "first failure"} <= legend
    else:
        assert {"forward", "backward", "allreduce", "optimizer"} <= legend
    # The screenshot holds the lines of the first process, in its colour.
    shot = tmp_path / "report.png"
    chromium(page, f"--screenshot={shot}")
    with Image.open(shot) as image:
        pixels = image.convert("RGB")
        colours = {pixels.getpixel((x, y)) for x in range(0, pixels.width, 2) for y in range(0, pixels.height, 2)}
    assert tuple(int(PALETTE[0][i:i + 2], 16) for i in (1, 3, 5)) in colours
