"""The one way into recordings (``open_dataset``): the fleet found once, the engine chosen once
(``engine_rule``), the hosts put on one clock once (``fleet_clock``), the tables then loaded into
pandas (a ``Recording``) or left in Parquet behind DuckDB or Spark (an ``EngineRecording``).
Replay (``fdtrace.sources.replay``) reads its recordings here too (``replay_tables``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import pandas as pd

from fdtrace.analysis.clock import corrected, corrected_part, corrections, host_offsets, time_shifts
from fdtrace.analysis.engines import ENGINES, Engine
from fdtrace.errors import FdtraceError
from fdtrace.recording.fleet import Fleet, find_fleet
from fdtrace.recording.layout import TABLES
from fdtrace.recording.reader import open_part, part_rows, read_parts, read_table

#: ``auto`` loads into pandas below this many rows of events and samples (their footers say, exactly),
#: and only while they fit in a quarter of the memory this process may use (``memory_available``:
#: its memory cgroup's limit or MemAvailable); it uses DuckDB above. Bytes on disk
#: would not tell: a merged file of a long ``--rotate`` recording compresses 10 to 50 times.
AUTO_PANDAS_ROWS = 5_000_000
#: What pandas holds per row of events and samples loaded (a 16-host fleet of 6.4 M events: 3.3 GB).
PANDAS_BYTES_PER_ROW = 520

#: Tables small enough to read into pandas whole, whatever the fleet's size (one row per round
#: and host, or bounded per host).
SMALL_TABLES = ("system", "losses", "clock", "haproxy", "phases", "stacks", "fd_sites", "thread_census",
                "connections")


@dataclass
class Recording:
    """A loaded recording: one pandas DataFrame per table, all hosts together.

    Attributes:
        events: the event model of docs/format.md (``host`` categorical, ``time`` UTC).
        samples: per-process FD headroom samples.
        system: system-wide samples (file-nr, file-max, ...).
        losses: per-interval loss counts.
        counters: exact per-process counters, cumulative, at each flush.
        clock: CLOCK_REALTIME/BOOTTIME - CLOCK_MONOTONIC offsets sampled during the recording.
        haproxy: HAProxy `show info` samples (with --haproxy-socket).
        phases: training phases per rank (recordings made by `fdtrace run --record`).
        stacks: user stacks of failures, descriptors and thread creations (--stacks).
        fd_sites: open descriptors per process and call site, when they changed (--stacks).
        thread_census: threads of the processes nearest a thread limit, by blocking syscall.
        connections: TCP connections becoming established, for clock offsets between hosts.
        clock_offsets: each host's clock offset from a reference host's (``open_dataset``
            estimates them; ``time`` columns are then corrected by them).
        meta: run metadata by host.
        skipped: part files and hosts that could not be read, with the reason (the rest was
            loaded).
        notes: part files read in part (values cut, impossible rows left out, a footer summary
            or a merged file not believed, a second copy of a host read once), with what and why.
    """

    events: pd.DataFrame
    samples: pd.DataFrame
    system: pd.DataFrame
    losses: pd.DataFrame
    counters: pd.DataFrame
    clock: pd.DataFrame
    haproxy: pd.DataFrame
    phases: pd.DataFrame
    stacks: pd.DataFrame | None = None
    fd_sites: pd.DataFrame | None = None
    thread_census: pd.DataFrame | None = None
    connections: pd.DataFrame | None = None
    clock_offsets: pd.DataFrame | None = None
    clock_corrected: bool = False
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def table(self, name: str) -> pd.DataFrame | None:
        """One table by name (one of ``fdtrace.recording.layout.TABLES``): the Dataset protocol's.
        Raises FdtraceError for a name that is no table."""
        if name not in TABLES:
            raise FdtraceError(f"no table {name!r} in a recording: one of {', '.join(TABLES)}")
        frame: pd.DataFrame | None = getattr(self, name)
        return frame

    def query(self, sql: str) -> pd.DataFrame:
        """Any query (DuckDB's dialect) over the tables' views (``events``, ``samples``, ... with
        ``host`` and ``time_ns``, UTC ns), run by DuckDB over the DataFrames."""
        with engine_for(self) as engine:
            return engine.query(sql)

    def close(self) -> None:
        """Nothing to let go of (the frames are this object's): the Dataset protocol's."""

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class _SmallTable:
    """A small table of an ``EngineRecording`` as an attribute of its name: ``table(name)``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, recording: EngineRecording | None, owner: type | None = None) -> pd.DataFrame:
        if recording is None:  # looked up on the class: no table to give
            raise AttributeError(self.name)
        return recording.table(self.name)


@dataclass
class EngineRecording:
    """Recordings whose tables stay in Parquet and are queried through an engine.

    Attributes:
        engine: runs the analyses' SQL.
        fleet: the host recordings found.
        meta: run metadata by host.
        skipped: files and hosts that could not be read, with the reason.
        notes: files read in part, or read by fdtrace's reader instead of the engine's (values cut,
            rows left out, footer summaries not believed, second copies of a host), with the reason.
        clock_offsets: each host's clock offset from the reference host's, from the connections
            between them (``fdtrace.analysis.clock.host_offsets``); None for one host.
        clock_corrected: whether the views' times are on the reference clock.
    """

    engine: Engine
    fleet: Fleet
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    clock_offsets: pd.DataFrame | None = None
    clock_corrected: bool = False
    _small: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)
    _summaries: list[dict[str, pd.DataFrame] | None] = field(default_factory=list, repr=False)  # once read

    def sql(self, query: str) -> pd.DataFrame:
        """Any query (DuckDB's dialect) over the views: ``events``, ``samples``, ... with ``host``
        and ``time_ns`` (UTC ns) columns."""
        return self.engine.query(query)

    def table(self, name: str) -> pd.DataFrame:
        """A small table (:data:`SMALL_TABLES`) read whole into pandas, as ``load()`` gives it."""
        if name not in SMALL_TABLES:
            raise FdtraceError(f"the {name} table of a recording in the {self.engine.name} engine is not read "
                               "into memory: query it (recording.sql(...)) or load it with engine='pandas'")
        if name not in self._small:
            problems: list[str] = []
            notes: list[str] = []
            frame = fleet_table(self.fleet, name, problems, notes)
            self.skipped += [p for p in problems if p not in self.skipped]  # the views may have named them
            self.notes += [n for n in notes if n not in self.notes]
            if self.clock_corrected:  # on the views' clock
                frame = corrected({name: frame}, corrections(self.clock_offsets))[name]
            self._small[name] = frame
        return self._small[name]

    def query(self, sql: str) -> pd.DataFrame:
        """Any query (DuckDB's dialect) over the views (the same as ``sql``)."""
        return self.engine.query(sql)

    def part_summaries(self) -> dict[str, pd.DataFrame] | None:
        """The events' part summaries (``fdtrace.recording.summaries``) of every host, as frames
        with ``host`` (``kinds``, ``failed``, ``connects``), their times on the views' clock; None
        when some part has none (written before summaries: ``fdtrace compact`` adds them)."""
        from fdtrace.recording import summaries as module

        if self._summaries:
            return self._summaries[0]
        found: dict[str, list[list[Any]]] = {"kinds": [], "failed": [], "connects": []}
        shifts = corrections(self.clock_offsets) if self.clock_corrected else {}
        complete = True
        for recording, path in self.fleet.parts("events"):
            if path in self.fleet.doubted:  # fdtrace's reader may leave rows out that its summary counts
                complete = False
                break
            try:
                with open_part(path) as part:
                    summary, why = module.summary_of(part)
            except (OSError, ValueError):  # gone (a recorder merged it) or unreadable: the events tell
                complete = False
                break
            if why:
                note = f"{path}: its footer summary is not used ({why}): its events are read instead"
                if note not in self.notes:
                    self.notes.append(note)
            if summary is None:
                complete = False
                break
            for name in found:
                found[name] += [[recording.host, *row] for row in summary[name]]
        if not complete:
            self._summaries.append(None)
            return None
        columns = {"kinds": module.KIND_COLUMNS, "failed": module.FAILED_COLUMNS, "connects": module.CONNECT_COLUMNS}
        frames = {}
        for name, rows in found.items():
            frame = pd.DataFrame(rows, columns=["host", *columns[name]])
            for column in ("first", "last", "at"):
                if column in frame.columns:
                    frame[column] = frame[column] - time_shifts(frame["host"], shifts)
            frames[name] = frame
        self._summaries.append(module.merge_frames(frames))
        return self._summaries[0]

    # The small tables by name, as ``table(name)`` reads them (the Dataset protocol's).
    system = _SmallTable()
    clock = _SmallTable()
    losses = _SmallTable()
    phases = _SmallTable()
    haproxy = _SmallTable()
    stacks = _SmallTable()
    fd_sites = _SmallTable()
    thread_census = _SmallTable()
    connections = _SmallTable()

    def close(self) -> None:
        """Stop the engine, and let go of the recordings' states (their recorders may then delete
        the parts they merged or rotated out meanwhile)."""
        try:
            self.engine.close()
        finally:
            self.fleet.close()

    def __enter__(self) -> EngineRecording:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _rows(fleet: Fleet) -> int:
    """Rows of events and samples, from the part files' footers (a file that cannot tell counts 0:
    the readers name it)."""
    total = 0
    for table in ("events", "samples"):
        for _, path in fleet.parts(table):
            try:
                total += part_rows(path)
            except (OSError, ValueError):
                continue
    return total


