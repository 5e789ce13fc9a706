"""Reading recordings back: metadata, and part files upgraded to the current tables (the way in
for analyses and replay is ``fdtrace.analysis.engines.dataset.open_dataset``, which reads through
this module).

Nothing in a recording is trusted. Metadata is parsed within a size and a nesting bound; a part
file's footer is checked before its pages are read (how much each column chunk takes once
decompressed, against what its rows can need); text longer than :data:`MAX_TEXT` is cut;
impossible values (times before 1970 or after 2116, negative counters, a missing value where
the table declares one) are left out; a merged part is believed only when it holds at least the
rows of the parts it claims to cover. Everything left out or changed is named, in ``skipped``
(files or hosts not read) or ``notes`` (files read in part).

A recording may be written while it is read: each host is read as one state its writer
published (``HostSnapshot``: the readers' lock held shared, then the manifest read; see
``fdtrace.recording.manifest``), whose parts stay on disk until the reader lets go. A recording
written before manifests is listed under the writers' lock (taken shared and briefly), and
listed again when a merge moved a file meanwhile.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

from fdtrace.display import shown
from fdtrace.errors import FdtraceError
from fdtrace.recording.layout import UNBOUNDED, host_dir, lock_path, part_name, part_names, part_range
from fdtrace.recording.upgrade import stored_names, upgrade
from fdtrace.safe_files import read_regular
from fdtrace.schema import COUNTERS, META_FIELDS, SCHEMA_VERSION, STATS, VERSIONS
from fdtrace.schema import TABLES as TABLES_DECLARED

#: A metadata file is read up to this size.
MAX_META_BYTES = 4 << 20
#: JSON nested deeper than this is refused (metadata nests 3 levels, a part summary 3).
MAX_JSON_DEPTH = 32
#: Characters a text value is read with at most; longer ones are cut to this.
MAX_TEXT = 4096
#: A Parquet footer larger than this is refused (a recording's are a few KiB to a few MiB).
MAX_FOOTER_BYTES = 64 << 20
#: Bytes a column chunk may take once decompressed, per row, by declared type: a chunk larger
#: than its rows times this (plus :data:`CHUNK_SLACK`) is not read. What reading a part costs is
#: then bounded by its rows, whatever its values.
ROW_BUDGET = {"string": 1 << 10, "dict_string": 1 << 10, "string_list": 64 << 10, "errors_list": 8 << 10}
#: Of the columns whose values are longer by nature.
COLUMN_BUDGET = {"cmdline": 8 << 10}
#: Of the fixed-width types.
FIXED_BUDGET = 64
#: What any column chunk may take beyond its rows' budget.
CHUNK_SLACK = 1 << 20
#: What one value of a row takes once decoded, at most, counting the copies the upgrade and the
#: checks make (8 bytes a value, twice); text beyond it is bounded by ROW_BUDGET. A part whose rows
#: (its footer counts them) times its columns times this would not fit in the memory this process
#: may still use is not decoded: the command stops in one line (``check_memory``).
DECODED_BYTES_PER_VALUE = 16
#: Seconds the memory this process may use (``procfs.memory.memory_allowed``) is read again after.
MEMORY_FIGURE_S = 2.0
#: Times (``time``, ``ts_ns``) outside [0, this) ns are impossible: before 1970 or after 2116.
TIME_LIMIT = 1 << 62
#: Any other integer of magnitude this or more is impossible (no count, size or id gets there).
INT_LIMIT = 1 << 62
#: Columns that count: a negative value is impossible.
NON_NEGATIVE = {"losses": frozenset(STATS) | {f"{name}_total" for name in STATS},
                "counters": frozenset(COUNTERS)}
TIME_COLUMNS = ("time", "ts_ns")
#: The largest pid or tid a kernel gives (PID_MAX_LIMIT).
PID_MAX = 1 << 22
#: The largest RLIMIT_NOFILE a kernel accepts (fs.nr_open's ceiling), and so of open descriptors.
NR_OPEN_MAX = (1 << 31) - 1
#: More kB than any address space holds (2^57 bytes with 5-level paging).
KB_MAX = 1 << 47
#: What a kernel can give, as [low, high], by (table, column): a value outside is impossible and
#: never reaches an answer (advice made from a soft limit of -1 or 2^62-1, a pid of -1). Only
#: columns whose footers keep statistics (see ``layout.checked_statistics``), so that an engine
#: can tell a part is sound without reading it.
PLAUSIBLE: dict[tuple[str, str], tuple[int, int]] = {
    ("events", "pid"): (1, PID_MAX), ("events", "tid"): (1, PID_MAX),
    **{("events", name): (0, KB_MAX) for name in ("total_vm_kb", "anon_rss_kb", "file_rss_kb", "shmem_rss_kb")},
    ("samples", "pid"): (1, PID_MAX), ("samples", "open_fds"): (0, NR_OPEN_MAX),
    # a soft limit of 0 leaves a process no descriptor at all: none that fdtrace samples has it
    ("samples", "fd_soft_limit"): (1, NR_OPEN_MAX), ("samples", "fd_hard_limit"): (1, NR_OPEN_MAX),
    ("samples", "threads"): (1, PID_MAX), ("samples", "sockets"): (0, NR_OPEN_MAX),
    **{("samples", name): (0, KB_MAX) for name in ("rss_anon_kb", "rss_file_kb", "rss_shmem_kb")},
    ("counters", "pid"): (1, PID_MAX),
}
#: Columns where a missing value means something (no limit): an impossible one leaves its row out
#: rather than be read as missing.
MISSING_MEANS = frozenset({("samples", "fd_soft_limit"), ("samples", "fd_hard_limit")})
#: How long a reader waits for a host's lock (a writer deleting parts, or an older one merging)
#: before it reads without it.
LOCK_WAIT_S = 5.0
#: How many times one host's parts are listed again when a merge moved a file meanwhile (only
#: where the host is not read as one steady state: no manifest, or no readers' lock).
RELISTS = 3

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def loads_bounded(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON parsed only when it nests at most ``max_depth`` deep (Python's parser recurses, and a
    file nested 100,000 deep would exhaust its stack). Raises ValueError."""
    import numpy as np

    skeleton = np.frombuffer(_JSON_STRING.sub(b"", data), dtype=np.uint8)
    steps = (skeleton == ord("[")).astype(np.int64) + (skeleton == ord("{")) - (skeleton == ord("]")) - \
        (skeleton == ord("}"))
    depth = int(np.cumsum(steps).max()) if len(steps) else 0
    if depth > max_depth:
        raise ValueError(f"nested {depth} levels deep, more than the {max_depth} fdtrace reads")
    try:
        return json.loads(data)
    except RecursionError:  # only if max_depth is set beyond what the stack holds
        raise ValueError("nested too deep") from None


