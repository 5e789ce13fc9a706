"""Pure transforms from the incident state to what the widgets show (no widgets here). Every text
that came from a process or a recording goes through ``shown()``: it is data, never terminal control."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text

from fdtrace.advice.change import AT_START, Change, LimitPlace, fd_limit_change, near_limit
from fdtrace.advice.fixes import go_exceeded_change, thread_change
from fdtrace.advice.memory import connections_to_hold, memory_change
from fdtrace.advice.needs import need_of
from fdtrace.advice.threads import dns_advice
from fdtrace.display import shown
from fdtrace.integrations.haproxy import NOT_ASKED
from fdtrace.policy import FD_EXHAUSTION_ERRNOS, USAGE_CRITICAL, USAGE_WARN, with_margin
from fdtrace.procfs.threads import describe_state, dns_waiters
from fdtrace.schema.owners import OWNERS
from fdtrace.schema.records import PhaseNow
from fdtrace.tui.state import HaproxyView, LogEntry, ProcessView, SystemView, duration
from fdtrace.units import kib

BAR_WIDTH = 10

#: The per-second rates and totals of a process's detail, named as everywhere else.
RATE_LABELS: dict[str, str] = {"socket": "socket()", "accept": "accept()", "connect": "connect()",
                               "close": "close()", "fd_exhaustion": "EMFILE/ENFILE", "thread_start": "threads started"}
TOTAL_LABELS: dict[str, str] = {
    "socket": "socket()", "accept": "accept()", "connect": "connect()", "close": "close()",
    "fd_error": "EMFILE/ENFILE of other calls (open, pipe, dup, ...)", "thread_start": "threads started",
    "thread_exit": "threads ended", "process_start": "processes started", "process_exec": "execs",
    "process_exit": "ended", "oom_kill": "OOM kills", "go_thread_limit": "Go thread limit exceeded"}


def usage_style(usage: float | None) -> str:
    """Green below 80 %, amber from 80 %, red from 95 %."""
    if usage is None:
        return "dim"
    if usage >= USAGE_CRITICAL:
        return "bold red"
    if usage >= USAGE_WARN:
        return "dark_orange"
    return "green"


def fd_bar(view: ProcessView) -> Text:
    """"1234/4096 ████░░░░░░" coloured by how full the FD table is."""
    if view.open_fds is None:
        return Text("-", style="dim")
    limit = "∞" if view.fd_soft_limit is None else str(view.fd_soft_limit)
    usage = view.usage or 0.0
    filled = min(BAR_WIDTH, round(usage * BAR_WIDTH))
    text = Text(f"{view.open_fds}/{limit} ".rjust(12))
    text.append("█" * filled + "░" * (BAR_WIDTH - filled), style=usage_style(view.usage))
    return text


def size(value: float) -> str:
    """Bytes, short: 149M, 1.2G, 512K."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= scale:
            shown_value = value / scale
            return f"{shown_value:.1f}{unit}" if shown_value < 10 else f"{shown_value:.0f}{unit}"
    return f"{value:.0f}B"


MEMORY_BAR = 5


def memory_bar(view: ProcessView) -> Text:
    """"149M ████▉" : its memory cgroup's usage, the bar coloured by how near its limit; its RSS,
    dim, where no cgroup limits it."""
    usage = view.memory_usage
    if usage is None or view.memcg_usage is None:
        return Text("-" if view.rss_kb is None else size(view.rss_kb * 1024).rjust(5), style="dim")
    filled = min(MEMORY_BAR, round(usage * MEMORY_BAR))
    text = Text(f"{size(view.memcg_usage):>5} ")
    text.append("█" * filled + "░" * (MEMORY_BAR - filled), style=usage_style(usage))
    return text


def rate(value: float) -> str:
    """A per-second rate, short."""
    if value <= 0:
        return "·"
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def exhaustion_cell(view: ProcessView) -> Text | str:
    """EMFILE/ENFILE of any call so far, and their rate now: "38679 12k/s"."""
    if not view.fd_exhaustion_errors:
        return "·"
    per_s = view.rates.get("fd_exhaustion", 0.0)
    return Text(f"{view.fd_exhaustion_errors}" + (f" {rate(per_s)}/s" if per_s > 0 else ""), style="bold red")