def engine_rule(fleet: Fleet, engine: str, phases: list[str | Path] | None = None) -> str:
    """The engine that opens ``fleet`` when ``engine`` is asked for: the one rule. Phase files need
    pandas (refused with another engine); ``auto`` is pandas when the rows of events and samples
    (their footers' counts) fit (``pandas_fits``), DuckDB above; pandas asked for is refused when
    they cannot fit in the memory this process may use. Raises FdtraceError (one line)."""
    if engine not in (*ENGINES, "auto"):
        raise FdtraceError(f"unknown engine {engine!r}: one of auto, {', '.join(ENGINES)}")
    if phases and engine not in ("auto", "pandas"):
        raise FdtraceError(f"phase files need the pandas engine (the {engine} engine reads phases from the "
                           "recordings)")
    if engine == "pandas":
        refused = _pandas_refused(_rows(fleet), memory_available())
        if refused is not None:
            raise refused
        return engine
    if engine == "auto":
        return "pandas" if phases or pandas_fits(_rows(fleet), memory_available()) else "duckdb"
    return engine


def pandas_fits(rows: int, available: int | None) -> bool:
    """Whether ``rows`` of events and samples go into pandas: below AUTO_PANDAS_ROWS, and in a
    quarter of ``available`` bytes of memory (None: unknown, the row count alone decides)."""
    if rows >= AUTO_PANDAS_ROWS:
        return False
    return available is None or rows * PANDAS_BYTES_PER_ROW <= available // 4


