"""A column declaration and the Arrow types it may have."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Field:
    """One column of a table.

    Attributes:
        name: the column's name.
        arrow_type: one of :data:`ARROW_TYPES`' keys.
        nullable: whether rows may lack a value (a recording that predates the column reads as
            nulls; a column that is not nullable must be in every recording).
        description: what the column holds, as docs/format.md and docs/recording.md say it.
    """

    name: str
    arrow_type: str
    nullable: bool
    description: str


#: The Arrow types columns are declared with.
ARROW_TYPE_NAMES: tuple[str, ...] = (
    "int64", "int32", "int16", "string", "bool", "timestamp_utc", "dict_string", "errors_list",
    "string_list",
)


def arrow_type(name: str) -> Any:
    """The ``pyarrow.DataType`` of a declared type name (pyarrow is imported only when asked)."""
    import pyarrow as pa

    types = {
        "int64": pa.int64(),
        "int32": pa.int32(),
        "int16": pa.int16(),
        "string": pa.string(),
        "bool": pa.bool_(),
        "timestamp_utc": pa.timestamp("ns", tz="UTC"),
        "dict_string": pa.dictionary(pa.int32(), pa.string()),
        "string_list": pa.list_(pa.string()),
        # counters: failed calls of one process by (syscall, errno)
        "errors_list": pa.list_(pa.struct([("syscall", pa.string()), ("errno", pa.string()), ("count", pa.int64())])),
    }
    return types[name]
