"""The process columns, declared once: each column's key, header, width, cell, sort order and help
line. `top`'s table, its sort orders (s, a click on a header), its help screen and the fleet view's
process table are all derived from ``COLUMNS`` (no widgets here: Textual is not imported)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from fdtrace.display import shown
from fdtrace.sources.prometheus_fleet import HostRow, ProcessRow
from fdtrace.tui.adapters import exhaustion_cell, fd_bar, memory_bar, rate, usage_style
from fdtrace.tui.state import ProcessView, duration, headroom_key

#: A sort order: from a process to what ranks it, worst (or biggest) first.
Order = Callable[[ProcessView], Any]


@dataclass(frozen=True)
class Sort:
    """One sort order of `top`: its key, what the header calls it, and the order."""

    key: str
    label: str
    order: Order


@dataclass(frozen=True)
class Column:
    """One process column. ``cell`` and ``sort`` are `top`'s (None: not in `top`'s table, or not a
    sort order); ``fleet_cell`` the fleet view's, from a Prometheus process row (None: not there),
    ``fleet_width`` its width there when not ``width``. ``help`` is its line in the help screen
    (None: none), under ``help_label`` when set; ``help_joins`` puts it on the previous line.
    ``more_sorts``: orders that have no column of their own, cycled right after this one's."""

    key: str
    label: str
    width: int
    cell: Callable[[ProcessView], object] | None = None
    sort: Order | None = None
    help: str | None = None
    help_label: str | None = None
    help_joins: bool = False
    fleet_cell: Callable[[ProcessRow], object] | None = None
    fleet_width: int | None = None
    more_sorts: tuple[Sort, ...] = ()


def share(value: float | None) -> Text:
    """A share of a limit, "-" when unknown, coloured as everywhere."""
    return Text("-" if value is None else f"{value:.0%}", style=usage_style(value))


def count(value: float) -> Text | str:
    """A count of a window, red when any ("·" when none)."""
    return Text(f"{value:,.0f}", style="bold red") if value >= 0.5 else "·"


def _memory_key(view: ProcessView) -> tuple[Any, ...]:
    usage = view.memory_usage
    return (usage is None, -(usage or 0.0), -(view.rss_kb or 0), view.pid)


def _by_rate(kind: str) -> Order:
    return lambda v: (-v.rates.get(kind, 0.0), v.pid)


def _exhaustion_key(view: ProcessView) -> tuple[Any, ...]:
    seconds = view.seconds_to_exhaustion()
    return (seconds is None, seconds if seconds is not None else 0.0, view.pid)


def _rate_cell(kind: str) -> Callable[[ProcessView], object]:
    return lambda v: rate(v.rates.get(kind, 0.0))


def _alert_style(view: ProcessView) -> str:
    if view.oom_killed or view.fd_exhaustion_errors:
        return "bold red"
    return "dark_orange" if view.alerts else "dim"


def _state_cell(view: ProcessView) -> Text:
    """Its alerts, then how it ended."""
    parts = [", ".join(view.alerts)] if view.alerts else []
    if view.ended:
        parts.append(view.ended)
    return Text(shown("; ".join(parts)), style=_alert_style(view))


def _fleet_fds(process: ProcessRow) -> str:
    if process.open_fds is None:
        return "-"
    return f"{process.open_fds:.0f}/{process.fd_soft_limit:.0f}" if process.fd_soft_limit else f"{process.open_fds:.0f}"


def _fleet_limit(process: ProcessRow) -> str:
    if process.thread_limit is None:
        return "-"
    return shown(f"{process.thread_used or 0:.0f}/{process.thread_limit:.0f} ({process.thread_limit_kind})")


