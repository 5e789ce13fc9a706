"""The manifest of one host's recording, and the readers' lock: how a reader sees one whole state
of a recording that its recorder is still flushing, merging and rotating out (issue 39).

- ``meta/.host=NAME.parts.json``, the manifest: the part files that make up each table now, with
  a generation number that grows by one at each change, and the counts of the metadata at that
  state (rows written, rows rotated out). The writer (the recorder, ``fdtrace compact``,
  ``append_part``) publishes it whole, under a temporary name renamed over it, relative to the
  held ``meta/`` folder, after every flush, merge and rotation, while it holds the host's
  writers' lock (``layout.lock_name``). Readers take the part list from it, never from a
  listing of the folders (a recording written before manifests has none: it is listed).
- ``meta/.host=NAME.readers``, the readers' lock: a reader holds it shared from before it reads
  the manifest until it has read what it needs (an engine's views: until it is closed). Part
  files that a merge or a rotation took out of the manifest are ``retired``: they stay on disk,
  named in the manifest, until a writer takes the readers' lock exclusively without waiting
  (``LOCK_EX|LOCK_NB``), then are deleted; while a reader holds it, the deletion waits for the
  writer's next flush, merge or close. The writer never waits for a reader, and a reader never
  races a deletion. The lock file is made private (0600) even in a ``--shared`` recording, so
  that only its owner (root) can hold deletions back; a reader that cannot open it reads
  without it and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fdtrace.recording.layout import TABLES, part_name, part_range

#: The manifest format this fdtrace writes and reads.
MANIFEST_VERSION = 1
#: A manifest is read up to this size (runs of flushes keep it small; a merged file is one item).
MAX_MANIFEST_BYTES = 16 << 20
#: Part files a manifest may name for one host, runs expanded: more is refused as damaged.
MAX_PARTS = 1 << 20


def manifest_name(host: str) -> str:
    """The name of a host's manifest in ``meta/``."""
    return f".host={host}.parts.json"


def readers_lock_name(host: str) -> str:
    """The name of a host's readers' lock in ``meta/``."""
    return f".host={host}.readers"


@dataclass
class Manifest:
    """One published state of a host's recording.

    Attributes:
        generation: grows by one at each state published.
        parts: per table, the names of its part files, in order.
        retired: per table, part files taken out of ``parts`` that are still to be deleted
            (when no reader holds the readers' lock).
        counts: ``rows``, ``bytes`` and ``rotated_out`` as the metadata has them, at this state.
    """

    generation: int = 0
    parts: dict[str, list[str]] = field(default_factory=dict)
    retired: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The manifest's JSON: each table's parts as runs (``[first, last, 1]``: every flush's
        own part from first to last; ``[first, last]``: one file covering them), so that a
        recording of many unmerged flushes keeps a small manifest."""
        import json

        tables = {table: _runs(names) for table, names in self.parts.items() if names}
        retired = {table: sorted(names) for table, names in self.retired.items() if names}
        return json.dumps({"version": MANIFEST_VERSION, "generation": self.generation, "parts": tables,
                           "retired": retired, "counts": self.counts}, sort_keys=True).encode()

    @classmethod
    def decode(cls, value: Any) -> Manifest:
        """A manifest from its parsed JSON (``reader.loads_bounded``). Raises ValueError, with
        the reason, for anything that is not one as this fdtrace writes it."""
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        if value.get("version") != MANIFEST_VERSION or isinstance(value.get("version"), bool):
            raise ValueError(f"manifest version {value.get('version')!r:.40}, this fdtrace reads {MANIFEST_VERSION}")
        generation = value.get("generation")
        if not isinstance(generation, int) or not _natural(generation):
            raise ValueError("its generation is not a count")
        tables, retired = value.get("parts", {}), value.get("retired", {})
        counts = value.get("counts", {})
        if not isinstance(tables, dict) or not isinstance(retired, dict) or not isinstance(counts, dict):
            raise ValueError("its parts, retired parts or counts are not objects")
        found = cls(generation, counts=counts)
        total = 0
        for table, runs in tables.items():
            if table not in TABLES:
                continue
            if not isinstance(runs, list):
                raise ValueError(f"its {table:.40} parts are not a list")
            names = found.parts.setdefault(table, [])
            for run in runs:
                expanded = _expand(run, MAX_PARTS - total)
                total += len(expanded)
                names += expanded
        for table, names in retired.items():
            if table not in TABLES:
                continue
            if not isinstance(names, list) or not all(isinstance(n, str) and _is_part(n) for n in names):
                raise ValueError(f"its retired {table:.40} parts are not part names")
            total += len(names)
            if total > MAX_PARTS:
                raise ValueError(f"it names more than {MAX_PARTS:,} part files")
            found.retired[table] = list(names)
        return found


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62


def _is_part(name: str) -> bool:
    covered = part_range(Path(name))
    return covered is not None and "/" not in name and part_name(*covered) == name


def _runs(names: list[str]) -> list[list[int]]:
    runs: list[list[int]] = []
    for name in names:
        covered = part_range(Path(name))
        if covered is None:
            continue
        first, last = covered
        if first == last and runs and len(runs[-1]) == 3 and runs[-1][1] + 1 == first:
            runs[-1][1] = first
        elif first == last:
            runs.append([first, last, 1])
        else:
            runs.append([first, last])
    return runs


def _expand(run: Any, room: int) -> list[str]:
    """The part names a run of the manifest stands for (see ``Manifest.encode``)."""
    if not isinstance(run, list) or len(run) not in (2, 3) or not all(_natural(v) for v in run[:2]):
        raise ValueError("a run of parts that is not [first, last] or [first, last, 1]")
    first, last = run[0], run[1]
    if not 1 <= first <= last < 10**12:
        raise ValueError(f"a run of parts from {first} to {last}")
    if len(run) == 2:
        if room < 1:
            raise ValueError(f"it names more than {MAX_PARTS:,} part files")
        return [part_name(first, last)]
    if run[2] != 1 or isinstance(run[2], bool):
        raise ValueError("a run of parts of an unknown kind")
    if last - first + 1 > room:
        raise ValueError(f"it names more than {MAX_PARTS:,} part files")
    return [part_name(number, number) for number in range(first, last + 1)]
