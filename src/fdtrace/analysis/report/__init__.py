"""`fdtrace report`: one self-contained HTML file (or Markdown) a postmortem reader can open
without Python: summary, the limits to change, timeline, spikes, headroom, incidents and losses.

Three parts: ``model`` computes the sections from a recording into a typed ``Report``,
``advice`` holds the rules of what to change and their words (shared with ``info`` and
doctor), and ``render`` (with its Plotly charts in ``charts``) writes HTML or Markdown. The
rendering is imported on first use, so that doctor's use of the advice does not load Plotly."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fdtrace.analysis.report.advice import fd_advice, go_limit_advice, listen_advice, recommendations
from fdtrace.analysis.report.model import EVENT_COLUMNS, Report, build, spike_calls, thread_panel

if TYPE_CHECKING:
    from fdtrace.analysis.report.render import SECTIONS, first_failure, to_html, to_markdown

__all__ = ["EVENT_COLUMNS", "SECTIONS", "Report", "build", "fd_advice", "first_failure", "go_limit_advice",
           "listen_advice", "recommendations", "spike_calls", "thread_panel", "to_html", "to_markdown"]

_RENDERED = frozenset({"SECTIONS", "first_failure", "to_html", "to_markdown"})


def __getattr__(name: str) -> Any:
    """The rendering's names, imported when first asked for (PEP 562)."""
    if name in _RENDERED:
        from fdtrace.analysis.report import render

        return getattr(render, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