def fresh_status(status: str, age_s: float | None, interval_s: float) -> str:
    """A live view's status with its data's age: "live, ..." while the data is newer than the
    interval, "data 12 s old, ..." once it is older (or "waiting for data" before any)."""
    live, sep, rest = status.partition("live")
    if sep == "" or live:
        return status
    if age_s is None:
        return "waiting for data" + rest
    if age_s <= max(interval_s, 1.0):
        return status
    return f"data {age_s:.0f} s old" + rest


def round_note(cost_s: float, unsampled: int) -> str:
    """What the header says of a live source's last /proc round: nothing while it sampled every
    process it meant to; else what it took and how many it left for later rounds."""
    if not unsampled:
        return ""
    return f"/proc round {cost_s:.1f} s, {unsampled:,} processes left for later"


def system_line(system: SystemView, status: str, sort: str, frozen: bool, text_filter: str = "") -> Text:
    """The header line: the filter when one is on (first: the table shows only what it matches),
    the system FD table, OOM kills, event rate, losses and the feed's state."""
    text = Text()
    if text_filter.strip():
        text.append(f" FILTER {shown(text_filter.strip())} (escape clears) ", style="bold reverse")
        text.append("  │  ")
    if system.file_nr is not None and system.file_max:
        share = system.file_nr / system.file_max
        text.append(f"file-nr {system.file_nr:,} / {system.file_max:,} ({share:.1%})", style=usage_style(share))
    else:
        text.append("file-nr -", style="dim")
    text.append("  │  ")
    text.append(f"OOM kills {system.oom_kills}", style="bold red" if system.oom_kills else "")
    text.append(f"  │  {system.events_per_s:,.0f} events/s  │  ")
    lost = f"lost {system.losses:,}" + (f" ({system.loss_detail})" if system.loss_detail else "") + \
        (f"; {system.exact}" if system.exact else "")
    text.append(lost, style="bold red" if system.losses else "green")
    text.append(f"  │  {shown(status)}  │  sort: {sort}")
    if frozen:
        text.append("  │  FROZEN", style="bold reverse")
    return text


def haproxy_line(views: list[HaproxyView], now_ns: int) -> Text:
    """One line per HAProxy stats socket: connections against maxconn, FD limits, rate, alert."""
    text = Text()
    for i, view in enumerate(views):
        if i:
            text.append("\n")
        text.append(f"haproxy {shown(view.socket)}: ", style="bold")
        row = view.row
        if view.error is not None:
            said = shown(view.error) if view.error.startswith(NOT_ASKED) else f"does not answer ({shown(view.error)})"
            text.append(said, style="bold red" if row else "dark_orange")
            if not row:
                continue
            ago = (now_ns - view.answered_ns) / 1e9 if view.answered_ns is not None else None
            text.append(f"; its last answer{f', {ago:.0f} s ago' if ago is not None else ''}: ", style="dim")
        usage = view.usage
        text.append(shown(f"{row.get('curr_conns')}/{row.get('maxconn')} connections"), style=usage_style(usage))
        if usage is not None:
            text.append(f" ({usage:.0%})", style=usage_style(usage))
        text.append(shown(f"  Ulimit-n {row.get('ulimit_n')}  Maxsock {row.get('maxsock')}  "
                          f"{row.get('conn_rate')} conn/s"))
        busy = view.busy_for_s(now_ns)
        if busy > 0:
            text.append(f"  above 90 % for {busy:.0f} s", style="bold red" if view.alerted else "dark_orange")
    return text


#: A rank in one phase for this long is shown amber, then red: a stalled all-reduce or checkpoint.
PHASE_SLOW_S, PHASE_STUCK_S = 10.0, 60.0


def phases_line(phases: dict[int, PhaseNow], now_ns: int) -> Text:
    """One line per training job under `fdtrace run`: each rank's step and current phase, and
    for how long it has been in it."""
    text = Text()
    ordered = sorted(phases.values(), key=lambda p: (p.rank if p.rank is not None else 1 << 30, p.pid))
    for i, now in enumerate(ordered):
        if i:
            text.append("  │  ")
        rank = f"rank {now.rank}" if now.rank is not None else "no rank"
        text.append(f"{rank} ", style="bold")
        text.append(f"pid {now.pid} step {now.step} ")
        held_s = max(0.0, (now_ns - now.since_wall_ns) / 1e9)
        style = "bold red" if held_s >= PHASE_STUCK_S else "dark_orange" if held_s >= PHASE_SLOW_S else ""
        text.append(f"{shown(now.label)} {held_s:.1f}s", style=style)
    return text