def memory_available() -> int | None:
    """The memory this process may use, in bytes: the lowest of its memory cgroup's limit (v2
    memory.max, v1 memory.limit_in_bytes, its own or an ancestor's) and MemAvailable (None where
    neither says)."""
    from fdtrace.procfs.memory import memory_allowed

    return memory_allowed()


def _pandas_refused(rows: int, available: int | None) -> FdtraceError | None:
    """Why ``rows`` of events and samples cannot go into pandas in this process (None: they can)."""
    need = rows * PANDAS_BYTES_PER_ROW
    if available is None or need <= available:
        return None
    gib = 1 << 30
    return FdtraceError(f"the recording's part files count {rows:,} rows of events and samples, about "
                        f"{need / gib:,.1f} GiB in pandas, more than the {available / gib:,.1f} GiB this process may "
                        "use (its memory cgroup's limit or MemAvailable): give --engine duckdb, which reads them "
                        "from the files")


def choose_engine(paths: str | Path | list[str | Path], engine: str = "auto") -> str:
    """The engine ``engine`` stands for with these recordings (``engine_rule``; ``auto`` chooses by
    size)."""
    if engine != "auto":
        return engine
    fleet = find_fleet(paths)
    try:
        return engine_rule(fleet, engine)
    finally:
        fleet.close()


