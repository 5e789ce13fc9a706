"""Replay of recordings as a pipeline source: the same updates the live source yields (events,
sampling rounds, losses, phases), in time order, at real speed, faster, slower or paused, with
seeking."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fdtrace.analysis.engines.dataset import ReplayTables, replay_tables
from fdtrace.errors import FdtraceError
from fdtrace.integrations.phases.live import phases_at
from fdtrace.pipeline import Notice, Pipeline, Position
from fdtrace.pipeline.update import Baseline, SampleRound, SourceInfo, Update
from fdtrace.schema import STATS, arrow_schema, codecs
from fdtrace.schema.failures import incident_mask
from fdtrace.schema.records import EventBatch
from fdtrace.schema.tables import PARTITION_COLUMN


def _with_host(events: pa.Table, host: str) -> pa.Table:
    """Put the partition's host back as the column the event model has. Nullable columns that
    a recording of an older fdtrace lacks come back as nulls."""
    schema = arrow_schema()
    host_column = codecs.host_column(host, events.num_rows)
    present = set(events.column_names)
    columns = [host_column if field.name == PARTITION_COLUMN
               else events[field.name].cast(field.type) if field.name in present or not field.nullable
               else pa.nulls(events.num_rows, type=field.type)
               for field in schema]
    return pa.Table.from_arrays(columns, schema=schema)


#: A program's failures with no quiet gap this long between them are one incident (replay's n/N).
INCIDENT_GAP_NS = 10 * 10**9


@dataclass(frozen=True)
class Incidents:
    """A recording's incidents in time order: the wall time of each one's first failure, and
    its name."""

    times_ns: np.ndarray
    labels: list[str]


def _incident_label(row: dict[str, Any], count: int) -> str:
    """An incident's name: "haproxy accept4 EMFILE ×1,891", "java OOM kill", "worker killed by SIGSEGV"."""
    if row.get("errno"):
        what = f"{row.get('syscall') or row.get('kind')} {row['errno']}"
    elif row.get("kind") == "oom_kill":
        what = "OOM kill"
    elif row.get("kind") == "go_thread_limit":
        what = "Go thread limit"
    else:
        what = f"killed by {row.get('signal') or '?'}"
    return f"{row.get('comm') or '?'} {what}" + (f" ×{count:,}" if count > 1 else "")


#: A jump rebuilds the view from this long before its target (the totals before it from the index).
JUMP_WINDOW_NS = 30 * 10**9
#: A jump hands out the sampling rounds of this long before its window too (few rows: the view's
#: charts keep 600 points, ten minutes of 1 s rounds, as they had playing there).
ROUNDS_BEFORE_NS = 600 * 10**9
#: The cumulative index's step: its checkpoints lie on whole multiples of this (whole seconds,
#: so an EMFILE second is never split between the index and the window).
CHECKPOINT_NS = 5 * 10**9
#: Events applied one by one from before a window: ends, OOM kills, Go's thread limit.
LIFECYCLE_KINDS = ("oom_kill", "process_exit", "go_thread_limit")


def _grouped(columns: dict[str, Any], keys: list[str], aggregates: list[tuple[Any, str]]) -> pa.Table:
    table = pa.table(columns)
    return table.group_by(keys, use_threads=False).aggregate(aggregates) if table.num_rows else table


