"""The one upgrade step: a part file written by any known schema version, brought to the
current declaration of its table (``fdtrace.schema.tables``)."""

from __future__ import annotations

from typing import Any

from fdtrace.schema import TABLES
from fdtrace.schema.fields import arrow_type

#: Values a version lacked but that are known for it (not null): (version, table, column) -> value.
KNOWN_DEFAULTS: dict[tuple[int, str, str], object] = {
    (1, "phases", "source"): "shim",  # the shim was the only source of phases then
}


#: Columns renamed: (table, current name) -> (the last version with the old name, the old name).
RENAMED: dict[tuple[str, str], tuple[int, str]] = {
    ("counters", "other_fd_call_errors"): (4, "fd_errors"),
}


def stored_names(table: str, columns: list[str], version: int) -> list[str]:
    """The names to read from a part of ``version`` for ``columns``: each, and its old name
    where it was renamed since."""
    names = list(columns)
    for name in columns:
        last, old_name = RENAMED.get((table, name), (0, ""))
        if version <= last:
            names.append(old_name)
    return names


def upgrade(table: str, data: Any, version: int, columns: list[str] | None = None) -> Any:
    """``data`` (a ``pyarrow.Table`` read from a part of ``table``) with the current columns, in
    their declared order and types: a column the part lacks is null (or its known value), one
    it has of an older type is cast, one no longer declared is left out. ``columns``: only
    these. Raises ValueError when the part lacks a column that cannot be null."""
    import pyarrow as pa

    declared = TABLES[table]
    wanted = [f for f in declared.stored_fields if columns is None or f.name in columns]
    arrays, fields = [], []
    present = set(data.column_names)
    for spec in wanted:
        target = arrow_type(spec.arrow_type)
        last, old_name = RENAMED.get((table, spec.name), (0, ""))
        name = old_name if version <= last and spec.name not in present and old_name in present else spec.name
        if name in present:
            column = data[name]
            if column.type != target:
                column = column.cast(target)
        elif spec.name in declared.optional:
            continue
        elif (version, table, spec.name) in KNOWN_DEFAULTS:
            column = pa.array([KNOWN_DEFAULTS[(version, table, spec.name)]] * data.num_rows, type=target)
        elif spec.nullable:
            column = pa.nulls(data.num_rows, type=target)
        else:
            raise ValueError(f"a {table} part lacks the column {spec.name}")
        arrays.append(column)
        fields.append(pa.field(spec.name, target, nullable=spec.nullable))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