def position_bar(start_ns: int, end_ns: int, now_ns: int, failures_ns: Any, width: int, incident: str = "") -> Text:
    """Replay's position: the recording's span as a bar ``width`` cells wide, the part played
    filled, each incident (EMFILE/ENFILE, OOM kill, Go thread limit, crash) marked where it
    began, the times at both ends and now, and the incident the last jump reached."""
    left = time.strftime("%H:%M:%S", time.gmtime(start_ns / 1e9))
    right = time.strftime("%H:%M:%S", time.gmtime(end_ns / 1e9))
    now = min(max(now_ns, start_ns), end_ns)
    label = f" {time.strftime('%H:%M:%S', time.gmtime(now_ns / 1e9))} UTC"  # past the end, time goes on
    if incident:
        label += f" │ {shown(incident)}"
    cells = max(10, width - len(left) - len(right) - len(label) - 4)
    span = max(end_ns - start_ns, 1)

    def cell(at_ns: int) -> int:
        return min(cells - 1, max(0, int((at_ns - start_ns) / span * cells)))
    marked = {cell(int(t)) for t in failures_ns}
    played = cell(now) if now_ns < end_ns else cells - 1
    text = Text(f"{left} ", style="dim")
    for i in range(cells):
        if i in marked:
            text.append("▲", style="bold red")
        elif i == played:
            text.append("●", style="bold")
        else:
            text.append("━" if i < played else "─", style="cyan" if i < played else "dim")
    text.append(f" {right}", style="dim")
    text.append(label, style="bold")
    return text


def log_line(entry: LogEntry) -> Text:
    """One event log line."""
    stamp = time.strftime("%H:%M:%S", time.gmtime(entry.time_ns / 1e9))
    text = Text(f"{stamp} ", style="dim")
    # a process is named by its pid; a line of no known process (pid 0) is never "[0]"
    text.append(f"{shown(entry.comm)}[{entry.pid}] " if entry.pid > 0 else f"{shown(entry.comm)} ", style="bold")
    text.append(shown(entry.text), style="red" if entry.severity == "error" else "dark_orange")
    return text


def chart_title(name: str, points: list[int], limit: int | None = None) -> str:
    """A chart's label with its scale: first and last value, range, and the limit if any."""
    if not points:
        return f"{name}: no samples yet"
    title = f"{name}: {points[0]} -> {points[-1]} (min {min(points)}, max {max(points)}"
    return title + (f", soft limit {limit})" if limit is not None else ")")