class Dataset(Protocol):
    """What every command and analysis takes: recordings (one host's, several, a fleet) opened in
    one engine, their hosts on one clock. ``Recording`` holds its tables as DataFrames;
    ``EngineRecording`` leaves them in Parquet behind DuckDB or Spark. Both close as context
    managers."""

    meta: dict[str, dict[str, Any]]
    skipped: list[str]
    notes: list[str]
    clock_offsets: pd.DataFrame | None
    clock_corrected: bool

    def table(self, name: str) -> pd.DataFrame | None:
        """One table as a DataFrame: any in pandas; in an engine, the small ones (the events and
        samples stay behind the engine: ``engine_for`` queries them)."""

    def query(self, sql: str) -> pd.DataFrame:
        """Any query (DuckDB's dialect) over the tables' views, its result as a DataFrame."""

    # The small tables, as ``table(name)`` gives them.
    @property
    def system(self) -> pd.DataFrame: ...

    @property
    def clock(self) -> pd.DataFrame: ...

    @property
    def losses(self) -> pd.DataFrame: ...

    @property
    def phases(self) -> pd.DataFrame: ...

    @property
    def stacks(self) -> pd.DataFrame | None: ...

    @property
    def fd_sites(self) -> pd.DataFrame | None: ...

    @property
    def thread_census(self) -> pd.DataFrame | None: ...

    @property
    def connections(self) -> pd.DataFrame | None: ...

    def close(self) -> None:
        """Let go of what it holds (an engine's connection, its temporary files)."""

    def __enter__(self) -> Dataset: ...

    def __exit__(self, *_exc: object) -> None: ...


#: What an analysis takes: a recording in any engine, or (for the analyses of events alone) its
#: events DataFrame.
Analyzable: TypeAlias = "Dataset | pd.DataFrame"


def open_dataset(paths: str | Path | list[str | Path], engine: str = "auto", *,
                 columns: dict[str, list[str]] | None = None, phases: list[str | Path] | None = None,
                 spark_master: str | None = None, memory_limit: str | None = None,
                 clock_correction: bool = True) -> Recording | EngineRecording:
    """The one way into recordings: the fleet found once (one walk), the engine chosen once
    (``engine_rule``: ``auto`` by the rows the Parquet footers count against the memory
    available, never by bytes on disk), the hosts put on one clock once (``fleet_clock``).
    ``columns`` reads only those columns when the tables go into pandas (an engine reads what
    each query needs); ``phases`` (phase files to add) need pandas. Raises FdtraceError for
    recordings that cannot be opened and for an engine that cannot do what is asked."""
    fleet = find_fleet(paths)
    try:
        chosen = engine_rule(fleet, engine, phases)
        if chosen == "pandas" and engine == "auto" and not phases:
            fleet.refresh()  # a recording without a manifest is listed again when read
        if chosen == "pandas":
            return _into_pandas(fleet, fleet_clock(fleet, clock_correction), columns, phases)
        return _over_engine(fleet, chosen, clock_correction, spark_master, memory_limit)
    except BaseException:
        fleet.close()
        raise


def fleet_table(fleet: Fleet, name: str, skipped: list[str], notes: list[str],
                columns: list[str] | None = None) -> pd.DataFrame:
    """One table of every host of ``fleet`` as a DataFrame, read by fdtrace's reader from the
    state of each host the fleet holds (``host`` categorical; several recordings in wall-time
    order, on each host's own clock); unreadable parts are named in ``skipped``, parts read in
    part in ``notes``."""
    frames = []
    for root in dict.fromkeys(h.root for h in fleet.hosts):
        versions = {h.host: h.version for h in fleet.hosts if h.root == root}
        states = {h.host: fleet.snapshot(h) for h in fleet.hosts if h.root == root}
        frames.append(read_table(root, name, versions, skipped, columns, notes, states))
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if "host" in frame.columns:
        frame["host"] = frame["host"].astype("category")
    if len(frames) > 1 and "time" in frame.columns:  # several recordings: one wall-clock timeline
        frame = frame.sort_values("time", kind="stable", ignore_index=True)
    return frame


