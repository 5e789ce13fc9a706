"""`fdtrace leaks` and `fdtrace threads`: which code holds a process's descriptors, and what its
threads are doing (live, or from a recording made with --stacks)."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import click

from fdtrace.cli.common import check_trace_options, fail, note, run, say, start
from fdtrace.display import shown
from fdtrace.errors import FdtraceError

#: How many frames under a site the text output shows.
SHOWN_FRAMES = 6


def _check_pid(pid: int) -> str:
    """The process's name, or a one-line error when it does not exist."""
    from fdtrace.procfs import ProcFS
    from fdtrace.procfs.reader import READ_ERRORS

    try:
        return ProcFS().read_bytes(pid, "comm", 64).decode(errors="replace").removesuffix("\n")
    except READ_ERRORS:
        fail(FdtraceError(f"no process {pid}"))


@dataclass
class Window:
    """The span a process was traced for: wall times (s), and what ended it ("duration",
    "process ended" or "signal")."""

    asked_s: float
    start: float
    end: float
    stopped_by: str

    @property
    def seconds(self) -> float:
        """How long it lasted."""
        return max(0.0, self.end - self.start)

    def words(self, pid: int) -> str:
        """The window for people: its length, its wall times, and why it ended when not by --duration."""
        def clock(at: float) -> str:
            return time.strftime("%H:%M:%S", time.gmtime(at))
        said = f"the {self.seconds:.1f} s traced ({clock(self.start)} to {clock(self.end)} UTC"
        if self.stopped_by == "process ended":
            return said + f"; process {pid} ended before the --duration {self.asked_s:g} s)"
        if self.stopped_by == "signal":
            return said + f"; stopped before the --duration {self.asked_s:g} s)"
        return said + f", --duration {self.asked_s:g})"

    def as_json(self) -> dict[str, Any]:
        """The window as JSON fields."""
        return {"seconds": round(self.seconds, 3), "start": self.start, "end": self.end,
                "duration_asked": self.asked_s, "stopped_by": self.stopped_by}


def _trace(pid: int, duration: float, interval: float, max_stacks: int, max_fds: int, sample: bool,
           thread_starts: bool = False) -> tuple[Any, Window]:
    """Trace one process with --stacks for ``duration`` seconds (less when it ends or a signal
    stops the tracing); returns the call-sites sink and the window traced. Only failures are
    streamed from the kernel, and thread starts with ``thread_starts``."""
    from fdtrace.kernel.loader import TraceOptions
    from fdtrace.pipeline import Pipeline, Stop
    from fdtrace.sinks.call_sites import CallSitesSink
    from fdtrace.sources.live import LiveOptions, LiveSource

    check_trace_options((pid,), False, 4096, max_stacks, max_fds)
    sites = CallSitesSink()
    source = LiveSource(LiveOptions(
        exiting=True, keep_exited=0, interval_s=interval, sample=sample, top_processes=0,
        trace=TraceOptions(pids=(pid,), errors_only=not thread_starts, ring_pages=1024, stacks=True,
                           max_stacks=max_stacks, max_fds=max_fds)))
    from fdtrace.procfs import ProcFS

    procfs = ProcFS()
    gone = Stop(duration, condition=lambda: not procfs.exists(pid))
    pipeline = Pipeline(source, [sites])
    start(pipeline)
    note(f"tracing pid {pid} for {duration:g} s; Ctrl-C to stop sooner")
    began = time.time()
    run(pipeline, gone)
    window = Window(duration, began, time.time(), "signal" if gone.signalled is not None else "duration")
    if not procfs.exists(pid):  # its end is the moment that matters: what it held then
        how = sites.endings.get(pid, "exited")
        when = "" if sites.start_ns is None or pid not in sites.exits else \
            f" {max(0.0, (sites.exits[pid] - sites.start_ns) / 1e9):.1f} s into the tracing"
        note(f"process {pid} ended{when} ({how}): what follows is what was traced up to its end")
        if window.stopped_by == "duration" and window.seconds < duration:
            window.stopped_by = "process ended"
    return sites, window


