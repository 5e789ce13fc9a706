"""Every table fdtrace writes or reads, declared once: the event model (kinds, syscalls,
counters, the BPF record and its slots) and the tables of recordings."""

from fdtrace.schema.events import (
    COUNTERS,
    EVENT_COLUMNS,
    EVENT_FIELDS,
    EXTRA_SLOTS,
    FD_ALLOC_SYSCALLS,
    KIND_LABELS,
    LIMIT_RESOURCES,
    LIMIT_SYSCALLS,
    NONFATAL_SIGNALS,
    NOT_FAILURES,
    RAW_EVENT_DTYPE,
    SOCKET_SYSCALLS,
    STACK_DEPTH,
    STACK_KINDS,
    STACK_SLOT,
    STATS,
    SYSCALL_IDS,
    SYSCALL_NAMES,
    Kind,
    bpf_cflags,
    iso_utc,
    plain_rows,
    slot,
)
from fdtrace.schema.fields import Field, arrow_type
from fdtrace.schema.tables import META_FIELDS, SCHEMA_VERSION, TABLES, VERSIONS, Table, arrow_schema

__all__ = [
    "COUNTERS", "LIMIT_RESOURCES", "LIMIT_SYSCALLS",
    "META_FIELDS", "EVENT_COLUMNS", "EVENT_FIELDS", "EXTRA_SLOTS", "FD_ALLOC_SYSCALLS", "KIND_LABELS",
    "NONFATAL_SIGNALS", "NOT_FAILURES", "RAW_EVENT_DTYPE", "SCHEMA_VERSION", "SOCKET_SYSCALLS", "STACK_DEPTH",
    "STACK_KINDS", "STACK_SLOT", "STATS",
    "SYSCALL_IDS", "SYSCALL_NAMES", "TABLES", "VERSIONS", "Field", "Kind", "Table", "arrow_schema", "arrow_type",
    "bpf_cflags", "iso_utc", "plain_rows", "slot",
]
