"""Recordings crafted to change fdtrace's answer or to reach the reader's page (issue 37, K and O):
a process name holding escape sequences and HTML, parts copied under other names or named
outside the layout, and values no kernel gives (a pid of -1, a soft limit of -1 or 2^62-1,
-5 open descriptors, an anon RSS of 2^61 kB, an errno no kernel has). Each is made by the test
from a copy of tests/data/emfile (fdtrace's own recording of a process reaching EMFILE) and each
finding must be one warning line with its count, the answer the honest recording gives, and no
advice made from an impossible value."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pyarrow as pa

from fdtrace.display import shown
from tests.hostile import mutations as damage

#: An OSC title change, a bell and HTML that would run in the report's page.
NAME = "\x1b]0;PWNED\x07</script><svg onload=alert(1)>"


def _renamed(table: pa.Table) -> pa.Table:
    comm = table["comm"].cast(pa.string())
    names = pa.array([NAME if value == "emfile-child" else value for value in comm.to_pylist()], pa.string())
    return damage.set_column(table, "comm", names.cast(table["comm"].type))


def test_the_html_report_shows_a_hostile_name_as_text(tmp_path: Path) -> None:
    recording = damage.copy(damage.EMFILE, tmp_path / "rec")
    for table in ("events", "samples", "counters"):
        for part in damage.parts(recording, table):
            damage.rewrite(part, _renamed)
    page = tmp_path / "report.html"
    damage.succeeded(damage.fdtrace("report", str(recording), "-o", str(page)))
    text = page.read_text()
    for raw in ("\x1b", "\x07", "<svg onload", "</script><svg"):
        assert raw not in text, raw
    assert html.escape(shown(NAME)) in text  # the name is there, as text
    assert len(re.findall(r"<script\b", text)) == text.count("</script>")  # every script is plotly's own
