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


def upgrade(table: str, data: Any, version: int, columns: list[str] | None = None) -> Any:
    """``data`` (a ``pyarrow.Table`` read from a part of ``table``) with the current columns, in
    their declared order and types: a column the part lacks is null (or its known value), one
    it has of an older type is cast, one no longer declared is left out. ``columns``: only
    these. Raises ValueError when the part lacks a column that cannot be null."""
    import pyarrow as pa

    declared = TABLES[table]
    wanted = [f for f in declared.fields if (columns is None or f.name in columns) and f.name != "host"]
    arrays, fields = [], []
    present = set(data.column_names)
    for spec in wanted:
        target = arrow_type(spec.arrow_type)
        if spec.name in present:
            column = data[spec.name]
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
