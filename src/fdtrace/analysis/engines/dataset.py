"""A recording or fleet held by an engine rather than in memory: what ``load(..., engine="duckdb")``
and ``load(..., engine="spark")`` return, and the choice of engine."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import pandas as pd

from fdtrace.analysis.clock import corrected, corrections, host_offsets
from fdtrace.analysis.engines import ENGINES, Engine
from fdtrace.errors import FdtraceError
from fdtrace.recording import Recording
from fdtrace.recording.fleet import Fleet, find_fleet
from fdtrace.recording.layout import TABLES
from fdtrace.recording.reader import load_fleet, open_part, part_rows, read_table

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
            frames: list[pd.DataFrame] = []
            problems: list[str] = []
            notes: list[str] = []
            for root in sorted({h.root for h in self.fleet.hosts}):
                hosts = {h.host: h.version for h in self.fleet.hosts if h.root == root}
                states = {h.host: self.fleet.snapshot(h) for h in self.fleet.hosts if h.root == root}
                frames.append(read_table(root, name, hosts, problems, notes=notes, snapshots=states))
            self.skipped += [p for p in problems if p not in self.skipped]  # the views may have named them
            self.notes += [n for n in notes if n not in self.notes]
            frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
            frame["host"] = frame["host"].astype(str).astype("category")
            if self.clock_corrected:  # on the views' clock
                frame = corrected({name: frame}, corrections(self.clock_offsets))[name]
            self._small[name] = frame
        return self._small[name]

    def part_summaries(self) -> dict[str, pd.DataFrame] | None:
        """The events' part summaries (``fdtrace.recording.summaries``) of every host, as frames
        with ``host`` (``kinds``, ``failed``, ``connects``), their times on the views' clock; None
        when some part has none (written before summaries: ``fdtrace compact`` adds them)."""
        from fdtrace.recording import summaries as module

        if self._summaries:
            return self._summaries[0]
        found: dict[str, list[list[Any]]] = {"kinds": [], "failed": [], "connects": []}
        shifts = {}
        if self.clock_corrected and self.clock_offsets is not None:
            shifts = {str(r.host): int(r.offset_ns) for r in self.clock_offsets.itertuples()}
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
                    frame[column] = frame[column] - frame["host"].map(shifts).fillna(0).astype("int64")
            frames[name] = frame
        self._summaries.append(module.merge_frames(frames))
        return self._summaries[0]

    def __getattr__(self, name: str) -> Any:
        if name in TABLES:
            return self.table(name)
        raise AttributeError(name)

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


def _chosen(fleet: Fleet, engine: str) -> str:
    if engine not in (*ENGINES, "auto"):
        raise FdtraceError(f"unknown engine {engine!r}: one of auto, {', '.join(ENGINES)}")
    if engine == "auto":
        return "pandas" if pandas_fits(_rows(fleet), memory_available()) else "duckdb"
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
    """The engine ``engine`` stands for with these recordings (``auto`` chooses by size)."""
    if engine != "auto":
        return engine
    fleet = find_fleet(paths)
    try:
        return _chosen(fleet, engine)
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

    # The tables as DataFrames: all of them in pandas; in an engine, the small ones (the events and
    # samples stay behind the engine: ``engine_for`` queries them).
    @property
    def events(self) -> pd.DataFrame: ...

    @property
    def samples(self) -> pd.DataFrame: ...

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
    (``auto``: by the rows the Parquet footers count against the memory available, never by
    bytes on disk), the hosts put on one clock once. ``columns`` reads only those columns when
    the tables go into pandas (an engine reads what each query needs); ``phases`` (phase files
    to add) need pandas. Raises FdtraceError for recordings that cannot be opened and for an
    engine that cannot do what is asked."""
    fleet = find_fleet(paths)
    if phases and engine not in ("auto", "pandas"):
        raise FdtraceError(f"phase files need the pandas engine (the {engine} engine reads phases from the "
                           "recordings)")
    try:
        chosen = "pandas" if phases else _chosen(fleet, engine)
        if chosen == "pandas" and engine == "pandas":  # asked for: refused when it cannot fit (auto chose by it)
            refused = _pandas_refused(_rows(fleet), memory_available())
            if refused is not None:
                raise refused
        if chosen == "pandas":
            if engine == "auto" and not phases:
                fleet.refresh()  # a recording without a manifest is listed again when read
            return on_one_clock(load_fleet(fleet, columns, phases), clock_correction)
        return _over_engine(fleet, chosen, spark_master, memory_limit, clock_correction)
    except BaseException:
        fleet.close()
        raise


def on_one_clock(recording: Recording, correct: bool) -> Recording:
    """A loaded recording of several hosts with its clock offsets, and its times corrected."""
    connections = recording.connections
    if len(recording.meta) < 2 or connections is None or not len(connections):
        return recording
    with engine_for(recording) as engine:
        offsets = host_offsets(engine)
    recording.clock_offsets = offsets
    shifts = corrections(offsets)
    if correct and shifts:
        tables = {name: getattr(recording, name) for name in TABLES}
        for name, frame in corrected(tables, shifts).items():
            setattr(recording, name, frame)
        recording.clock_corrected = True
    return recording


def _over_engine(fleet: Fleet, engine: str, spark_master: str | None, memory_limit: str | None,
                 clock_correction: bool) -> EngineRecording:
    """The fleet's tables as views of DuckDB or Spark, on the reference host's clock."""

    def views(shifts: dict[str, int] | None) -> Engine:
        if engine == "duckdb":
            from fdtrace.analysis.engines.duckdb_engine import DuckDBEngine

            return DuckDBEngine.over_fleet(fleet, memory_limit=memory_limit, offsets=shifts)
        from fdtrace.analysis.engines.spark_engine import SparkEngine

        return SparkEngine.over_fleet(fleet, master=spark_master, offsets=shifts)

    runner = views(None)
    offsets = host_offsets(runner) if len(fleet.names) > 1 else None
    shifts = corrections(offsets) if clock_correction else {}
    if shifts:  # the same files, their times moved onto the reference host's clock
        from fdtrace.analysis.engines.duckdb_engine import DuckDBEngine

        if isinstance(runner, DuckDBEngine):
            runner.shift(shifts)  # the files' footers are not read and checked again
        else:
            seen = len(fleet.skipped)
            runner = views(shifts)
            del fleet.skipped[seen:]  # named once already
    return EngineRecording(runner, fleet, fleet.meta, fleet.skipped, fleet.notes, clock_offsets=offsets,
                           clock_corrected=bool(shifts))


@contextmanager
def engine_for(data: Analyzable) -> Iterator[Engine]:
    """The engine for an analysis of ``data``: an EngineRecording's own, or DuckDB over the frames
    of a Recording (or of one events DataFrame) for the length of the analysis."""
    from fdtrace.analysis.engines.duckdb_engine import DuckDBEngine

    if isinstance(data, EngineRecording):
        yield data.engine
        return
    frames = {"events": data} if isinstance(data, pd.DataFrame) else \
        {t: getattr(data, t) for t in TABLES if isinstance(getattr(data, t, None), pd.DataFrame)}
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