def _one_line(exc: BaseException, limit: int = 200) -> str:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
    return " ".join(reason.split())[:limit]


def _counts(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and _count(v) for k, v in value.items())


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < INT_LIMIT


def well_formed(name: str, value: Any) -> bool:
    """Whether a metadata field of the right type holds what its readers expect inside."""
    if name in ("probes_attached", "probes_skipped", "argv", "unread"):
        return all(isinstance(item, str) for item in value)
    if name == "rows":
        return _counts(value)
    if name == "bytes":
        return _count(value)
    if name == "rotated_out":
        return _count(value.get("files", 0)) and _count(value.get("bytes", 0)) and _counts(value.get("rows", {}))
    if name in ("started", "ended"):
        return bool(0 <= value < TIME_LIMIT / 1e9)
    return True


def _meta_problem(path: Path, host: str) -> tuple[dict[str, Any] | None, str]:
    """One metadata file: (its content, "") or (None, why it cannot be used)."""
    try:
        meta = loads_bounded(read_regular(path, MAX_META_BYTES))
    except (OSError, ValueError) as exc:
        return None, f"{path}: unreadable recording metadata ({_one_line(exc)})"
    if not isinstance(meta, dict):
        return None, f"{path}: unreadable recording metadata (not a JSON object)"
    version = meta.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in VERSIONS:
        return None, (f"{path}: recording schema version {version!r:.40}, "
                      f"this fdtrace reads versions 1 to {SCHEMA_VERSION}")
    if meta.get("host") != host:
        return None, f"{path}: its host is {meta.get('host')!r:.80}, not {host!r} as its name says"
    wrong = sorted(name for name, types in META_FIELDS.items() if name in meta and (
        not isinstance(meta[name], types) or (isinstance(meta[name], bool) and bool not in types)
        or not well_formed(name, meta[name])))
    for name in wrong:
        del meta[name]
    return meta, f"{path}: ignored fields of the wrong type: {', '.join(wrong)}" if wrong else ""