def process_detail(view: ProcessView, boot_wall_ns: int | None = None,
                   site_names: dict[int, str] | None = None) -> Text:
    """The detail screen's text for one process (``site_names``: call sites by stack id)."""
    site_names = site_names or {}
    text = Text()
    text.append(f"{shown(view.comm)} [{view.pid}]\n", style="bold")
    if view.start_ns is not None and boot_wall_ns is not None:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime((boot_wall_ns + view.start_ns) / 1e9))
        text.append(f"started {started} UTC\n", style="dim")
    elif view.start_ns is not None:
        text.append(f"started {view.start_ns / 1e9:.2f} s after boot\n", style="dim")
    cgroup, unit, container, runtime, pod = (*view.placement, None, None, None, None, None)[:5]
    if cgroup:
        placed = [f"cgroup {cgroup}"] + ([f"unit {unit}"] if unit else [])
        placed += [f"container {container[:12]} ({runtime or 'unknown runtime'})"] if container else []
        placed += [f"pod {pod}"] if pod else []
        text.append(shown("  ".join(placed)) + "\n", style="dim")
    if view.ended:
        text.append(f"ended: {shown(view.ended)}\n", style="bold red")
    if view.oom_killed:
        text.append("OOM-killed" + (f"; last seen: {view.last_state}" if view.last_state else "") + "\n",
                    style="bold red")
    text.append(limits_line(view))
    if view.usage is not None:
        text.append(f"({view.usage:.0%})", style=usage_style(view.usage))
    text.append(f"\nheadroom {view.headroom if view.headroom is not None else '-'}  "
                f"full in {duration(view.seconds_to_exhaustion())}  sockets {view.sockets or '-'}  "
                f"threads {view.threads or '-'}\n")
    text.append(memory_detail(view))
    if view.rank_sockets:
        owners = view.descriptors_by_owner()
        text.append("descriptors by owner: ", style="bold")
        text.append("  ".join(f"{OWNERS[o]} {n}" for o, n in owners.items() if n) + "\n")
    if view.thread_limit is not None:
        kind, count, limit = view.thread_limit
        share = count / limit if limit else None
        text.append(f"thread limit: {kind}, {count} of {limit} ", style="")
        text.append(f"({share:.0%})" if share is not None else "", style=usage_style(share))
        if kind == "Go default" and view.go_limit_unread:
            text.append(f"  (its own limit could not be read: {shown(view.go_limit_unread)}; a lower one set by "
                        "debug.SetMaxThreads shows when the runtime says it was exceeded)", style="dim")
        text.append("\n")
    if view.go_thread_limit is not None:
        text.append(f"the Go runtime said: program exceeds {view.go_thread_limit}-thread limit (it exits 2)\n",
                    style="bold red")
    threads = thread_recommendation(view)
    if threads is not None:
        text.append("what to change (threads): ", style="bold")
        text.append(shown(threads.command) + "\n", style="bold red")
    if view.destinations:
        busiest = sorted(view.destinations.items(), key=lambda item: (-item[1][0], item[0]))[:5]
        text.append("connect() destinations: ")
        for i, (where, (calls, failed)) in enumerate(busiest):
            text.append(", " if i else "")
            text.append(f"{shown(where)} ×{calls}")
            if failed:
                text.append(f" ({failed} failed)", style="bold red")
        text.append("\n")
    text.append("\nper second: " + "  ".join(f"{RATE_LABELS.get(k, k)} {rate(v)}" for k, v in view.rates.items())
                + "\n")
    text.append("totals: " + "  ".join(f"{TOTAL_LABELS.get(k, k)} {n}" for k, n in sorted(view.totals.items()))
                + "\n")
    if view.errors:
        text.append("\nfailed calls by syscall (EMFILE/ENFILE in red):\n", style="bold")
        for (syscall, errno), count in view.errors.most_common(12):
            style = "bold red" if errno in FD_EXHAUSTION_ERRNOS else ""
            text.append(f"  {shown(syscall):<14} {shown(errno):<14} {count}\n", style=style)
    if view.census:
        text.append("\nthreads now: ", style="bold")
        text.append(shown("; ".join(describe_state(state) for state in view.census[:4])) + "\n")
        advice = dns_advice(view.thread_limit is not None and view.thread_limit[0].startswith("Go"))
        if advice and dns_waiters(view.census):
            text.append(f"{dns_waiters(view.census)} threads wait on DNS: {advice}\n", style="bold")
        to_limit = view.seconds_to_thread_limit()
        if to_limit is not None:
            text.append(f"threads reach their limit in {duration(to_limit)} at the growth of the last minute\n",
                        style="bold red")
    if view.fd_sites:
        text.append("\nopen descriptors by call site (--stacks):\n", style="bold")
        for key, (count, growth) in sorted(view.fd_sites.items(), key=lambda item: -item[1][0])[:5]:
            where = "(from before tracing)" if key is None else site_names.get(key, "(stack not read yet)")
            trend = "" if growth is None else f"  {growth:+.0f}/min"
            text.append(f"  {count:>7}{trend:<10}  {shown(where)}\n")
    change = fd_recommendation(view)
    if change is not None:
        text.append("\nwhat to change: ", style="bold")
        text.append(shown(change) + "  (d: doctor's checks of this process)\n", style="bold red")
    if view.alerts:
        text.append("\nalerts: " + shown(", ".join(view.alerts)) + "\n", style="bold red")
    return text


def limits_line(view: ProcessView) -> str:
    """Its open FDs and limits; "unknown" for a process no /proc round sampled (unknown is not
    unlimited: a None limit of a sampled process is RLIM_INFINITY)."""
    if not view.sampled:
        return ("\nopen FDs -  soft limit unknown  hard limit unknown  (not sampled: it lived between /proc "
                "rounds, or was not among the processes sampled)  ")
    soft = "unlimited" if view.fd_soft_limit is None else view.fd_soft_limit
    hard = "unlimited" if view.fd_hard_limit is None else view.fd_hard_limit
    return f"\nopen FDs {view.open_fds if view.open_fds is not None else '-'}  soft limit {soft}  hard limit {hard}  "