@dataclass
class FleetClock:
    """The hosts of a fleet on one clock: each host's offset from the reference host's
    (``offsets``, ``fdtrace.analysis.clock.host_offsets``; None for one host or no connection
    between hosts), what to subtract from each host's times (``shifts``: empty when the times
    stay as each host's clock gave them), and the connections table they came from (each host's
    own clock; None for one host: not read)."""

    offsets: pd.DataFrame | None
    shifts: dict[str, int]
    connections: pd.DataFrame | None


def fleet_clock(fleet: Fleet, correct: bool = True, engine: Engine | None = None) -> FleetClock:
    """The clock correction of ``fleet``, written once for every engine and for replay: the
    offsets the TCP connections between its hosts bound; ``correct``: whether times are to be
    moved by them. ``engine``: one whose views of the fleet are still on each host's own clock
    reads the connections where they lie (then they are not read into memory: ``connections``
    None); otherwise they are read here. Problems reading the connections are named in the
    fleet's ``skipped`` and ``notes``."""
    if len(fleet.names) < 2:  # one host: one clock already
        return FleetClock(None, {}, None)
    if engine is not None:
        if not engine.rows("connections"):
            return FleetClock(None, {}, None)
        offsets = host_offsets(engine)
        return FleetClock(offsets, corrections(offsets) if correct else {}, None)
    connections = fleet_table(fleet, "connections", fleet.skipped, fleet.notes)
    if not len(connections):
        return FleetClock(None, {}, connections)
    from fdtrace.analysis.engines.duckdb_engine import DuckDBEngine

    frames = DuckDBEngine.over_frames({"connections": connections})
    try:
        offsets = host_offsets(frames)
    finally:
        frames.close()
    return FleetClock(offsets, corrections(offsets) if correct else {}, connections)


def _into_pandas(fleet: Fleet, clock: FleetClock, columns: dict[str, list[str]] | None,
                 phases: list[str | Path] | None) -> Recording:
    """Every table of ``fleet`` in DataFrames, each host read from one state of it
    (``HostSnapshot``), let go of once read; times on the reference clock when ``clock`` says."""
    try:
        skipped: list[str] = list(fleet.skipped)
        notes: list[str] = list(fleet.notes)
        wanted = columns or {}
        frames = {table: clock.connections if table == "connections" and clock.connections is not None
                  and table not in wanted else fleet_table(fleet, table, skipped, notes, wanted.get(table))
                  for table in TABLES}
    finally:
        fleet.close()
    recording = Recording(meta=fleet.meta, skipped=skipped, notes=notes, clock_offsets=clock.offsets,
                          clock_corrected=bool(clock.shifts), **corrected(frames, clock.shifts))
    if phases:
        from fdtrace.integrations.phases.files import with_phase_files

        recording = with_phase_files(recording, list(phases))
    return recording


def _over_engine(fleet: Fleet, engine: str, clock_correction: bool, spark_master: str | None,
                 memory_limit: str | None) -> EngineRecording:
    """The fleet's tables as views of DuckDB or Spark, on the reference host's clock when
    ``clock_correction`` and the connections between the hosts say (``fleet_clock``: DuckDB
    reads the connections from its own views, before it shifts them)."""
    runner: Engine
    if engine == "duckdb":
        from fdtrace.analysis.engines.duckdb_engine import DuckDBEngine

        duck = runner = DuckDBEngine.over_fleet(fleet, memory_limit=memory_limit)
        try:
            clock = fleet_clock(fleet, clock_correction, duck)
            if clock.shifts:
                duck.shift_clocks(clock.shifts)
        except BaseException:
            duck.close()
            raise
    else:
        from fdtrace.analysis.engines.spark_engine import SparkEngine

        clock = fleet_clock(fleet, clock_correction)
        runner = SparkEngine.over_fleet(fleet, master=spark_master, offsets=clock.shifts or None)
    found = EngineRecording(runner, fleet, fleet.meta, fleet.skipped, fleet.notes, clock_offsets=clock.offsets,
                            clock_corrected=bool(clock.shifts))
    if clock.connections is not None:
        found._small["connections"] = corrected({"connections": clock.connections}, clock.shifts)["connections"]
    return found