def _name_problems(loaded: Any) -> None:
    """Say on stderr what the reader of a recording left out or changed."""
    from fdtrace.analysis.summary import named_problems

    for line in named_problems(loaded):
        note(line)


def _losses_line(losses: dict[str, int]) -> str:
    lost = {name: n for name, n in losses.items() if n}
    return "lost: nothing" if not lost else "lost: " + ", ".join(f"{name} {n}" for name, n in sorted(lost.items()))


def _plain(value: Any) -> Any:
    """A table's value as JSON has it: integers as integers, a missing value (NaN, NA, NaT) as null."""
    if (isinstance(value, float) and math.isnan(value)) or type(value).__name__ in ("NAType", "NaTType"):
        return None
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _records(frame: Any) -> list[dict[str, Any]]:
    return [{k: _plain(v) for k, v in row.items()} for row in frame.to_dict("records")]


def _age(value: Any) -> str:
    if _plain(value) is None:
        return "-"
    seconds = float(value)
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}min"
    return f"{seconds / 3600:.1f}h"


def _number(value: Any) -> str:
    return "-" if _plain(value) is None else str(int(value))


def print_leaks(table: Any, header: str, losses: dict[str, int]) -> None:
    """The leak report in text: one block per site, most open first."""
    say(header)
    if not len(table):
        say("no descriptors made during the tracing are still open")
    else:
        say(f"{'OPEN':>7} {'OPENED':>7} {'CLOSED':>7} {'OLDEST':>7} {'GROWTH/MIN':>10}  SITE")
        for row in table.to_dict("records"):
            growth = row["growth_per_min"]
            trend = "-" if _plain(growth) is None else f"{growth:+.1f}"
            say(f"{row['open']:>7} {_number(row['opened']):>7} {_number(row['closed']):>7} "
                       f"{_age(row['oldest_age_s']):>7} {trend:>10}  {shown(row['site'])}")
            frames = list(row["frames"] or [])
            for frame in frames[:SHOWN_FRAMES]:
                say(f"{'':>44}at {shown(frame)}")
            if len(frames) > SHOWN_FRAMES:
                say(f"{'':>44}... {len(frames) - SHOWN_FRAMES} more frames")
            if isinstance(row["truncated"], str) and row["truncated"]:
                say(f"{'':>44}(stack may be incomplete: {row['truncated']})")
    say(_losses_line(losses))


@click.command()
@click.option("--pid", type=int, default=None, help="The process to trace (live), or to pick from --from.")
@click.option("--from", "recording", type=click.Path(exists=True, file_okay=False), default=None,
              help="Report from a recording made with --stacks instead of tracing now.")
@click.option("--duration", type=float, default=10.0, show_default=True, help="Seconds to trace (live).")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds between sweeps (live).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
@click.option("--max-stacks", type=int, default=16384, show_default=True, help="Distinct stacks kept.")
@click.option("--max-tracked-fds", "max_fds", type=int, default=262144, show_default=True,
              help="Descriptors remembered at once.")
def leaks(pid: int | None, recording: str | None, duration: float, interval: float, as_json: bool, max_stacks: int,
          max_fds: int) -> None:
    """Which call sites made a process's descriptors that are still open.

    Live (--pid): traces the process for --duration with stacks, then lists its open descriptors
    made meanwhile, grouped by the code that made them, with their count, oldest age and growth
    per minute; those older than the tracing are counted apart. Sites whose descriptors were all
    closed again are not listed.
    """
    if recording is not None:
        from fdtrace.analysis import leaks as recorded_leaks
        from fdtrace.analysis import load

        try:
            loaded = load(recording, columns={"events": ["ts_ns"]})
        except FdtraceError as error:
            fail(error)
        _name_problems(loaded)
        table = recorded_leaks(loaded, pid=pid)
        losses = {} if not len(loaded.losses) else {
            c[:-len("_total")]: int(loaded.losses[c].max()) for c in loaded.losses.columns
            if c.endswith("_total") and loaded.losses[c].notna().any()}
        if loaded.fd_sites is None or not len(loaded.fd_sites):
            fail(FdtraceError(f"{recording} has no call sites: record with --stacks"))
        _emit_leaks(table, f"fdtrace leaks: {recording}" + (f", pid {pid}" if pid else ""), losses, as_json,
                    {"recording": recording, "pid": pid})
        return
    if pid is None:
        fail(FdtraceError("give --pid PID (trace it now) or --from RECORDING"))
    if duration <= 0 or interval <= 0:
        fail(FdtraceError("--duration and --interval must be positive"))
    comm = _check_pid(pid)
    sites, _ = _trace(pid, duration, interval, max_stacks, max_fds, sample=False)
    table = sites.leaks(pid)
    traced = table[table["site"] != "(from before tracing)"]["open"].sum() if len(table) else 0
    header = (f"fdtrace leaks: pid {pid} ({shown(comm)}), traced {sites.traced_s:.1f} s: {traced} descriptors "
              "made then are still open")
    _emit_leaks(table, header, sites.losses, as_json, {"pid": pid, "comm": comm, "traced_s": sites.traced_s})