def read_meta(root: Path, skipped: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Metadata of every host in a recording directory. A host whose metadata cannot be used is
    left out and named in ``skipped`` (when given); raises FdtraceError when no host can be
    read (with the first reason), or when it is not a recording."""
    if not root.is_dir():
        raise FdtraceError(f"{root}: no such recording directory")
    files = sorted((root / "meta").glob("host=*.json"))
    if not files:
        raise FdtraceError(f"{root}: not an fdtrace recording (no meta/host=*.json)")
    metas = {}
    problems = []
    for path in files:
        host = path.name.removeprefix("host=").removesuffix(".json")
        meta, problem = _meta_problem(path, host)
        if problem:
            problems.append(problem)
        if meta is not None:
            metas[host] = meta
        elif skipped is None:
            raise FdtraceError(problem)
    if not metas:
        raise FdtraceError(problems[0])
    if skipped is not None:
        skipped.extend(problems)
    return metas


# The host's lock


@contextmanager
def host_lock(root: Path, host: str, wait_s: float = LOCK_WAIT_S) -> Iterator[bool]:
    """Hold the host's lock shared while the body runs, so that no merge or deletion of its
    parts happens meanwhile; yields whether it is held. Never creates the lock (a recording that
    never merged has none), never waits longer than ``wait_s`` (a writer holds it for the length
    of one merge; someone else holding it for ever cannot stop a reader), and goes on without it
    when it cannot be had: the reader then lists again if a file moved."""
    try:
        fd = os.open(lock_path(root, host), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield False
        return
    try:
        held = False
        if stat.S_ISREG(os.fstat(fd).st_mode):
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    held = True
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.01)
                except OSError:
                    break
        yield held
    finally:
        os.close(fd)


# One part file


@dataclass
class Part:
    """A part file opened for reading (the file itself, so that what is checked is what is
    read), with what its footer says.

    Attributes:
        path: where it is.
        file: the open file.
        parquet: ``pyarrow.parquet.ParquetFile`` over it.
        rows: rows, from the footer.
    """

    path: Path
    file: BinaryIO
    parquet: Any
    rows: int

    @cached_property
    def schema(self) -> Any:
        """Its Arrow schema (made once: pyarrow builds it anew at each ask)."""
        return self.parquet.schema_arrow

    def close(self) -> None:
        """Let go of the file."""
        self.file.close()

    def __enter__(self) -> Part:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def chunk_sizes(self) -> list[tuple[int, dict[str, int]]]:
        """Per row group: its rows and what each top-level column takes decompressed."""
        metadata = self.parquet.metadata
        found = []
        for index in range(metadata.num_row_groups):
            group = metadata.row_group(index)
            sizes: dict[str, int] = {}
            for column in range(group.num_columns):
                chunk = group.column(column)
                name = chunk.path_in_schema.split(".", 1)[0]
                sizes[name] = sizes.get(name, 0) + max(int(chunk.total_uncompressed_size), 0)
            found.append((int(group.num_rows), sizes))
        return found

    def statistics(self, name: str) -> list[tuple[int, Any, Any, int | None]]:
        """Per row group, of a top-level scalar column: (rows, min, max, nulls), min and max as
        stored (integers for integers and times), None where the footer does not say."""
        metadata = self.parquet.metadata
        found = []
        for index in range(metadata.num_row_groups):
            group = metadata.row_group(index)
            chunk = next((group.column(c) for c in range(group.num_columns)
                          if group.column(c).path_in_schema == name), None)
            stats = chunk.statistics if chunk is not None and chunk.is_stats_set else None
            low = high = nulls = None
            if stats is not None:
                if stats.has_min_max:
                    low, high = stats.min_raw, stats.max_raw
                if stats.has_null_count:
                    nulls = int(stats.null_count)
            found.append((int(group.num_rows), low, high, nulls))
        return found

    def key_value(self, key: bytes) -> bytes | None:
        """One key of the footer's key-value metadata."""
        return (self.parquet.metadata.metadata or {}).get(key)


def open_part(path: Path) -> Part:
    """A part file opened and its footer read: a regular file (never a link, FIFO or device),
    Parquet, with a footer of a sane size. Raises OSError (FileNotFoundError when it is gone) or
    ValueError (pyarrow's errors among them) with the reason."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    file = os.fdopen(fd, "rb")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if info.st_size < 12:
            raise ValueError(f"not a Parquet file ({info.st_size} bytes)")
        file.seek(info.st_size - 8)
        tail = file.read(8)
        if tail[4:] != b"PAR1":
            raise ValueError("not a Parquet file (no PAR1 at its end: truncated?)")
        footer = int.from_bytes(tail[:4], "little")
        if footer > min(MAX_FOOTER_BYTES, info.st_size - 12):
            raise ValueError(f"its footer claims {footer:,} bytes, more than the file or fdtrace's bound")
        file.seek(0)
        try:
            parquet = pq.ParquetFile(file)
            rows = int(parquet.metadata.num_rows)
            parquet.schema_arrow  # noqa: B018 - parsed now, so that a bad schema is this file's error
        except pa.ArrowException as exc:
            raise ValueError(str(exc)) from None
        if rows < 0:
            raise ValueError(f"its footer claims {rows} rows")
        return Part(path, file, parquet, rows)
    except BaseException:
        file.close()
        raise


def part_rows(path: Path) -> int:
    """The rows of a part file, from its footer. Raises OSError or ValueError."""
    with open_part(path) as part:
        return part.rows


def _budget(table: str, name: str, rows: int) -> int:
    declared = TABLES_DECLARED[table].field(name).arrow_type
    per_row = COLUMN_BUDGET.get(name, ROW_BUDGET.get(declared, FIXED_BUDGET))
    return rows * per_row + CHUNK_SLACK


def oversized(part: Part, table: str, columns: list[str]) -> dict[int, dict[str, int]]:
    """Per row group, the columns (of ``columns``, by their stored names) whose chunk takes more
    decompressed than its rows can need (:data:`ROW_BUDGET`), with what it takes."""
    declared = set(TABLES_DECLARED[table].columns)
    found: dict[int, dict[str, int]] = {}
    for index, (rows, sizes) in enumerate(part.chunk_sizes()):
        for name in columns:
            current = _current_name(table, name)
            if current in declared and sizes.get(name, 0) > _budget(table, current, rows):
                found.setdefault(index, {})[name] = sizes[name]
    return found


def _current_name(table: str, stored: str) -> str:
    from fdtrace.recording.upgrade import RENAMED

    return next((current for (renamed_table, current), (_, old) in RENAMED.items()
                 if renamed_table == table and old == stored), stored)


#: What a text value that was too long to read at all reads as.
NOT_READ = "(too long to read)"


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def _stand_in(kind: Any, rows: int) -> Any:
    """What the rows of a column chunk that was not read hold: NOT_READ for text, empty lists,
    nulls for anything else."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.array([NOT_READ] * rows, pa.string()).cast(kind)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.array([[]] * rows, kind)
    return pa.nulls(rows, kind)


def _read_columns(part: Part, table: str, wanted: list[str], notes: list[str]) -> Any:
    """The stored columns ``wanted`` of a part; a column chunk over its budget is not read (its
    rows hold NOT_READ there, or no value), and named."""
    import pyarrow as pa

    refused = oversized(part, table, wanted)
    if not refused:
        return part.parquet.read(columns=wanted)
    schema = part.schema
    groups = []
    for index in range(part.parquet.metadata.num_row_groups):
        left_out = refused.get(index, {})
        data = part.parquet.read_row_group(index, columns=[c for c in wanted if c not in left_out])
        for name in left_out:
            data = data.append_column(schema.field(name), _stand_in(schema.field(name).type, data.num_rows))
        groups.append(data.select(wanted))
    for name in sorted({n for group in refused.values() for n in group}):
        taken = sum(group[name] for group in refused.values() if name in group)
        rows = sum(part.parquet.metadata.row_group(i).num_rows for i, group in refused.items() if name in group)
        notes.append(f"{part.path}: {name} of {_plural(rows, 'row')} not read ({taken:,} bytes decompressed, more "
                     f"than fdtrace reads for {_plural(rows, 'row')}): read as {NOT_READ!r}")
    return pa.concat_tables(groups)


def _cut(array: Any) -> tuple[Any, int]:
    """``array`` with every text value (inside lists and structs too) of more than MAX_TEXT
    characters cut to MAX_TEXT; and how many were."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        long = pc.fill_null(pc.greater(pc.utf8_length(array), MAX_TEXT), False)
        count = int(pc.sum(long).as_py() or 0)
        if count:
            array = pc.if_else(long, pc.utf8_slice_codeunits(array, 0, MAX_TEXT), array)
        return array, count
    if pa.types.is_dictionary(kind):
        values, cut_values = _cut(array.dictionary)
        if not cut_values:
            return array, 0
        long = pc.fill_null(pc.greater(pc.utf8_length(array.dictionary), MAX_TEXT), False)
        count = int(pc.sum(pc.is_in(array.indices, value_set=pc.indices_nonzero(long).cast(array.indices.type)))
                    .as_py() or 0)
        plain = pc.take(values, array.indices)
        return plain.dictionary_encode().cast(kind), count
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        values, count = _cut(array.values)
        if not count:
            return array, 0
        rebuilt = type(array).from_arrays(array.offsets, values, mask=array.is_null())
        return rebuilt, count
    if pa.types.is_struct(kind):
        children, count = [], 0
        for index in range(kind.num_fields):
            child, cut_child = _cut(array.field(index))
            children.append(child)
            count += cut_child
        if not count:
            return array, 0
        return pa.StructArray.from_arrays(children, fields=list(kind), mask=array.is_null()), count
    return array, 0


def _sane(table: str, data: Any, path: Path, notes: list[str]) -> Any:
    """A part's rows (already upgraded) without what cannot be true: text cut to MAX_TEXT; a row
    without a value its table requires, or with a time before 1970 or after 2116, left out;
    a negative count or an integer beyond any count read as missing. What changed is named."""
    import pyarrow as pa
    import pyarrow.compute as pc

    declared = TABLES_DECLARED[table]
    cut: dict[str, int] = {}
    columns = []
    for name in data.column_names:
        column = data[name]
        chunks = []
        for chunk in column.chunks:
            chunk, count = _cut(chunk)
            chunks.append(chunk)
            if count:
                cut[name] = cut.get(name, 0) + count
        columns.append(pa.chunked_array(chunks, type=chunks[0].type if chunks else column.type))
    if cut:
        data = pa.Table.from_arrays(columns, schema=data.schema)
        notes.append(f"{path}: {_plural(sum(cut.values()), 'value')} longer than {MAX_TEXT} characters cut to them ("
                     + ", ".join(f"{name} {n:,}" for name, n in sorted(cut.items())) + ")")
    keep = None
    out_of_range: set[str] = set()
    dropped: dict[str, int] = {}
    impossible: dict[str, int] = {}
    for spec in declared.fields:
        if spec.name not in data.column_names:
            continue
        column = data[spec.name]
        bad = None
        if spec.arrow_type in ("int64", "int32", "int16", "timestamp_utc"):
            numbers = column.cast(pa.int64()) if spec.arrow_type == "timestamp_utc" else column
            plausible = PLAUSIBLE.get((table, spec.name))
            if plausible is not None:
                bad = pc.or_(pc.less(numbers, plausible[0]), pc.greater(numbers, plausible[1]))
            elif spec.name in TIME_COLUMNS:
                bad = pc.or_(pc.less(numbers, 0), pc.greater_equal(numbers, TIME_LIMIT))
            elif spec.name in NON_NEGATIVE.get(table, ()):
                bad = pc.or_(pc.less(numbers, 0), pc.greater_equal(numbers, INT_LIMIT))
            elif spec.arrow_type == "int64" and spec.name not in UNBOUNDED:
                bad = pc.or_(pc.less_equal(numbers, -INT_LIMIT), pc.greater_equal(numbers, INT_LIMIT))
            bad = pc.fill_null(bad, False) if bad is not None else None
        missing = pc.is_null(column) if not spec.nullable else None
        if bad is not None and pc.any(bad).as_py():
            out_of_range.add(spec.name)
            if spec.nullable and (table, spec.name) not in MISSING_MEANS:
                impossible[spec.name] = int(pc.sum(bad).as_py())
                data = data.set_column(data.column_names.index(spec.name), spec.name,
                                       pc.if_else(bad, pa.scalar(None, column.type), column))
            else:
                missing = bad if missing is None else pc.or_(missing, bad)
        if missing is not None and pc.any(missing).as_py():
            dropped[spec.name] = int(pc.sum(missing).as_py())
            keep = pc.invert(missing) if keep is None else pc.and_(keep, pc.invert(missing))
    if keep is not None:
        before = data.num_rows
        data = data.filter(keep)
        checked = set(TIME_COLUMNS) | {name for name in out_of_range if (table, name) in PLAUSIBLE}
        reasons = ", ".join(f"{name} {'missing or impossible' if name in checked else 'missing'} ({n:,})"
                            for name, n in sorted(dropped.items()))
        when = "; times must be from 1970 to 2116" if any(name in TIME_COLUMNS for name in dropped) else ""
        ranges = sorted(name for name in dropped if (table, name) in PLAUSIBLE and name in out_of_range)
        if ranges:
            when += "; " + ", ".join(f"{name} from {PLAUSIBLE[table, name][0]:,} to {PLAUSIBLE[table, name][1]:,}"
                                     for name in ranges)
        notes.append(f"{path}: {before - data.num_rows:,} of {_plural(before, 'row')} left out ({reasons}{when})")
    if impossible:
        ranges = sorted(name for name in impossible if (table, name) in PLAUSIBLE)
        bounds = "".join(f", {name} from {PLAUSIBLE[table, name][0]:,} to {PLAUSIBLE[table, name][1]:,}"
                         for name in ranges)
        notes.append(f"{path}: {_plural(sum(impossible.values()), 'impossible value')} read as missing ("
                     + ", ".join(f"{name} {n:,}" for name, n in sorted(impossible.items()))
                     + f"; counts cannot be negative, nor any number 2^62 or more{bounds})")
    return data


_allowed: list[tuple[float, int | None]] = []


def _memory_allowed() -> int | None:
    """``memory_allowed()``, read again at most every MEMORY_FIGURE_S."""
    from fdtrace.procfs.memory import memory_allowed

    now = time.monotonic()
    if not _allowed or now - _allowed[0][0] > MEMORY_FIGURE_S:
        _allowed[:] = [(now, memory_allowed())]
    return _allowed[0][1]


def _size(count: float) -> str:
    return f"{count / (1 << 30):,.1f} GiB" if count >= 1 << 30 else f"{count / (1 << 20):,.0f} MiB"


def check_memory(part: Part, columns: int) -> None:
    """Refuse to decode a part whose rows, as its footer counts them, would not fit in the memory
    this process may still use (the lowest of its memory cgroup's limit and MemAvailable, less
    what it holds now): a planted part of millions of copies of one row takes a few hundred KB on
    disk and gigabytes decoded. Raises FdtraceError (one line)."""
    from fdtrace.procfs.memory import resident_bytes

    need = part.rows * max(columns, 1) * DECODED_BYTES_PER_VALUE
    allowed = _memory_allowed()
    if allowed is None or need < CHUNK_SLACK:
        return
    held = resident_bytes() or 0
    if held + need > allowed:
        raise FdtraceError(f"{part.path}: its footer counts {part.rows:,} rows, about {_size(need)} to decode, more "
                           f"than the {_size(max(allowed - held, 0))} this process may still use (its memory cgroup's "
                           f"limit or MemAvailable, {_size(allowed)}): not read (a damaged or planted file, or one "
                           "to read on a machine with more memory)")


#: The errno names a kernel's errors have (and "" for none): any other value is shown as "errno N".
KNOWN_ERRNOS = frozenset({"", *errno.errorcode.values()})
_ERRNO_NUMBER = re.compile(r"E?(\d{1,4})")


def _kinds() -> frozenset[str]:
    from fdtrace.schema.events import KIND_LABELS

    return frozenset(KIND_LABELS.values())


def _errno_shown(value: str) -> str:
    """How an errno no kernel names is shown: "errno N" (the decoder writes E<N> for a number
    Python has no name for), "errno ?" when it is no number either."""
    number = _ERRNO_NUMBER.fullmatch(value)
    return f"errno {int(number[1])}" if number else "errno ?"


def known_enum(name: str, value: str | None) -> bool:
    """Whether ``value`` of the events' ``kind`` or ``errno`` is one fdtrace knows (a missing
    value is): what ``unknown_enums`` checks, for an engine that reads the values itself."""
    return value is None or value in (_kinds() if name == "kind" else KNOWN_ERRNOS)


def unknown_enums(part: Part) -> str:
    """Why an events part holds values no engine may read as they are ("" when it does not): a
    kind fdtrace does not know, or an errno no kernel names. Read column by column, a million
    rows at a time."""
    present = [name for name in ("kind", "errno") if name in part.schema.names]
    if not present:
        return ""
    import pyarrow as pa
    import pyarrow.compute as pc

    kinds = _kinds()
    try:
        for batch in part.parquet.iter_batches(batch_size=1 << 20, columns=present):
            for name in present:
                column = batch.column(name)
                if pa.types.is_dictionary(column.type):  # the entries its rows use, not a string a row
                    column = column.dictionary.take(pc.unique(column.indices).drop_null())
                values = pc.unique(column.cast(pa.string())).to_pylist()
                known = kinds if name == "kind" else KNOWN_ERRNOS
                if any(value is not None and value not in known for value in values):
                    return f"its {name} holds values fdtrace does not know"
    except (OSError, ValueError, pa.ArrowException):
        return "its kind or errno cannot be read"  # its reader says why
    return ""


def _enums(table: str, data: Any, path: Path, notes: list[str]) -> Any:
    """An events part's rows with each errno no kernel names shown as "errno N" (counted, never
    dropped: they are failed calls), and without the rows of a kind fdtrace does not know; each
    named in one line with its count."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table != "events":
        return data
    if "errno" in data.column_names:
        column = data["errno"]
        text = column.cast(pa.string())
        distinct = pc.unique(text)
        unknown = [v for v in distinct.to_pylist() if v is not None and v not in KNOWN_ERRNOS]
        if unknown:
            mapped = pa.array([_errno_shown(v) if v in unknown else v for v in distinct.to_pylist()], pa.string())
            changed = mapped.take(pc.index_in(text, value_set=distinct))
            counts = {str(row["values"]): int(row["counts"]) for row in pc.value_counts(text).to_pylist()}
            data = data.set_column(data.column_names.index("errno"), "errno", changed.cast(column.type))
            said = ", ".join(f"{_errno_shown(v)} {counts.get(v, 0):,}" for v in sorted(unknown, key=str)[:5])
            notes.append(f"{path}: {_plural(sum(counts.get(v, 0) for v in unknown), 'call')} with an errno no kernel "
                         f"names, counted as failed calls and shown by number ({said})")
    if "kind" in data.column_names:
        kinds = data["kind"].cast(pa.string())
        known = pc.is_in(kinds, value_set=pa.array(sorted(_kinds())))
        if not pc.all(pc.fill_null(known, False)).as_py():
            before = data.num_rows
            data = data.filter(pc.fill_null(known, False))
            notes.append(f"{path}: {before - data.num_rows:,} of {_plural(before, 'row')} left out (a kind fdtrace "
                         "does not know)")
    return data


