"""The ring buffer's consumer side on a ring laid out as the kernel lays it out (a memfd here):
records committed, discarded and still being written."""

from __future__ import annotations

import mmap
import os

import numpy as np

from fdtrace.kernel.ringbuf import BUSY_BIT, DISCARD_BIT, HEADER_SIZE, RingReader
from fdtrace.schema import RAW_EVENT_DTYPE

DATA_SIZE = 4 * mmap.PAGESIZE


def _ring() -> tuple[int, mmap.mmap, RingReader]:
    fd = os.memfd_create("ring")
    os.ftruncate(fd, 2 * mmap.PAGESIZE + 2 * DATA_SIZE)
    view = mmap.mmap(fd, 2 * mmap.PAGESIZE + 2 * DATA_SIZE)
    return fd, view, RingReader(fd, DATA_SIZE, RAW_EVENT_DTYPE)


def _produce(view: mmap.mmap, reader: RingReader, records: np.ndarray, flags: list[int], at: int) -> int:
    """Write records as the kernel would, from byte ``at`` of the data; returns the producer position."""
    slot = reader.slot.itemsize
    data = np.frombuffer(view, dtype=np.uint8, offset=2 * mmap.PAGESIZE)
    for i, (record, flag) in enumerate(zip(records, flags, strict=True)):
        start = at + i * slot
        data[start:start + 4] = np.frombuffer(np.uint32(RAW_EVENT_DTYPE.itemsize | flag).tobytes(), np.uint8)
        data[start + HEADER_SIZE:start + HEADER_SIZE + RAW_EVENT_DTYPE.itemsize] = np.frombuffer(record.tobytes(),
                                                                                              np.uint8)
    position = at + len(records) * slot
    np.frombuffer(view, dtype=np.uint64, offset=mmap.PAGESIZE, count=1)[0] = position
    return position


def _records(n: int) -> np.ndarray:
    records = np.zeros(n, dtype=RAW_EVENT_DTYPE)
    records["ts_ns"] = np.arange(n) + 1000
    records["pid"] = np.arange(n) + 7
    records["comm"] = [f"task{i}".encode() for i in range(n)]
    records["extra"] = np.arange(4 * n, dtype=np.uint64).reshape(n, 4)
    return records


def test_reads_committed_records_and_leaves_discarded_and_busy_ones() -> None:
    fd, view, reader = _ring()
    try:
        records = _records(6)
        _produce(view, reader, records, [0, DISCARD_BIT, 0, 0, BUSY_BIT, 0], at=0)
        first = reader.read()
        # Stops at the record still being written; the discarded one is left out.
        assert first.dtype == RAW_EVENT_DTYPE and first.flags.c_contiguous
        assert first.tobytes() == records[[0, 2, 3]].tobytes()
        consumer = int(np.frombuffer(view, dtype=np.uint64, count=1)[0])
        assert consumer == 4 * reader.slot.itemsize  # released up to the busy record
        _produce(view, reader, records[4:], [0, 0], at=consumer)  # the producer finished it
        assert reader.read().tobytes() == records[4:].tobytes()
        assert len(reader.read()) == 0
        all_kept = _records(3)
        at = int(np.frombuffer(view, dtype=np.uint64, count=1)[0])
        _produce(view, reader, all_kept, [0, 0, 0], at=at)
        read = reader.read()
        assert read.tobytes() == all_kept.tobytes()
        view[2 * mmap.PAGESIZE:] = b"\0" * (2 * DATA_SIZE)  # the ring reused: the copy stays as it was read
        assert read.tobytes() == all_kept.tobytes() and read["comm"].tolist() == [b"task0", b"task1", b"task2"]
    finally:
        reader.close()
        view.close()
        os.close(fd)