def _emit_leaks(table: Any, header: str, losses: dict[str, int], as_json: bool, about: dict[str, Any]) -> None:
    if as_json:
        json.dump({**about, "sites": _records(table), "losses": losses}, sys.stdout)
        sys.stdout.write("\n")
    else:
        print_leaks(table, header, losses)


@click.command()
@click.option("--pid", type=int, default=None, help="The process (live), or to pick from --from.")
@click.option("--from", "recording", type=click.Path(exists=True, file_okay=False), default=None,
              help="The census recorded over time (and thread creation sites, with --stacks).")
@click.option("--stacks", is_flag=True, help="Also trace thread creation for --duration and group it by stack.")
@click.option("--duration", type=float, default=10.0, show_default=True, help="Seconds to trace with --stacks.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
def threads(pid: int | None, recording: str | None, stacks: bool, duration: float, as_json: bool) -> None:
    """What a process's threads are doing: a census by the syscall each is blocked in (and, for
    a descriptor, what kind of file), with the process's thread limits; with --stacks, where
    the threads it starts meanwhile are created."""
    if recording is not None:
        _recorded_threads(recording, pid, as_json)
        return
    if pid is None:
        fail(FdtraceError("give --pid PID (look now) or --from RECORDING"))
    comm = _check_pid(pid)
    sites = None
    traced = None
    window = None
    if stacks:
        if duration <= 0:
            fail(FdtraceError("--duration must be positive"))
        traced, window = _trace(pid, duration, 1.0, 16384, 1, sample=True, thread_starts=True)
        sites = traced.thread_sites(pid)
    from fdtrace.advice.threads import dns_advice
    from fdtrace.kernel.stacks import BlockedCode
    from fdtrace.kernel.syscalls import syscall_name
    from fdtrace.procfs import ProcessAccessDeniedError, ProcessGoneError, ProcFS
    from fdtrace.procfs.sampler import ProcSampler
    from fdtrace.procfs.thread_limits import binding_limit
    from fdtrace.procfs.threads import describe_state, dns_waiters, thread_census

    blocked_code = BlockedCode()
    blocked_code.begin()
    try:
        census = thread_census(ProcFS(), pid, syscall_name, site_of=blocked_code)
    except ProcessGoneError:
        if traced is None:
            fail(FdtraceError(f"process {pid} is gone"))
        # it ended while traced: its last census before the end (none when it ended before the first)
        census = traced.census[pid].states if pid in traced.census else []
    except ProcessAccessDeniedError:
        fail(FdtraceError(f"no access to the threads of process {pid}: run as root"))
    sample = ProcSampler().sample(pid)
    limit = binding_limit(sample) if sample is not None else None
    total = sum(state.threads for state in census)
    python = blocked_code.python_stacks(pid)
    if as_json:
        out: dict[str, Any] = {
            "pid": pid, "comm": comm, "threads": total,
            "limit": None if limit is None else {"name": limit[0], "count": limit[1], "limit": limit[2]},
            "census": [{"syscall": s.syscall, "fd_kind": s.fd_kind, "site": s.site, "threads": s.threads}
                       for s in census]}
        if python is not None:
            out["python"] = {"version": ".".join(map(str, python.version or ())), "frames_unread": python.unread}
        out["unread"] = blocked_code.shortfalls()
        if sites is not None and window is not None:
            out["creation_sites"] = _records(sites)
            out["window"] = window.as_json()
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
        return
    limit_text = "no thread limit applies" if limit is None else \
        f"{limit[0]} limit {limit[2]}: {limit[1]} counted ({100 * limit[1] / max(limit[2], 1):.0f} %)"
    if not census and traced is not None:
        say(f"pid {pid} ({shown(comm)}): ended before its threads were read")
    else:
        say(f"pid {pid} ({shown(comm)}): {total} threads; {limit_text}")
    for state in census:
        say(f"  {shown(describe_state(state))}")
    if python is not None and python.unread:
        say(f"  ({shown(python.unread)}: the sites above are the interpreter's C code)")
    for text in blocked_code.shortfalls():
        say(f"  (left unread: {text})")
    go = sample is not None and sample.go_max_threads is not None  # the sampler knows a Go program
    advice = dns_advice(go) if dns_waiters(census) else None
    if advice:
        say(f"{dns_waiters(census)} threads wait on DNS: {advice}")
    if sites is not None and window is not None:
        _print_thread_sites(sites, window, pid)


def _print_thread_sites(sites: Any, window: Window, pid: int) -> None:
    if not len(sites):
        say(f"no thread started during {window.words(pid)}")
        return
    say(f"threads started in {window.words(pid).removeprefix('the ')}, by creating site:")
    for row in sites.to_dict("records"):
        say(f"{row['threads']:>7}  {shown(row['site'])}")
        if row.get("reason"):
            pointer = " (their code: the census above)" if "blocked in a syscall" in row["reason"] else ""
            say(f"{'':>9}why: {shown(row['reason'])}{pointer}")
        for frame in list(row["frames"])[:SHOWN_FRAMES]:
            say(f"{'':>9}at {shown(frame)}")


def _recorded_threads(recording: str, pid: int | None, as_json: bool) -> None:
    from fdtrace.analysis import load, thread_sites
    from fdtrace.analysis import threads as census_over_time
    from fdtrace.procfs.threads import describe_state
    from fdtrace.schema.records import ThreadState

    try:
        loaded = load(recording)
    except FdtraceError as error:
        fail(error)
    _name_problems(loaded)
    census = census_over_time(loaded, pid=pid)
    sites = thread_sites(loaded, pid=pid)
    if as_json:
        census_out = census.assign(time=census["time"].astype(str)) if len(census) else census
        sites_out = sites.assign(first=sites["first"].astype(str), last=sites["last"].astype(str)) \
            if len(sites) else sites
        json.dump({"recording": recording, "pid": pid, "census": _records(census_out),
                   "creation_sites": _records(sites_out)}, sys.stdout)
        sys.stdout.write("\n")
        return
    if not len(census) and not len(sites):
        fail(FdtraceError(f"{recording} has no thread census" + (f" of pid {pid}" if pid else "")))
    for (host, process), rows in census.groupby(["host", "pid"], sort=True, observed=True):
        peak_time = rows.groupby("time")["threads"].sum().idxmax()
        last_time = rows["time"].max()
        for label, when in (("at its most threads", peak_time), ("last", last_time)):
            at = rows[rows["time"] == when]
            say(f"{shown(host)} pid {process} ({shown(at['comm'].iloc[0])}), {label} ({when}): "
                       f"{int(at['threads'].sum())} threads")
            for row in at.itertuples(index=False):
                state = ThreadState(row.syscall, None if row.fd_kind is None or row.fd_kind != row.fd_kind
                                    else row.fd_kind, int(row.threads),
                                    row.site if isinstance(row.site, str) else None)
                say(f"  {shown(describe_state(state))}")
            if peak_time == last_time:
                break
    if len(sites):
        say("threads started, by creating site:")
        for row in sites.to_dict("records"):
            say(f"{row['threads']:>7}  {shown(row['site'])}  (pid {row['pid']} {shown(row['comm'])})")