def _optional(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


HEADROOM = Sort("headroom", "headroom", headroom_key)

#: Every process column, in table order.
COLUMNS: tuple[Column, ...] = (
    Column("pid", "PID", 7, cell=lambda v: str(v.pid), sort=lambda v: v.pid,
           fleet_cell=lambda p: str(p.pid), fleet_width=8),
    Column("comm", "COMM", 15, cell=lambda v: Text(shown(v.comm), style="strike dim" if v.ended else ""),
           sort=lambda v: (v.comm, v.pid), fleet_cell=lambda p: Text(shown(p.comm)), fleet_width=16),
    Column("fds", "FDS / SOFT LIMIT", 22, cell=fd_bar, sort=lambda v: (-(v.open_fds or 0), v.pid),
           help="open FDs against RLIMIT_NOFILE; the bar turns amber at 80 %, red at 95 %",
           fleet_cell=_fleet_fds, fleet_width=16),
    Column("use", "USE", 4, cell=lambda v: Text("-" if v.usage is None else f"{v.usage:.0%}",
                                                 style=usage_style(v.usage)),
           fleet_cell=lambda p: share(p.fd_usage), fleet_width=5),
    Column("mem", "MEM / CGROUP", 12, cell=memory_bar, sort=_memory_key,
           help="its memory cgroup's usage against the limit (same colours); dim: RSS"),
    Column("sockets", "SOCK", 6, cell=lambda v: _optional(v.sockets), sort=lambda v: (-(v.sockets or 0), v.pid)),
    Column("socket_s", "SOCK/s", 6, cell=_rate_cell("socket"), sort=_by_rate("socket"),
           help="calls per second", help_label="SOCK/s ACC/s ..."),
    Column("accept_s", "ACC/s", 6, cell=_rate_cell("accept"), sort=_by_rate("accept")),
    Column("connect_s", "CONN/s", 6, cell=_rate_cell("connect"), sort=_by_rate("connect")),
    Column("close_s", "CLOSE/s", 7, cell=_rate_cell("close"), sort=_by_rate("close")),
    Column("emfile", "EMFILE/ENFILE", 13, cell=exhaustion_cell,
           sort=lambda v: (-v.fd_exhaustion_errors, -sum(v.errors.values()), v.pid),
           help="EMFILE+ENFILE failures of any syscall", help_label="EMFILE", help_joins=True,
           fleet_cell=lambda p: count(p.emfile_recent),
           more_sorts=(Sort("emfile_s", "EMFILE/ENFILE per second", _by_rate("fd_exhaustion")),)),
    Column("threads", "THR", 5, cell=lambda v: _optional(v.threads), sort=lambda v: (-(v.threads or 0), v.pid),
           fleet_cell=lambda p: _optional(p.threads), fleet_width=7),
    Column("threads_s", "THR/s", 5, cell=_rate_cell("thread_start"), sort=_by_rate("thread_start")),
    Column("tte", "FULL IN", 7, cell=lambda v: duration(v.seconds_to_exhaustion()), sort=_exhaustion_key,
           help="time until the soft limit at the FD growth of the last 30 s"),
    Column("state", "ALERTS", 40, cell=_state_cell,
           help="FDs or memory over 80 %, EMFILE/ENFILE, OOM kill, thread bursts, its end"),
    Column("limit", "THREAD LIMIT", 30, fleet_cell=_fleet_limit),
    Column("thr_use", "THR USE", 7, fleet_cell=lambda p: share(p.thread_usage)),
)


def top_columns(columns: Iterable[Column]) -> tuple[Column, ...]:
    """The columns of `top`'s process table, in order."""
    return tuple(c for c in columns if c.cell is not None)


def fleet_columns(columns: Iterable[Column]) -> tuple[Column, ...]:
    """The columns of the fleet view's process table, in order."""
    return tuple(c for c in columns if c.fleet_cell is not None)


def process_cells(view: ProcessView, columns: Iterable[Column]) -> dict[str, object]:
    """`top`'s cells of one process, by column key."""
    return {c.key: c.cell(view) for c in columns if c.cell is not None}


def fleet_cells(process: ProcessRow, columns: Iterable[Column]) -> dict[str, object]:
    """The fleet view's cells of one process, by column key."""
    return {c.key: c.fleet_cell(process) for c in columns if c.fleet_cell is not None}


def sorts(columns: Iterable[Column]) -> dict[str, Sort]:
    """`top`'s sort orders in the order s cycles them: headroom first, then the columns'."""
    found = {HEADROOM.key: HEADROOM}
    for column in top_columns(columns):
        if column.sort is not None:
            found[column.key] = Sort(column.key, column.label, column.sort)
        found.update((more.key, more) for more in column.more_sorts)
    return found


def help_lines(columns: Iterable[Column]) -> str:
    """The help screen's lines of the columns that have one: "  LABEL   what it shows"."""
    lines: list[str] = []
    for column in top_columns(columns):
        if column.help is None:
            continue
        label = column.help_label or column.label
        if column.help_joins and lines:
            lines[-1] += f";  {label}  {column.help}"
        else:
            lines.append(f"  {label:<18} {column.help}")
    return "".join(line + "\n" for line in lines)


@dataclass(frozen=True)
class HostColumn:
    """One column of the fleet view's host table: key, header, width and cell."""

    key: str
    label: str
    width: int
    cell: Callable[[HostRow], object]


def _fullest_cell(host: HostRow) -> Text | str:
    fullest = host.fullest()
    if fullest is None:
        return "-"
    cell = Text(f"{shown(fullest.comm)} [{fullest.pid}] {fullest.open_fds:.0f}/{fullest.fd_soft_limit:.0f} ")
    cell.append_text(share(fullest.fd_usage))
    return cell


def _nearest_thread_limit_cell(host: HostRow) -> Text | str:
    nearest = host.nearest_thread_limit()
    if nearest is None:
        return "-"
    cell = Text(f"{shown(nearest.comm)} [{nearest.pid}] {nearest.thread_used:.0f}/{nearest.thread_limit:.0f} "
                f"({shown(nearest.thread_limit_kind)}) ")
    cell.append_text(share(nearest.thread_usage))
    return cell


#: The fleet view's host table, declared once (its order is the table's).
HOST_COLUMNS: tuple[HostColumn, ...] = (
    HostColumn("host", "HOST", 24, lambda h: Text(shown(h.host))),
    HostColumn("state", "STATE", 6, lambda h: Text("up", style="green") if h.up else Text("DOWN", style="bold red")),
    HostColumn("emfile", "EMFILE/ENFILE", 13, lambda h: count(h.emfile_recent)),
    HostColumn("fds", "FULLEST FD TABLE", 40, _fullest_cell),
    HostColumn("threads", "NEAREST THREAD LIMIT", 44, _nearest_thread_limit_cell),
    HostColumn("oom", "OOM KILLS", 9, lambda h: count(h.oom_kills_recent)),
    HostColumn("lost", "LOST", 8, lambda h: count(h.lost_recent)),
)