class TotalsIndex:
    """A recording's events summed per ``CHECKPOINT_NS`` step (chunk), once: events per
    (process, kind), failed calls per (process, syscall, errno) with the first's time, EMFILE per
    process in its busiest second, connect() destinations, each process's last event; and where
    the rare events lie. ``baseline(until_ns)`` adds up the chunks before a checkpoint: a jump's
    totals since the start without replaying every event."""

    def __init__(self, events: pa.Table, times: np.ndarray) -> None:
        from fdtrace.schema.events import NOT_FAILURES

        self.events = events
        self.times = times
        first = int(times[0]) // CHECKPOINT_NS * CHECKPOINT_NS
        self.checkpoints = np.arange(first, int(times[-1]) + CHECKPOINT_NS, CHECKPOINT_NS, dtype=np.int64)
        chunk = (np.searchsorted(self.checkpoints, times, side="right") - 1).astype(np.int32)
        pids = events["pid"].cast(pa.int64())
        kinds = events["kind"].cast(pa.string())
        self.kinds = _grouped({"chunk": chunk, "pid": pids, "kind": kinds}, ["chunk", "pid", "kind"],
                              [([], "count_all")])
        self.last_rows = _grouped({"chunk": chunk, "pid": pids, "row": np.arange(len(times), dtype=np.int64)},
                                  ["chunk", "pid"], [("row", "max")])
        errno = pc.fill_null(events["errno"].cast(pa.string()), "")
        failed = pc.invert(pc.is_in(errno, value_set=pa.array(list(NOT_FAILURES)))).to_numpy(zero_copy_only=False)
        rows = np.flatnonzero(failed)
        self.errors = _grouped({"chunk": chunk[rows], "pid": pids.take(rows),
                                "syscall": pc.fill_null(events["syscall"].cast(pa.string()).take(rows), ""),
                                "errno": errno.take(rows), "time": times[rows]},
                               ["chunk", "pid", "syscall", "errno"], [([], "count_all"), ("time", "min")])
        emfile = rows[np.asarray(errno.take(rows).to_numpy(zero_copy_only=False)) == "EMFILE"]
        seconds = _grouped({"chunk": chunk[emfile], "pid": pids.take(emfile), "second": times[emfile] // 10**9},
                           ["chunk", "pid", "second"], [([], "count_all")])
        self.emfile_seconds = seconds if not seconds.num_rows else _grouped(
            {"chunk": seconds["chunk"], "pid": seconds["pid"], "n": seconds["count_all"]}, ["chunk", "pid"],
            [("n", "max")])
        connects = np.flatnonzero(pc.and_(pc.equal(kinds, "connect"),
                                          pc.is_valid(events["peer_port"])).to_numpy(zero_copy_only=False))
        self.connects = _grouped({"chunk": chunk[connects], "pid": pids.take(connects),
                                  "address": events["peer_addr"].cast(pa.string()).take(connects),
                                  "port": events["peer_port"].cast(pa.int64()).take(connects),
                                  "failed": failed[connects]},
                                 ["chunk", "pid", "address", "port", "failed"], [([], "count_all")])
        self.lifecycle = np.flatnonzero(pc.is_in(kinds, value_set=pa.array(LIFECYCLE_KINDS))
                                        .to_numpy(zero_copy_only=False))

    def window_start(self, target_ns: int) -> int:
        """The checkpoint a jump to ``target_ns`` replays from: at least ``JUMP_WINDOW_NS`` before it."""
        at = int(np.searchsorted(self.checkpoints, target_ns - JUMP_WINDOW_NS, side="right")) - 1
        return int(self.checkpoints[max(at, 0)])

    def baseline(self, until_ns: int) -> Baseline:
        """What the events before the checkpoint ``until_ns`` add up to."""
        k = int(np.searchsorted(self.checkpoints, until_ns, side="left"))  # chunks before it: 0 .. k-1
        found = Baseline(until_ns=until_ns)
        if k <= 0:
            return found

        def before(table: pa.Table) -> pa.Table:
            return table.filter(pc.less(table["chunk"], k)) if table.num_rows else table

        kinds = before(self.kinds)
        if kinds.num_rows:
            summed = kinds.group_by(["pid", "kind"]).aggregate([("count_all", "sum")])
            found.totals = {(p, kd): n for p, kd, n in zip(*(summed[c].to_pylist() for c in
                                                              ("pid", "kind", "count_all_sum")), strict=True)}
        last = before(self.last_rows)
        if last.num_rows:
            rows = last.group_by("pid").aggregate([("row_max", "max")])["row_max_max"]
            who = self.events.take(rows).select(["pid", "comm", "start_ns"])
            found.processes = [(pid, comm or "", start, int(self.times[row])) for pid, comm, start, row in zip(
                who["pid"].to_pylist(), who["comm"].cast(pa.string()).to_pylist(), who["start_ns"].to_pylist(),
                rows.to_pylist(), strict=True)]
        errors = before(self.errors)
        if errors.num_rows:
            summed = errors.group_by(["pid", "syscall", "errno"]).aggregate([("count_all", "sum"), ("time_min", "min")])
            found.errors = {(p, sc, er): (n, t) for p, sc, er, n, t in zip(
                *(summed[c].to_pylist() for c in ("pid", "syscall", "errno", "count_all_sum", "time_min_min")),
                strict=True)}
        seconds = before(self.emfile_seconds)
        if seconds.num_rows:
            worst = seconds.group_by("pid").aggregate([("n_max", "max")])
            found.emfile_worst_second = dict(zip(worst["pid"].to_pylist(), worst["n_max_max"].to_pylist(),
                                                 strict=True))
        connects = before(self.connects)
        if connects.num_rows:
            summed = connects.group_by(["pid", "address", "port", "failed"]).aggregate([("count_all", "sum")])
            for pid, address, port, failed, n in zip(*(summed[c].to_pylist() for c in (
                    "pid", "address", "port", "failed", "count_all_sum")), strict=True):
                where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
                tally = found.destinations.setdefault((pid, where), [0, 0])
                tally[0] += n
                tally[1] += n if failed else 0
        rare = self.lifecycle[self.times[self.lifecycle] < until_ns]
        found.lifecycle = self.events.take(pa.array(rare)) if len(rare) else None
        return found


#: The tables the event player plays back, and those replay shows beside its events.
PLAYED = ("events", "losses")
SHOWN_BESIDE = ("samples", "system", "haproxy", "phases", "clock", "fd_sites", "thread_census", "stacks")


class EventPlayer:
    """Plays a recording's events back on a virtual clock of wall time.

    ``poll()`` returns the events whose ``time`` the virtual clock has passed since the last poll,
    with the recording's cumulative losses at that time, exactly as the live source does.

    Args:
        paths: one recording directory or several (several hosts, merged on wall time, each
            host's times on the reference host's clock: ``fdtrace.analysis.engines.dataset.fleet_clock``).
        speed: virtual seconds per real second (0 < speed).
        clock: the real clock, in ns (tests pass a fake one).
        skipped, notes: where unreadable parts, and parts read in part, are named.
        read: the tables already read (``ReplaySource`` reads its own with these); without it,
            the player reads ``PLAYED`` from ``paths``.
    """

    def __init__(self, paths: str | Path | list[str | Path] | list[Path], speed: float = 1.0,
                 clock: Callable[[], int] = time.monotonic_ns, skipped: list[str] | None = None,
                 notes: list[str] | None = None, read: ReplayTables | None = None) -> None:
        roots = _roots(paths)
        self.skipped: list[str] = skipped if skipped is not None else []
        self.notes: list[str] = notes if notes is not None else []
        if read is None:
            read = replay_tables(list[str | Path](roots), PLAYED)
            self.skipped += [s for s in read.skipped if s not in self.skipped]
            self.notes += [n for n in read.notes if n not in self.notes]
        events = [_with_host(part, host) for host, part in read.tables["events"]]
        losses = [codecs.with_host(part, host) for host, part in read.tables["losses"]]
        if not events:
            raise FdtraceError(f"{', '.join(map(str, roots))}: the recording holds no events to replay")
        table = _in_span(pa.concat_tables(events), losses, self.notes)
        if not table.num_rows:
            raise FdtraceError(f"{', '.join(map(str, roots))}: the recording holds no events to replay")
        self.events = table.take(pc.sort_indices(table, [("time", "ascending")]))
        self._times = self.events["time"].cast(pa.int64()).to_numpy()
        self._loss_times, self._loss_totals = self._loss_index(losses)
        self.start_ns = int(self._times[0])
        self.end_ns = int(self._times[-1])
        self._clock = clock
        self._speed = speed
        self._paused = False
        self._position = 0  # index of the next event to hand out
        self._anchor_virtual = self.start_ns
        self._anchor_real = clock()
        self._problem_hits: np.ndarray | None = None
        self._incidents: Incidents | None = None
        self._totals: TotalsIndex | None = None

    @staticmethod
    def _loss_index(losses: list[pa.Table]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if not losses:
            return np.zeros(0, dtype=np.int64), {}
        table = pa.concat_tables(losses, promote_options="default")
        table = table.take(pc.sort_indices(table, [("time", "ascending")]))
        times = table["time"].cast(pa.int64()).to_numpy()
        # A counter the recording never had (an older fdtrace) is unknown, not zero: left out.
        totals = {name: np.cumsum(table[name].fill_null(0).to_numpy()) for name in STATS
                  if name in table.column_names and table[name].null_count < table.num_rows}
        return times, totals

    # The virtual clock

    @property
    def now_ns(self) -> int:
        """The wall time the replay has reached (it goes on past the last event, as time does)."""
        if self._paused:
            return self._anchor_virtual
        elapsed = self._clock() - self._anchor_real
        return self._anchor_virtual + int(elapsed * self._speed)

    @property
    def speed(self) -> float:
        """Virtual seconds per real second."""
        return self._speed

    @property
    def paused(self) -> bool:
        """Whether the virtual clock stands still."""
        return self._paused

    @property
    def finished(self) -> bool:
        """Whether every event has been handed out."""
        return self._position >= len(self._times)

    def _rebase(self, virtual_ns: int) -> None:
        self._anchor_virtual = virtual_ns
        self._anchor_real = self._clock()

    def set_speed(self, speed: float) -> None:
        """Play at ``speed`` times real time from now on."""
        if speed <= 0:
            raise ValueError("speed must be positive")
        self._rebase(self.now_ns)
        self._speed = speed

    def pause(self) -> None:
        """Stop the virtual clock."""
        self._rebase(self.now_ns)
        self._paused = True

    def resume(self) -> None:
        """Start the virtual clock again."""
        self._rebase(self._anchor_virtual)
        self._paused = False

    def seek(self, wall_ns: int) -> None:
        """Jump to a wall time: the next poll hands out the events from there on."""
        wall_ns = max(self.start_ns, min(wall_ns, self.end_ns))
        self._position = int(np.searchsorted(self._times, wall_ns, side="left"))
        self._rebase(wall_ns)

    def totals_index(self) -> TotalsIndex:
        """The recording's cumulative index (``TotalsIndex``), built once."""
        if self._totals is None:
            self._totals = TotalsIndex(self.events, self._times)
        return self._totals

    def replay_window(self, wall_ns: int) -> Baseline:
        """Jump to a wall time, and hand out the events of the window before it (from a checkpoint
        at least ``JUMP_WINDOW_NS`` before) at the next poll; returns what the events before the
        window add up to."""
        wall_ns = max(self.start_ns, min(wall_ns, self.end_ns))
        index = self.totals_index()
        since = index.window_start(wall_ns)
        self._position = int(np.searchsorted(self._times, since, side="left"))
        self._rebase(wall_ns)
        return index.baseline(since)

    def replay_until(self, wall_ns: int) -> None:
        """Jump to a wall time, and hand out every event from the start up to it at the next
        poll (for a view that rebuilds what it showed at that moment)."""
        wall_ns = max(self.start_ns, min(wall_ns, self.end_ns))
        self._position = 0
        self._rebase(wall_ns)

    def seek_next_problem(self, backwards: bool = False) -> int | None:
        """Jump to the next failed call or end that matters after the current time (``backwards``:
        the last one before it): any call that failed with EMFILE or ENFILE (socket, accept and
        fd_error alike), an OOM kill, a Go program past its thread limit, or a crash. Returns its
        wall time, or None when there is none."""
        hits = self._problem_indexes()
        if backwards:
            at = int(np.searchsorted(hits, np.searchsorted(self._times, self.now_ns, side="left"), side="left")) - 1
        else:
            at = int(np.searchsorted(hits, np.searchsorted(self._times, self.now_ns, side="right"), side="left"))
        if not 0 <= at < len(hits):
            return None
        target = int(self._times[int(hits[at])])
        self.seek(target)
        return target

    def seek_next_incident(self, backwards: bool = False) -> int | None:
        """Jump to the next incident after the current time (``backwards``: the last one that began
        before it); returns its number (0 the first), or None when there is none."""
        times = self.incidents().times_ns
        if backwards:
            at = int(np.searchsorted(times, self.now_ns, side="left")) - 1
        else:
            at = int(np.searchsorted(times, self.now_ns, side="right"))
        if not 0 <= at < len(times):
            return None
        self.seek(int(times[at]))
        return at

    def problem_times(self) -> np.ndarray:
        """The wall times of the incidents ``seek_next_incident`` stops at (the position bar marks
        them), computed once."""
        return self.incidents().times_ns

    def incidents(self) -> Incidents:
        """The recording's incidents, indexed once: a program's failures (host and name) with no
        quiet gap of ``INCIDENT_GAP_NS`` between them are one, named by its first failure and
        counted ("haproxy accept4 EMFILE ×1,891")."""
        if self._incidents is None:
            self._incidents = self._index_incidents()
        return self._incidents

    def _problem_indexes(self) -> np.ndarray:
        if self._problem_hits is None:
            self._problem_hits = self._problems(0, len(self._times))
        return self._problem_hits

    def _index_incidents(self) -> Incidents:
        hits = self._problem_indexes()
        if not len(hits):
            return Incidents(np.zeros(0, dtype=np.int64), [])
        rows = self.events.take(pa.array(hits))
        times = self._times[hits]

        def text(name: str) -> Any:
            return pc.fill_null(rows[name].cast(pa.string()), "")
        keys = pc.binary_join_element_wise(text("host"), text("comm"), "\x00")
        codes = pc.index_in(keys, value_set=pc.unique(keys)).to_numpy(zero_copy_only=False)
        order = np.lexsort((times, codes))  # by program, then time
        by_program, at = codes[order], times[order]
        starts = np.ones(len(order), dtype=bool)
        starts[1:] = (by_program[1:] != by_program[:-1]) | (at[1:] - at[:-1] > INCIDENT_GAP_NS)
        counts = np.bincount(np.cumsum(starts) - 1)
        firsts = order[starts]
        chronological = np.argsort(times[firsts], kind="stable")
        firsts, counts = firsts[chronological], counts[chronological]
        named = rows.take(pa.array(firsts)).select(["comm", "kind", "syscall", "errno", "signal"])
        labels = [_incident_label(row, int(n)) for row, n in zip(
            named.cast(pa.schema([(c, pa.string()) for c in named.column_names])).to_pylist(), counts, strict=True)]
        return Incidents(times[firsts], labels)

    def _problems(self, start: int, end: int) -> np.ndarray:
        """Indexes, from ``start``, of the problem events among events[start:end]."""
        part = self.events.slice(start, max(end - start, 0))
        return np.flatnonzero(incident_mask(part).to_numpy(zero_copy_only=False))

    def seek_next(self, kinds: set[str]) -> int | None:
        """Jump to the next event of one of ``kinds`` after the current time (e.g. the next
        fd_error or oom_kill). Returns its wall time, or None when there is none."""
        after = int(np.searchsorted(self._times, self.now_ns, side="right"))
        tail = self.events["kind"].slice(after).cast(pa.string())
        hits = np.flatnonzero(pc.is_in(tail, value_set=pa.array(sorted(kinds))).to_numpy(zero_copy_only=False))
        if not len(hits):
            return None
        target = int(self._times[after + int(hits[0])])
        self.seek(target)
        return target

    # The source interface

    def poll(self) -> EventBatch:
        """The events the virtual clock passed since the last poll."""
        now = self.now_ns
        end = int(np.searchsorted(self._times, now, side="right"))
        batch = self.events.slice(self._position, max(end - self._position, 0))
        self._position = max(end, self._position)
        return EventBatch(events=batch, mono_ns=now, losses=self.losses_at(now))

    def losses_at(self, wall_ns: int) -> dict[str, int]:
        """The recording's cumulative losses at a wall time."""
        index = int(np.searchsorted(self._loss_times, wall_ns, side="right")) - 1
        return {name: int(totals[index]) if index >= 0 else 0 for name, totals in self._loss_totals.items()}


def _in_span(events: pa.Table, losses: list[pa.Table], notes: list[str]) -> pa.Table:
    """The events within the recording's span (``fdtrace.analysis.span``: from the recorder's
    rounds); those far outside it are left out of the replay, and named in ``notes``."""
    import pandas as pd

    from fdtrace.analysis.engines.duckdb_engine import DuckDBEngine
    from fdtrace.analysis.span import span_on

    frames = {"events": pd.DataFrame({"host": events["host"].cast(pa.string()).to_pandas(),
                                      "time": events["time"].to_pandas(),
                                      "kind": events["kind"].cast(pa.string()).to_pandas()})}
    if losses:
        hosts = pa.chunked_array([t["host"].cast(pa.string()) for t in losses])
        frames["losses"] = pd.DataFrame({"host": hosts.to_pandas(),
                                         "time": pa.chunked_array([t["time"] for t in losses]).to_pandas()})
    engine = DuckDBEngine.over_frames(frames)
    try:
        span = span_on(engine)
    finally:
        engine.close()
    if not span.outside or span.first_ns is None or span.last_ns is None:
        return events
    notes.append(span.describe().replace("left off the timelines", "not replayed"))
    stamps = events["time"].cast(pa.int64())
    return events.filter(pc.and_(pc.greater_equal(stamps, span.first_ns), pc.less_equal(stamps, span.last_ns)))


def _roots(paths: str | Path | list[str | Path] | list[Path]) -> list[Path]:
    return [Path(p) for p in (paths if isinstance(paths, list) else [paths])]


class ReplaySource:
    """Recordings played back as a pipeline source, with the controls of the live view's replay
    (pause, speed, seek, next problem).

    Args:
        paths: one recording directory or several (several hosts, merged on wall time).
        speed: virtual seconds per real second.
        clock: the real clock, in ns (tests pass a fake one).
    """

    def __init__(self, paths: str | Path | list[str | Path], speed: float = 1.0,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        roots = _roots(paths)
        self.skipped: list[str] = []
        self.notes: list[str] = []
        self.incident_note = ""  # where the last n/N went: "incident 3 of 12: haproxy accept4 EMFILE ×1,891"
        # Every table of a host from one state of its recording, held until all are read: a
        # recorder still writing it merges and rotates out meanwhile without changing what is read.
        read = replay_tables(list[str | Path](roots), PLAYED + SHOWN_BESIDE)
        self.skipped += read.skipped
        self.notes += read.notes
        self.player = EventPlayer(roots, speed=speed, clock=clock, skipped=self.skipped, notes=self.notes, read=read)
        tables = {name: [part for _, part in read.tables[name]] for name in SHOWN_BESIDE}
        self.player.totals_index()  # once, with the recording: no jump waits for it
        self._host = ",".join(dict.fromkeys(read.hosts))
        self._samples = _by_time(tables["samples"])
        self._system = _by_time(tables["system"])
        self._haproxy = _by_time(tables["haproxy"])
        self._sample_times = _times(self._samples)
        self._system_times = _times(self._system)
        self._haproxy_times = _times(self._haproxy)
        self._fd_sites = _by_time(tables["fd_sites"])
        self._census = _by_time(tables["thread_census"])
        self._fd_site_times = _times(self._fd_sites)
        self._census_times = _times(self._census)
        self._stacks = [stack for part in tables["stacks"] for stack in codecs.STACKS.decode(part.to_pylist())]
        self._stacks_given = False
        recorded_phases = _by_time(tables["phases"])
        self._phases = recorded_phases.to_pandas() if recorded_phases is not None else None
        first = next((codecs.CLOCK.from_row(c.slice(0, 1).to_pylist()[0]) for c in tables["clock"] if c.num_rows), None)
        self._boot_wall_ns = None if first is None else first.realtime_offset_ns - first.boottime_offset_ns
        # Sampling rounds before the first event (a quiet start) or after the last are replayed
        # too: a process's first sample, at 0 sockets, belongs to its memory fit as in the report.
        self._rounds_start_ns = min([self.player.start_ns] + [int(times[0]) for times in (
            self._sample_times, self._system_times, self._haproxy_times) if len(times)])
        self._rounds_end_ns = max([self.player.end_ns] + [int(times[-1]) for times in (
            self._sample_times, self._system_times, self._haproxy_times) if len(times)])
        self._shown_until = self._rounds_start_ns - 1
        self._reset = False
        self._baseline: Baseline | None = None

    @property
    def info(self) -> SourceInfo:
        return SourceInfo(host=self._host, live=False)

    def start(self) -> None:
        """Nothing to start: the recordings were read when it was made."""

    def stop(self) -> None:
        """Nothing to release."""

    def poll(self) -> Update:
        batch = self.player.poll()
        now = batch.mono_ns
        update = Update(now_ns=now, events=batch.events, losses=batch.losses, reset=self._reset,
                        boot_wall_ns=self._boot_wall_ns, baseline=self._baseline if self._reset else None)
        if self._reset or not self._stacks_given:  # a reset view forgets them: all again (a few thousand at most)
            update.stacks = list(self._stacks)
            self._stacks_given = True
        self._reset = False
        # at the end, the rounds taken after the last event too (the recording's last state)
        rounds_until = self._rounds_end_ns if self.player.finished else now
        if rounds_until > self._shown_until:
            update.rounds = self._rounds_between(self._shown_until, rounds_until)
            self._shown_until = rounds_until
        if self._phases is not None:
            update.phases = phases_at(self._phases, now)
        return update

    def finish(self) -> Update:
        """What the clock has passed (a replay stops where it is)."""
        return self.poll()

    def _rounds_between(self, start_ns: int, end_ns: int) -> list[SampleRound]:
        """The recorded sampling rounds in (start_ns, end_ns], grouped by the time they were taken."""
        rounds: dict[int, SampleRound] = {}

        def at(row: dict[str, Any]) -> SampleRound:
            when = row.pop("time_ns")
            mono = row.pop("ts_ns")
            return rounds.setdefault(when, SampleRound(mono, when, [], None))

        for row in _rows_between(self._system, self._system_times, start_ns, end_ns):
            at(row).system = codecs.SYSTEM.from_row(row)
        for row in _rows_between(self._samples, self._sample_times, start_ns, end_ns):
            at(row).samples.append(codecs.SAMPLES.from_row(row))
        for row in _rows_between(self._haproxy, self._haproxy_times, start_ns, end_ns):
            at(row).haproxy.append(codecs.HAPROXY.from_row(row))
        for row in _rows_between(self._fd_sites, self._fd_site_times, start_ns, end_ns):
            at(row).fd_sites.append(codecs.FD_SITES.from_row(row))
        census_rows = _rows_between(self._census, self._census_times, start_ns, end_ns)
        round_of = {row["time_ns"]: row for row in census_rows}
        for when, census in codecs.census_by_process(census_rows):
            at(dict(round_of[when])).threads.append(census)
        return [rounds[t] for t in sorted(rounds)]

    # Controls

    def status(self) -> str:
        """One line: speed or paused, and where the replay is."""
        state = "paused" if self.player.paused else f"{self.player.speed:g}x"
        if self.player.finished:
            state += ", at the end"
        when = time.strftime("%H:%M:%S", time.gmtime(self.player.now_ns / 1e9))
        return f"replay {state}, {when} UTC"

    def toggle_pause(self) -> None:
        """Pause, or go on."""
        if self.player.paused:
            self.player.resume()
        else:
            self.player.pause()

    def faster(self) -> None:
        """Twice as fast (up to 64x)."""
        self.player.set_speed(min(self.player.speed * 2, 64.0))

    def slower(self) -> None:
        """Half as fast (down to 1/8)."""
        self.player.set_speed(max(self.player.speed / 2, 0.125))

    def seek_by(self, seconds: float) -> None:
        """Jump forward or back (``seek``: the view rebuilt from a window before the target)."""
        self.seek(self.player.now_ns + int(seconds * 1e9))

    def seek(self, wall_ns: int) -> None:
        """Jump to a wall time. The next update, with ``reset`` set, carries the events of the
        window before it (``JUMP_WINDOW_NS`` or a little more), the sampling rounds from
        ``ROUNDS_BEFORE_NS`` before that (the charts' history) and, as its ``baseline``,
        what every event before the window added up to (the player's cumulative index): the view
        rebuilds its totals exactly, and the moments before the target, without replaying every
        event since the start."""
        self.incident_note = ""
        self._baseline = self.player.replay_window(wall_ns)
        self._shown_until = max(self._rounds_start_ns, self._baseline.until_ns - ROUNDS_BEFORE_NS) - 1
        self._reset = True

    def next_problem(self, backwards: bool = False) -> bool:
        """Jump to the next (``backwards``: the previous) incident (``EventPlayer.incidents``),
        named by ``incident_note``; False when there is none."""
        found = self.player.seek_next_incident(backwards)
        if found is None:
            return False
        self.seek(self.player.now_ns)
        incidents = self.player.incidents()
        self.incident_note = f"incident {found + 1:,} of {len(incidents.labels):,}: {incidents.labels[found]}"
        return True

    def previous_problem(self) -> bool:
        """Jump to the incident that began last before now; False when none."""
        return self.next_problem(backwards=True)

    def next_failed_call(self, backwards: bool = False) -> bool:
        """Step to the next (``backwards``: the previous) failed call or end of an incident, one at
        a time; False when there is none."""
        target = self.player.seek_next_problem(backwards)
        if target is None:
            return False
        self.seek(target)
        return True


class ReplayControls:
    """The replay's controls, for the view fed by ``pipeline`` from ``source``: its keys move the
    player's clock (each under the pipeline's lock, between two polls), and its status and
    position bar say where the replay is.

    Args:
        pipeline: the pipeline the view is fed by.
        source: the replay that ``pipeline`` polls.
    """

    playback = True
    running = False  # the processes of a recording are not there to be checked

    def __init__(self, pipeline: Pipeline, source: ReplaySource) -> None:
        self.pipeline = pipeline
        self.source = source

    @property
    def skipped(self) -> list[str]:
        """The recording's files that could not be read."""
        return self.source.skipped

    def status(self) -> str:
        """replay SPEED or paused, and the time it is at."""
        with self.pipeline.lock:
            return self.source.status()

    def position(self) -> Position:
        """The recording's span, the replay's clock and its failures."""
        with self.pipeline.lock:
            player = self.source.player
            return Position(player.start_ns, player.end_ns, player.now_ns, player.problem_times(),
                            self.source.incident_note)

    def toggle_recording(self) -> Notice:
        """A replay is not recorded again."""
        return Notice("recording is for live views")

    def toggle_pause(self) -> None:
        with self.pipeline.lock:
            self.source.toggle_pause()

    def faster(self) -> None:
        with self.pipeline.lock:
            self.source.faster()

    def slower(self) -> None:
        with self.pipeline.lock:
            self.source.slower()

    def seek_by(self, seconds: float) -> None:
        with self.pipeline.lock:
            self.source.seek_by(seconds)

    def next_problem(self) -> bool:
        with self.pipeline.lock:
            return self.source.next_problem()

    def previous_problem(self) -> bool:
        with self.pipeline.lock:
            return self.source.previous_problem()

    def next_failed_call(self) -> bool:
        with self.pipeline.lock:
            return self.source.next_failed_call()

    def previous_failed_call(self) -> bool:
        with self.pipeline.lock:
            return self.source.next_failed_call(backwards=True)


def _by_time(parts: list[pa.Table]) -> pa.Table | None:
    if not parts:
        return None
    table = pa.concat_tables(parts, promote_options="default")
    return table.take(pc.sort_indices(table, [("time", "ascending")]))


def _times(table: pa.Table | None) -> np.ndarray:
    if table is None:
        return np.zeros(0, dtype=np.int64)
    return np.asarray(table["time"].cast(pa.int64()).to_numpy())


def _rows_between(table: pa.Table | None, times: np.ndarray, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
    """Rows with ``time`` in (start_ns, end_ns], their time as ``time_ns``."""
    if table is None:
        return []
    lo, hi = np.searchsorted(times, [start_ns, end_ns], side="right")
    rows = table.slice(int(lo), int(hi - lo))
    rows = rows.drop_columns(["time"]).append_column("time_ns", pa.array(times[lo:hi]))
    return list(rows.to_pylist())