def read_part(part: Part, table: str, version: int, columns: list[str] | None, notes: list[str]) -> Any:
    """The rows of one opened part, in the current declaration of ``table`` (the one upgrade
    step), bounded and checked (see the module's doc); what was left out or cut is named in
    ``notes``. Raises OSError or ValueError (pyarrow's errors among them) when it cannot be read,
    FdtraceError when its rows would not fit in memory (``check_memory``)."""
    import pyarrow as pa

    present = set(part.schema.names)
    names = list(columns) if columns is not None else list(TABLES_DECLARED[table].columns)
    wanted = [c for c in stored_names(table, names, version) if c in present]
    check_memory(part, len(wanted))
    try:
        data = _read_columns(part, table, list(dict.fromkeys(wanted)), notes)
        data = data.replace_schema_metadata(None)  # a planted 'pandas' key is never parsed
        data = upgrade(table, data, version, columns)
        return _enums(table, _sane(table, data, part.path, notes), part.path, notes)
    except pa.ArrowException as exc:
        raise ValueError(str(exc)) from None


#: Stored types that read as each declared type exactly (a cast that cannot fail or lose).
_NATIVE = {
    "int64": ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "null"),
    "int32": ("int8", "int16", "int32", "uint8", "uint16", "null"),
    "int16": ("int8", "int16", "uint8", "null"),
    "bool": ("bool", "null"),
    "string": ("string", "large_string", "null"),
    "dict_string": ("string", "large_string", "null"),
}


