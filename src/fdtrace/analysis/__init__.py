"""Analysis of recordings for postmortems. Every function returns a pandas DataFrame; nothing
here plots (``fdtrace.analysis.plots`` does, and needs matplotlib).

Each function takes what ``load()`` returns with any engine: the tables are reduced by the same
SQL in DuckDB (over the loaded DataFrames, or over the Parquet files) or in Spark, and only the
result comes back into pandas (``fdtrace.analysis.engines``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fdtrace.analysis import binning as _rates
from fdtrace.analysis import call_sites as _sites
from fdtrace.analysis import destinations as _destinations
from fdtrace.analysis import failures as _incidents
from fdtrace.analysis import fleet as _fleet
from fdtrace.analysis import headroom_series as _headroom
from fdtrace.analysis import phase_alignment as _phases
from fdtrace.analysis import spike_finder as _spikes
from fdtrace.analysis.engines.dataset import (
    Analyzable,
    Dataset,
    EngineRecording,
    Recording,
    engine_for,
    open_dataset,
    thread_starts,
)
from fdtrace.analysis.memory import memory_needs, oom_victims

__all__ = ["Dataset", "EngineRecording", "Recording", "align", "cascade", "destinations", "failures", "fleet_heat",
           "headroom", "incidents", "least_headroom", "leaks", "load", "memory_needs", "oom_victims", "open_dataset",
           "phase_stats", "rates", "spikes", "thread_sites", "threads"]


def load(paths: str | Path | list[str | Path], columns: dict[str, list[str]] | None = None,
         phases: list[str | Path] | None = None, engine: str = "pandas", spark_master: str | None = None,
         memory_limit: str | None = None, clock_correction: bool = True) -> Recording | EngineRecording:
    """Open recordings: one recording directory, several, or a fleet (any directory holding
    recordings, up to 4 levels down). ``open_dataset`` with pandas as the default engine: the
    same way in.

    Args:
        columns: when the tables go into pandas, only these columns of these tables
            (``{"events": ["time", "pid", ...]}``); an engine reads what each query needs.
        phases: phase files to add (``fdtrace run --phases-out`` files or PyTorch profiler
            traces); they need pandas.
        engine: ``"pandas"`` loads every table into DataFrames (a ``Recording``); ``"duckdb"``
            leaves them in Parquet and queries them out of core; ``"spark"`` queries them in
            Apache Spark; ``"auto"``: pandas below 5 M rows of events and samples (their
            footers' row counts) that fit in a quarter of the memory available, DuckDB above.
            The engine recordings (``EngineRecording``) answer every function here and
            ``recording.sql(...)``; they hold no events in memory.
        spark_master: with ``engine="spark"``, the cluster (``spark://HOST:7077``); ``local[2]``
            by default, or Spark Connect when SPARK_REMOTE is set.
        memory_limit: with ``engine="duckdb"``, DuckDB's memory limit (``"1GB"``); it spills to
            a private temporary folder beyond it.
        clock_correction: with several hosts, put every host's times on one reference host's
            clock, by the offsets that the TCP connections between the recorded hosts bound
            (``fdtrace.analysis.clock``; the estimates are in ``clock_offsets``). False: each
            host's times as its clock gave them.
    """
    return open_dataset(paths, engine, columns=columns, phases=phases, spark_master=spark_master,
                        memory_limit=memory_limit, clock_correction=clock_correction)


def rates(recording: Analyzable, kind: str | list[str] | None = None, freq: str = "1s", by: str | None = "comm",
          errno: str | list[str] | None = None) -> pd.DataFrame:
    """Events per time bin.

    Args:
        recording: a Recording (``load(...)``) or its events DataFrame.
        kind: only these kinds (``"socket"``, ``["accept", "connect"]``, ...); all when None.
        freq: the bin width, a pandas offset such as ``"1s"``, ``"100ms"``, ``"1min"``.
        by: a column to split by: ``"comm"``, ``"pid"``, ``"host"`` (or ``"rank"`` once phases
            label events); one ``count`` column when None.
        errno: only failures with these errors (``"EMFILE"``).

    Returns:
        One row per bin (a UTC DatetimeIndex named ``time``, every bin from the first to the last,
        empty ones as 0), one column per group, counts of events in the bin. The bins cover the
        recording's span (``fdtrace.analysis.span``: from the recorder's rounds); events far
        outside it are not binned but counted in ``attrs["outliers"]`` (kind, n, first, last).

    Raises:
        ValueError: when ``freq`` would make more than 20 million cells (bins times columns).
    """
    return _rates.rates(recording, kind=kind, freq=freq, by=by, errno=errno)


def spikes(counts: pd.DataFrame, window: int = 30, threshold: float = 5.0, min_count: int = 10,
           min_share: float = 0.1) -> pd.DataFrame:
    """Intervals where a rate rises far above its own recent baseline.

    The rate is the sum of the columns of ``counts`` (a ``rates()`` frame). A bin is hot when it
    holds at least ``min_count`` events and exceeds the baseline by ``threshold`` robust standard
    deviations. The baseline is the median of the previous ``window`` bins (not the bin itself),
    the spread 1.4826 times their median absolute deviation, never taken below 1; a bin with fewer
    than ``max(3, window // 3)`` bins before it (the first seconds of a recording) takes the
    baseline and spread of the ``window`` bins after it instead, so that an incident at the start
    is found; a bin with too few either way is never hot. Consecutive hot bins merge into one
    interval.

    Returns:
        One row per interval: ``start``, ``end`` (exclusive), ``duration_s``, ``peak`` (the highest
        bin), ``peak_time``, ``baseline`` (at the start), ``made_by`` (the columns that made at
        least ``min_share`` of the interval's events, biggest first).
    """
    return _spikes.spikes(counts, window=window, threshold=threshold, min_count=min_count, min_share=min_share)


def headroom(recording: Recording, window_s: float = 30.0) -> pd.DataFrame:
    """FD and thread headroom of every sampled process over time.

    Returns:
        One row per sample: ``time``, ``host``, ``pid``, ``start_ns``, ``comm``, ``open_fds``,
        ``fd_soft_limit``, ``fd_hard_limit``, ``headroom`` (soft limit - open FDs), ``usage``
        (open / soft), ``seconds_to_exhaustion`` (at the growth of open FDs over the previous
        ``window_s``; 0 when full, NaN when not growing), ``threads`` and ``threads_per_s``
        (thread growth over the same window).

        Threads against the tightest limit that bounds them, at that sample:
        ``thread_limit_kind`` (``"Go default"``: Go's 10000-thread limit, for Go programs, which
        ``SetMaxThreads`` may have changed; ``"RLIMIT_NPROC"``: all threads of the process's
        user count, root is exempt; ``"cgroup pids.max"``: all tasks of the cgroup, the tightest
        of its ancestors; ``"threads-max"``: all tasks of the system), ``thread_limit``,
        ``thread_count`` (what that limit counts), ``thread_headroom`` (limit - count),
        ``thread_usage`` and ``seconds_to_thread_limit`` (at the growth of that count over the
        previous ``window_s``). Recordings made before fdtrace sampled these have NaN there.
    """
    return _headroom.headroom(recording, window_s=window_s)


def least_headroom(recording: Recording, resource: str = "fds") -> pd.DataFrame:
    """Each process's fullest moment (the ``headroom()`` row with the highest ``usage``, or
    ``thread_usage`` with ``resource="threads"``), fullest processes first: who came closest
    to its limit, and when."""
    return _headroom.least_headroom(recording, resource=resource)


def destinations(recording: Analyzable) -> pd.DataFrame:
    """Where processes connected to: one row per (process, destination) of connect() calls.

    Returns:
        ``host``, ``comm``, ``pid``, ``peer_addr``, ``peer_port``, ``calls``, ``failed`` (calls
        that failed: not EINPROGRESS or EAGAIN, the answers of non-blocking sockets), ``errors``
        ({errno: count} of the failures), ``first`` and ``last`` call; most failures first.
        Empty for recordings made before connect() carried its destination.
    """
    return _destinations.destinations(recording)


def failures(recording: Analyzable) -> pd.DataFrame:
    """Every EMFILE/ENFILE (any syscall), OOM kill, Go thread limit exceeded ("Go thread limit 600
    exceeded": the runtime said so before it exited 2), kill by a signal and non-zero exit, in time
    order, with ``failure`` saying which (``"accept4 EMFILE"``, ``"killed by SIGKILL"``, ...)."""
    return _incidents.failures(recording)


def incidents(recording: Analyzable, window_s: float = 10.0, exits: bool = False) -> pd.DataFrame:
    """The failures as incidents: grouped by program, ranked by severity.

    Returns:
        One row per host, program (``comm``) and ``failure``: ``severity`` (``EMFILE/ENFILE``,
        ``OOM kill``, ``Go thread limit``, ``killed by a signal``, ``non-zero exit``), ``count`` of
        failures,
        ``processes`` that had them, ``first`` and ``last`` time, ``first_pid``, ``first_overall``
        (True on the row holding the recording's first failure, which comes first), and
        ``followed_by``: the three most frequent things the *other* processes did within
        ``window_s`` seconds of the row's first failure (failed calls by syscall and errno, ends,
        OOM kills), counted. The other rows follow by severity, then by count. Non-zero exit codes
        are left out unless ``exits`` is True (kills by a signal are always in).
    """
    return _incidents.incidents(recording, window_s=window_s, exits=exits)


def cascade(recording: Analyzable) -> pd.DataFrame:
    """The order in which the hosts of a fleet failed, on the fleet's one clock.

    Returns:
        One row per host that failed, first first: ``order``, ``host``, ``time``, ``after_first_s``
        (seconds after the fleet's first failure), the ``pid``, ``comm`` and ``failure`` (as
        ``failures()`` names it; EMFILE/ENFILE, OOM kills and kills by a signal before exit
        codes) of its first failure, and ``failures_on_host``.
    """
    with engine_for(recording) as engine:
        return _fleet.cascade_on(engine)


def fleet_heat(recording: Analyzable, bins: int = 120) -> pd.DataFrame:
    """Hosts by time: per host and time bin (whole seconds, about ``bins`` over the recording),
    ``fd_errors`` (EMFILE/ENFILE calls), ``fd_usage`` (the fullest process's open FDs over its
    soft limit) and ``thread_usage`` (the same for threads and their binding limit)."""
    with engine_for(recording) as engine:
        return _fleet.fleet_heat_on(engine, bins=bins)


def align(frame: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """Label events or spikes with the training phase they happened in.

    Args:
        frame: events (rows with ``pid`` and ``ts_ns``: each is labelled by its own process's
            phases, on the monotonic clock they share with BPF) or ``spikes()`` rows (labelled by
            wall time at their ``peak_time``, across all ranks).
        phases: ``load(...).phases`` of a recording made by ``fdtrace run --record``.

    Returns:
        Events with ``rank``, ``step`` and ``phase`` (the innermost phase containing the event,
        e.g. ``allreduce`` rather than the ``backward`` around it; ``"outside any phase"`` when
        none does; user marks as ``user:NAME``). Spikes with ``phase_by_rank`` ({rank: phase}) and
        ``steps``.
    """
    if "peak_time" in frame.columns and "pid" not in frame.columns:
        return _phases.align_spikes(frame, phases)
    return _phases.align_events(frame, phases)


def phase_stats(recording: Recording) -> pd.DataFrame:
    """Per (rank, phase): ``instances``, ``seconds`` spent, and the ``sockets`` opened, ``closes``,
    ``connects``, ``accepts``, failed calls (``errors``, not counting EAGAIN/EINPROGRESS) and
    ``threads_started`` by that rank's process while in it (events counted in their innermost
    phase, as ``align`` labels them)."""
    with engine_for(recording) as engine:
        return _phases.phase_stats_on(engine, recording.phases)


def _end_ns(recording: Dataset) -> int | None:
    """CLOCK_MONOTONIC ns of a recording's last round (its losses table has one row per round)."""
    losses = recording.table("losses")
    if losses is not None and len(losses):
        return int(losses["ts_ns"].max())
    return None


def leaks(recording: Dataset, pid: int | None = None, window_s: float = 60.0) -> pd.DataFrame:
    """Open descriptors per process and call site at the end of a recording made with --stacks.

    Args:
        recording: a Recording.
        pid: only this process.
        window_s: growth per minute is measured over this much time before the end.

    Returns:
        One row per site still holding descriptors, most open first: host, pid, comm, ``site``
        (the first frame outside libc), ``open``, ``opened`` and ``closed`` there since tracing
        began, ``oldest_age_s``, ``growth_per_min``, ``frames``, ``truncated``; descriptors older
        than the tracing last, as the site "(from before tracing)". Sites whose descriptors were
        all closed are not listed.
    """
    return _sites.leaks(recording.fd_sites, recording.stacks, end_ns=_end_ns(recording), window_s=window_s, pid=pid)


def threads(recording: Dataset, pid: int | None = None) -> pd.DataFrame:
    """What the threads of the processes nearest a thread limit were doing, over time.

    Returns one row per (time, process, syscall, fd kind): ``threads`` of the process blocked in
    that syscall on that kind of descriptor ("running" and "user" for threads in no syscall)."""
    return _sites.thread_census(recording.thread_census, pid=pid)


def thread_sites(recording: Dataset, pid: int | None = None) -> pd.DataFrame:
    """Threads started per process and creating call site (a recording made with --stacks).

    Returns one row per site: ``site``, ``threads`` started there, ``first`` and ``last`` start
    times and the ``frames``, most threads first."""
    with engine_for(recording) as engine:
        started = thread_starts(engine, pid)
    return _sites.thread_sites(started, recording.stacks, pid=pid)


def ledger(recording: Dataset) -> pd.DataFrame:
    """Each rank's descriptors by owner, for every distributed job of a recording made with
    ``fdtrace run --record`` (its phases name the ranks).

    Returns one row per (job, rank, owner, side, phase, thread): ``host``, ``job`` (its rendezvous
    address and world size), ``world_size``, ``rank``, ``pid``, ``owner`` (``store_server``,
    ``store_client``, ``pairs``, ``listeners``, ``other_sockets``, ``files_pipes``: see
    ``fdtrace.schema.owners``), ``side`` (connected, accepted, unconnected), the ``phase`` and
    ``thread`` that made them, and ``descriptors``, counted at the rank's sample with the most
    descriptors. Empty for a recording of no distributed job. See docs/scale.md.
    """
    from fdtrace.analysis.rank_ledger import job_ledgers, ledger_frame

    return ledger_frame(job_ledgers(recording))