def memory_detail(view: ProcessView) -> Text:
    """Its memory: RSS and its split, its cgroup's usage against the limit and when it is full, the
    memory a connection costs, what its connections need and what to change
    (``advice.memory.memory_change``, rendered as doctor and the report render it)."""
    text = Text()
    if view.rss_kb is None and view.memcg_usage is None:
        return text
    anon, file, shmem = view.rss_split
    if view.rss_kb is not None:
        text.append(f"memory: RSS {kib(view.rss_kb * 1024)} (anon {kib((anon or 0) * 1024)}, file "
                    f"{kib((file or 0) * 1024)}, shmem {kib((shmem or 0) * 1024)})  ")
    usage = view.memory_usage
    if usage is not None and view.memcg_usage is not None and view.memcg_limit is not None:
        text.append(f"cgroup {kib(view.memcg_usage)} of {kib(view.memcg_limit)} ")
        text.append(f"({usage:.0%})", style=usage_style(usage))
        text.append(f"  full in {duration(view.seconds_to_memory_limit())}")
    else:
        text.append("no memory cgroup limit", style="dim")
    text.append("\n")
    fit = view.memory_fit()
    connections, what = memory_connections(view) if fit is not None else (None, "")
    unit = view.placement[1] if len(view.placement) > 1 else None
    said = memory_change(view.comm, view.memcg_limit, view.memcg_peak, fit, connections, what, unit)
    if said.why:
        text.append(shown(said.why if said.need is not None else f"memory {said.why}") + "\n")
    if said.change is not None:
        text.append("what to change (memory): ", style="bold")
        text.append(shown(said.change.command) + "\n", style="bold red")
    return text


def thread_recommendation(view: ProcessView) -> Change | None:
    """The advice layer's change of the thread limit binding a process (``advice.fixes``), as
    doctor and the report render it: above the limit a Go program said it exceeded, else the
    peak with the margin of a limit it nears (TasksMax in its unit's [Service] for pids.max)."""
    if view.go_thread_limit is not None:
        return go_exceeded_change(view.go_thread_limit)
    if view.thread_limit is None:
        return None
    kind, count, limit = view.thread_limit
    if not near_limit(count, limit):
        return None
    unit = view.placement[1] if len(view.placement) > 1 else None
    return thread_change(kind, count, limit, unit)


def memory_connections(view: ProcessView) -> tuple[int | None, str]:
    """How many connections a process must hold, as the report counts them
    (``advice.memory.connections_to_hold``): HAProxy's maxconn, else the FD limit the needs
    model recommends for it."""
    peak = view.peak_fds if view.peak_fds is not None else view.open_fds
    need, _ = need_of(view.fd_soft_limit, peak, view.emfile, view.emfile_worst_second, view.maxsock,
                      maxsock_from=view.maxsock_from)
    return connections_to_hold(view.maxconn, with_margin(need) if need else None)


def fd_recommendation(view: ProcessView) -> str | None:
    """The RLIMIT_NOFILE to set for a process that failed with EMFILE or nears its limit: the one
    needs model (``need_of``) and the advice layer's change (``advice.change``) that doctor,
    info and the report render, on what the view saw: set where the limit in force was set (an
    haproxy's ulimit-n in its configuration), then prlimit for now."""
    soft = view.fd_soft_limit
    peak = view.peak_fds if view.peak_fds is not None else view.open_fds
    need, basis = need_of(soft, peak, view.emfile, view.emfile_worst_second, view.maxsock,
                          maxsock_from=view.maxsock_from)
    if not view.emfile and not near_limit(need, soft):
        return None
    config = view.limit_config
    place = LimitPlace("haproxy", config[1]) if config is not None and config[0] == soft else AT_START
    change = fd_limit_change(need, basis, soft, view.fd_hard_limit, place)
    if change is None:
        return None
    hard = "unlimited" if view.fd_hard_limit is None else max(change.value, view.fd_hard_limit)
    return (f"RLIMIT_NOFILE soft limit {change.value} (needed {need}: {basis}; now "
            f"{soft if soft is not None else 'unlimited'}): {change.command}; now: prlimit --pid "
            f"{view.pid} --nofile={change.value}:{hard}")