def _native(declared: str, stored: Any) -> bool:
    import pyarrow as pa

    if declared == "timestamp_utc":
        return bool(pa.types.is_timestamp(stored) and stored.tz in (None, "UTC", "+00:00"))
    if declared in ("string", "dict_string") and pa.types.is_dictionary(stored):
        return pa.types.is_integer(stored.index_type) and str(stored.value_type) in ("string", "large_string")
    if declared in ("string_list", "errors_list"):
        return True  # not in the engines' views
    return str(stored) in _NATIVE.get(declared, ())


def doubts(part: Part, table: str, version: int, enums: bool = True) -> str:
    """Why a part cannot be read by an engine straight from the file, as it is ("" when it can):
    a column of another type than its declaration's, a chunk over its budget, or statistics
    that do not show every value to be possible (a missing value where one is required, a time
    or a count out of range, or no statistics to tell), or (``enums``) an events part's kind or
    errno that fdtrace does not know (``unknown_enums``: the caller that passes False checks the
    values itself). Such a part is read by ``read_part``, which checks every value."""
    from fdtrace.recording.upgrade import RENAMED

    declared = TABLES_DECLARED[table]
    stored = {name: part.schema.field(name).type for name in part.schema.names}
    for spec in declared.stored_fields:
        last, old = RENAMED.get((table, spec.name), (0, ""))
        name = old if spec.name not in stored and version <= last and old in stored else spec.name
        if name not in stored:
            if not spec.nullable:
                return f"it lacks {spec.name}"
            continue
        if not _native(spec.arrow_type, stored[name]):
            return f"its {name} is {stored[name]}, not {spec.arrow_type}"
        if spec.arrow_type in ("string_list", "errors_list") or str(stored[name]) == "null":
            continue
        plausible = PLAUSIBLE.get((table, spec.name))
        checked_range = (spec.arrow_type in ("int64", "timestamp_utc") and spec.name not in UNBOUNDED) or \
            plausible is not None
        if spec.nullable and not checked_range:
            continue
        for rows, low, high, nulls in part.statistics(name):
            if not rows:
                continue
            if not spec.nullable and nulls != 0:
                return f"its {name} may lack values"
            if not checked_range or nulls == rows:
                continue
            if low is None or high is None:
                return f"its {name} has no statistics"
            floor = 0 if spec.name in TIME_COLUMNS or spec.name in NON_NEGATIVE.get(table, ()) else 1 - INT_LIMIT
            ceiling = TIME_LIMIT if spec.name in TIME_COLUMNS else INT_LIMIT
            if plausible is not None:
                floor, ceiling = plausible[0], plausible[1] + 1
            if not floor <= int(low) <= int(high) < ceiling:
                return f"its {name} holds impossible values"
    big = oversized(part, table, [n for n in stored if n in declared.columns or _current_name(table, n) != n])
    if big:
        return "a column chunk larger than its rows can need"
    return unknown_enums(part) if table == "events" and enums else ""