@dataclass
class ReplayTables:
    """What replay (``fdtrace.sources.replay``) plays back, read here so that only the engines
    open recording files: every host's Arrow tables by table name, as (host, table) pairs in the
    fleet's order, each host's rows from one state of its recording (``HostSnapshot``) with
    ``time`` on the reference host's clock (``fleet_clock``); unreadable hosts and parts are named
    in ``skipped``, parts read in part and second copies of a host in ``notes``."""

    hosts: list[str]
    tables: dict[str, list[tuple[str, Any]]]
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def replay_tables(paths: str | Path | list[str | Path], names: tuple[str, ...]) -> ReplayTables:
    """The tables ``names`` of the recordings at ``paths``, found as ``open_dataset`` finds them
    and read for replay (``ReplayTables``). Every host's state is taken before any table is read
    and let go of once all are. Raises FdtraceError (one line)."""
    fleet = find_fleet(paths)
    try:
        shifts = fleet_clock(fleet).shifts
        found = ReplayTables([h.host for h in fleet.hosts], {name: [] for name in names})
        found.skipped += fleet.skipped
        found.notes += fleet.notes
        states = [(h, fleet.snapshot(h)) for h in fleet.hosts]
        for host, state in states:
            for name in names:
                part = read_parts(host.root, name, host.host, found.skipped, version=host.version,
                                  notes=found.notes, snapshot=state)
                if part is not None:
                    found.tables[name].append((host.host, corrected_part(part, host.host, shifts)))
        found.skipped += [s for s in fleet.skipped if s not in found.skipped]
        found.notes += [n for n in fleet.notes if n not in found.notes]
        return found
    finally:
        fleet.close()


@contextmanager
def engine_for(data: Analyzable) -> Iterator[Engine]:
    """The engine for an analysis of ``data``: an EngineRecording's own, or DuckDB over the frames
    of a Recording (or of one events DataFrame) for the length of the analysis."""
    from fdtrace.analysis.engines.duckdb_engine import DuckDBEngine

    if isinstance(data, EngineRecording):
        yield data.engine
        return
    tables = {"events": data} if isinstance(data, pd.DataFrame) else {t: data.table(t) for t in TABLES}
    frames = {t: frame for t, frame in tables.items() if isinstance(frame, pd.DataFrame)}
    engine = DuckDBEngine.over_frames(frames)
    try:
        yield engine
    finally:
        engine.close()


#: The event columns that ``thread_sites`` reads.
THREAD_EVENT_COLUMNS = ("host", "ts_ns", "time", "pid", "tid", "comm", "kind", "stack_id")


def thread_starts(engine: Engine, pid: int | None = None) -> pd.DataFrame:
    """The thread_start events that carry a stack (a recording made with --stacks), of one
    process or all: what ``call_sites.thread_sites`` counts."""
    if "stack_id" not in engine.columns("events"):
        return pd.DataFrame(columns=list(THREAD_EVENT_COLUMNS))
    mine = "" if pid is None else f" AND pid = {int(pid)}"
    return select_events(engine, f"kind = 'thread_start' AND stack_id IS NOT NULL{mine}", THREAD_EVENT_COLUMNS)


def select_events(engine: Engine, condition: str, columns: list[str] | tuple[str, ...]) -> pd.DataFrame:
    """The events that meet ``condition`` (SQL over the events view), with these columns, in time
    order, as ``load()`` would give them (``time`` a UTC timestamp, names categorical)."""
    present = engine.columns("events")
    wanted = [c for c in columns if c in present or c in ("time", "host")]
    listing = ", ".join("time_ns" if c == "time" else f'"{c}"' for c in wanted)
    found = engine.query(f"SELECT {listing} FROM events WHERE {condition} ORDER BY time_ns, host, pid")
    if "time_ns" in found.columns:
        found["time"] = pd.to_datetime(found.pop("time_ns").astype("int64"), unit="ns", utc=True)
    for column in ("host", "comm", "kind", "syscall", "errno", "signal"):
        if column in found.columns:
            found[column] = found[column].astype("category")
    if "stack_id" in found.columns:
        found["stack_id"] = found["stack_id"].astype("Int64")
    return found[[c for c in wanted if c in found.columns]]