# The part list of a host


@dataclass
class Listing:
    """One host's part files of one table, as one snapshot: what to read, and what was left out."""

    paths: list[Path]
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _regular_names(folder: Path, skipped: list[str]) -> list[str]:
    """The names of part files in a folder that are regular files (the others are named)."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    except OSError as exc:
        skipped.append(f"{folder}: cannot be listed ({_one_line(exc)})")
        return []
    names = []
    odd = []
    for entry in entries:
        if entry.name.startswith("."):
            continue  # a writer's file being written (hidden until renamed)
        covered = part_range(Path(entry.name))
        if covered is None or part_name(*covered) != entry.name:
            odd.append(entry.name)
            continue
        try:
            regular = entry.is_file(follow_symlinks=False)
        except OSError:
            regular = False
        if regular:
            names.append(entry.name)
        else:
            skipped.append(f"{folder / entry.name}: not a regular file")
    if odd:
        skipped.append(outside_layout(folder, odd))
    return names


def outside_layout(folder: Path, names: list[str]) -> str:
    """The one line that names the files of a table's folder whose names the writer never makes
    (a part is part-NNNNNN.parquet or part-NNNNNN-NNNNNN.parquet; ``part-3.parquet`` or a copy
    ``part-000003 (1).parquet`` would otherwise be read as another flush, or hide one)."""
    shown_names = ", ".join(shown(name) for name in sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    return (f"{folder}: {_plural(len(names), 'file')} named outside the layout (part-NNNNNN.parquet, "
            f"part-NNNNNN-NNNNNN.parquet) not read: {shown_names}")


def _signature(path: Path) -> tuple[Any, ...] | None:
    """What no two parts of one table and host share: their rows and the range of their times
    (from the footer), None when the footer does not say (no rows, or no statistics)."""
    try:
        with open_part(path) as part:
            if not part.rows:
                return None
            for name in TIME_COLUMNS:
                if name in part.schema.names:
                    ranges = part.statistics(name)
                    if all(low is not None and high is not None for _, low, high, _ in ranges):
                        return (part.rows, name, *((low, high) for _, low, high, _ in ranges))
    except (OSError, ValueError):
        return None  # unreadable: its reader names it
    return None


def without_copies(folder: Path, names: list[str], notes: list[str]) -> list[str]:
    """``names`` (the final list of a table's parts of one host, in order) with each part read
    once: a part holding the same rows at the same times as an earlier one (a copy planted under
    another flush's name, or a file copied twice) is left out, and all of them are named in one
    line of ``notes``."""
    seen: dict[tuple[Any, ...], str] = {}
    copies: list[str] = []
    kept = []
    for name in names:
        signature = _signature(folder / name)
        if signature is not None and signature in seen:
            copies.append(f"{shown(name)} (of {shown(seen[signature])})")
            continue
        if signature is not None:
            seen[signature] = name
        kept.append(name)
    if copies:
        notes.append(f"{folder}: {_plural(len(copies), 'part')} holding the same rows at the same times as another "
                     f"part, read once: {', '.join(copies[:3])}{', ...' if len(copies) > 3 else ''}")
    return kept


def _believed(folder: Path, names: list[str], skipped: list[str], notes: list[str]) -> list[str]:
    """``part_names`` of ``names``, where a merged file that covers parts still there is read
    only when it holds at least their rows (the parts read instead of one that does not, or of
    one whose footer cannot be read). Raises FileNotFoundError when a file went meanwhile."""
    rows: dict[str, int | None] = {}

    def rows_of(name: str) -> int | None:
        if name not in rows:
            try:
                rows[name] = part_rows(folder / name)
            except FileNotFoundError:
                raise
            except (OSError, ValueError):
                rows[name] = None
        return rows[name]

    rejected: set[str] = set()
    while True:
        doubted = None
        for name, covered in _covering(n for n in names if n not in rejected).items():
            first, last = part_range(Path(name)) or (0, 0)
            own = rows_of(name)
            instead = part_names(covered)  # what would be read in its place
            theirs = sum(rows_of(n) or 0 for n in instead)
            if own is None:
                doubted = name
                skipped.append(f"{folder / name}: unreadable footer; the {len(instead)} parts it would cover "
                               "are read instead")
            elif own < theirs:
                doubted = name
                notes.append(f"{folder / name}: ignored: its name claims flushes {first} to {last}, but it holds "
                             f"{own:,} rows, fewer than the {theirs:,} of the {len(instead)} parts it would cover "
                             "(those are read instead)")
            if doubted:
                break
        if doubted is None:
            return part_names(n for n in names if n not in rejected)
        rejected.add(doubted)


def _covering(names: Iterator[str] | list[str]) -> dict[str, list[str]]:
    """Of part names, those ``part_names`` keeps that cover others it leaves out, with those.
    In order of their first flush, a name left out lies within the kept one that reaches
    furthest so far (it starts no later and ends no earlier), so one pass finds them."""
    ranges = sorted((covered[0], -covered[1], name) for name in names
                    if (covered := part_range(Path(name))) is not None)
    found: dict[str, list[str]] = {}
    reach, holder = 0, ""
    for _first, negative_last, name in ranges:
        if -negative_last > reach:
            reach, holder = -negative_last, name
        elif holder:
            found.setdefault(holder, []).append(name)
    return found


def list_parts(root: Path, table: str, host: str) -> Listing:
    """One host's part files of ``table`` as its folder lists them (a recording written before
    manifests), in order, under the host's writers' lock (held shared for the listing only):
    regular files only, a merged file instead of the parts it covers when it holds their rows
    (see ``_believed``). An older recorder may merge meanwhile: then the folder is listed again."""
    folder = host_dir(root, table, host)
    for _ in range(RELISTS + 1):
        listing = Listing([])
        with host_lock(root, host):
            names = _regular_names(folder, listing.skipped)
        try:
            kept = _believed(folder, names, listing.skipped, listing.notes)
        except FileNotFoundError:  # a merge moved a file after the listing: take it again
            continue
        listing.paths = [folder / name for name in without_copies(folder, kept, listing.notes)]
        return listing
    with host_lock(root, host):  # the writer keeps merging: list and check under its lock
        listing = Listing([])
        names = _regular_names(folder, listing.skipped)
        try:
            kept = _believed(folder, names, listing.skipped, listing.notes)
            listing.paths = [folder / n for n in without_copies(folder, kept, listing.notes)]
        except FileNotFoundError as exc:
            listing.skipped.append(f"{folder}: its parts kept changing while read ({_one_line(exc)})")
    return listing


class HostSnapshot:
    """One host's recording as one state its writer published (``fdtrace.recording.manifest``):
    the readers' lock taken shared, then the manifest read; every table's parts are the
    manifest's, and stay on disk until ``close()``, whatever the recorder merges or rotates out
    meanwhile. A recording without a manifest (written by an older fdtrace) is listed table by
    table instead (``list_parts``), as before.

    Attributes:
        root: the recording directory.
        host: the host.
        generation: the manifest's generation (None: no usable manifest, the folders are listed).
        held: whether the readers' lock is held (with a manifest: its parts cannot go).
        counts: the metadata's counts at that state (rows, bytes, rotated_out), from the manifest.
        skipped: what could not be used (an unusable manifest, parts it names that are not there).
        notes: how it was read, when not as one steady state (no readers' lock).
    """

    def __init__(self, root: Path, host: str, wait_s: float = LOCK_WAIT_S) -> None:
        self.root = root
        self.host = host
        self.generation: int | None = None
        self.held = False
        self.counts: dict[str, Any] = {}
        self.skipped: list[str] = []
        self.notes: list[str] = []
        self._names: dict[str, list[str]] = {}
        self._listings: dict[str, Listing] = {}
        self._fd = -1
        self._take(wait_s)

    @property
    def steady(self) -> bool:
        """Whether its parts stay as listed until it is closed (a manifest read under the lock)."""
        return self.held and self.generation is not None

    def _take(self, wait_s: float) -> None:
        from fdtrace.recording.manifest import MAX_MANIFEST_BYTES, Manifest, manifest_name, readers_lock_name

        meta = self.root / "meta"
        manifest_path = meta / manifest_name(self.host)
        try:
            os.lstat(manifest_path)
        except FileNotFoundError:
            return  # written before manifests: listed
        except OSError as exc:
            self.skipped.append(f"{manifest_path}: cannot be looked at ({_one_line(exc)}): the parts are listed")
            return
        lock_path_ = meta / readers_lock_name(self.host)
        why = self._lock(lock_path_, wait_s)
        try:
            manifest = Manifest.decode(loads_bounded(read_regular(manifest_path, MAX_MANIFEST_BYTES)))
        except (OSError, ValueError) as exc:
            self.skipped.append(f"{manifest_path}: unusable manifest ({_one_line(exc)}): the part files are "
                                "listed instead")
            self.close()
            return
        if why:
            self.notes.append(f"{lock_path_}: read without the readers' lock ({why}): parts the recorder merges or "
                              "rotates out while this reads may be missing")
        self.generation = manifest.generation
        self._names = manifest.parts
        self.counts = manifest.counts

    def _lock(self, path: Path, wait_s: float) -> str:
        """Hold the readers' lock shared ("" when held, else why not). A writer holds it
        exclusively only while it deletes parts; past ``wait_s`` (someone holding it for ever)
        the reader goes on without it."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            return f"cannot open it: {_one_line(exc)}"
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return "not a regular file"
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return f"held exclusively for more than {wait_s:g} s"
                time.sleep(0.005)
            except OSError as exc:
                os.close(fd)
                return _one_line(exc)
        self._fd, self.held = fd, True
        return ""

    def listing(self, table: str) -> Listing:
        """The part files of ``table`` to read (see the class's doc), in order: regular files
        only, a merged file instead of the parts it covers when it holds their rows."""
        if table not in self._listings:
            self._listings[table] = self._listed(table)
        return self._listings[table]

    def _listed(self, table: str) -> Listing:
        if self.generation is None:
            return list_parts(self.root, table, self.host)
        folder = host_dir(self.root, table, self.host)
        listing = Listing([])
        present, missing = [], []
        for name in self._names.get(table, []):
            try:
                info = os.lstat(folder / name)
            except FileNotFoundError:
                missing.append(name)
                continue
            except OSError as exc:
                listing.skipped.append(f"{folder / name}: {_one_line(exc)}")
                continue
            if stat.S_ISREG(info.st_mode):
                present.append(name)
            else:
                listing.skipped.append(f"{folder / name}: not a regular file")
        if missing:
            listing.skipped.append(f"{folder}: {_plural(len(missing), 'part file')} of its manifest "
                                   f"(generation {self.generation}) not there, {missing[0]} first")
        try:
            listing.paths = [folder / n for n in _believed(folder, present, listing.skipped, listing.notes)]
        except FileNotFoundError as exc:  # only without the readers' lock
            listing.skipped.append(f"{folder}: a part went while it was listed ({_one_line(exc)})")
        return listing

    def close(self) -> None:
        """Let go of the readers' lock: the recorder may delete what it retired."""
        fd, self._fd, self.held = self._fd, -1, False
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> HostSnapshot:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def read_parts(root: Path, table: str, host: str, skipped: list[str], columns: list[str] | None = None,
               version: int = SCHEMA_VERSION, notes: list[str] | None = None,
               snapshot: HostSnapshot | None = None) -> Any:
    """One host's part files of ``table`` as one ``pyarrow.Table`` of the current declaration of
    that table (None when there are none), whatever version wrote them: the one upgrade step.
    Unreadable parts are named in ``skipped``, parts read in part in ``notes`` (in ``skipped``
    when None). ``columns``: only these; ``version``: the schema version its metadata gives.
    ``snapshot``: the host's state to read (several tables of one state); without one, one is
    taken for this table. A recording that is not read as one steady state (no manifest, or no
    readers' lock) is listed again when a part went after the listing."""
    import pyarrow as pa

    notes = skipped if notes is None else notes
    own = snapshot is None
    current = HostSnapshot(root, host) if snapshot is None else snapshot
    try:
        for attempt in range(RELISTS + 1):
            last = attempt == RELISTS or current.steady
            listing = current.listing(table)
            parts, said, moved = [], list(listing.notes), False
            problems = list(current.skipped) + list(listing.skipped)
            with host_lock(root, host) if last and current.generation is None else _nothing():
                for path in listing.paths:
                    try:
                        with open_part(path) as part:
                            parts.append(read_part(part, table, version, columns, said))
                    except FileNotFoundError:
                        if not last:
                            moved = True
                            break
                        problems.append(f"{path}: gone while it was read")
                    except (OSError, ValueError, pa.ArrowException) as exc:
                        problems.append(f"{path}: {_one_line(exc)}")
            if moved:  # not one steady state: take the host's state again
                if own:
                    current.close()
                current, own = HostSnapshot(root, host), True
                continue
            skipped.extend(p for p in problems if p not in skipped)
            notes.extend(n for n in [*current.notes, *said] if n not in notes)
            return pa.concat_tables(parts, promote_options="default") if parts else None
        raise AssertionError("unreachable")
    finally:
        if own:
            current.close()


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def read_table(root: Path, table: str, hosts: dict[str, int], skipped: list[str],
               columns: list[str] | None = None, notes: list[str] | None = None,
               snapshots: dict[str, HostSnapshot] | None = None) -> Any:
    """One table of some hosts of a recording as a DataFrame (``host`` categorical, in time
    order), upgraded to the current declaration; unreadable parts are named in ``skipped``,
    parts read in part in ``notes``; ``snapshots``: the hosts' states to read (by host)."""
    import pandas as pd
    import pyarrow as pa

    frames = []
    for host, version in sorted(hosts.items()):
        data = read_parts(root, table, host, skipped, columns, version, notes, (snapshots or {}).get(host))
        if data is None:
            continue
        # 64-bit stack ids do not survive float64 (pandas' type for an int column with nulls)
        ids = data["stack_id"].to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get) \
            if "stack_id" in data.column_names else None
        frame = data.to_pandas(split_blocks=True, self_destruct=True)  # frees Arrow memory as it goes
        del data
        if ids is not None:
            frame["stack_id"] = ids.values
        frame.insert(0, "host", host)
        frames.append(frame)
    if not frames:  # no rows: still the declared columns, so an empty recording reports as empty
        schema = TABLES_DECLARED[table].arrow_schema(with_optional=())
        empty = schema.empty_table().to_pandas()
        if "host" not in empty.columns:
            empty.insert(0, "host", pd.Series([], dtype="category"))
        if columns is not None:
            empty = empty[[c for c in empty.columns if c in columns or c == "host"]]
        return empty
    result = pd.concat(frames, ignore_index=True)
    result["host"] = result["host"].astype("category")
    for column in ("comm", "kind", "syscall", "errno", "signal"):
        if column in result.columns and result[column].dtype == object:
            result[column] = result[column].astype("category")
    # Wall time orders several hosts together; monotonic stamps only compare within one host.
    order = ["time"] if "time" in result.columns else ["host", "ts_ns"] if "ts_ns" in result.columns else []
    if order:
        result = result.sort_values(order, kind="stable", ignore_index=True)
    return result
