"""Reading a BPF ring buffer of fixed-size records in bulk, straight from its memory.

bcc's ring buffer API calls back into Python once per record, which costs about a core at
500k records/s. Here the ring is mapped into this process and every record committed since the
last read is taken with one numpy slice: the data pages are mapped twice in a row by the kernel,
so a run of records that wraps around the end is still one contiguous slice.

Layout (kernel/bpf/ringbuf.c): page 0 holds the consumer position (written by us), page 1 the
producer position, then the data. Each record has an 8-byte header: its length, with bit 31 set
while the producer still writes it and bit 30 set if it was discarded.
"""

from __future__ import annotations

import mmap
import platform

import numpy as np

BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30
HEADER_SIZE = 8


def bulk_read_supported() -> bool:
    """Whether this CPU's memory ordering makes plain loads safe for the consumer side.

    On x86-64 (TSO) a load is never reordered before an earlier load, so reading a record's
    header and then its data needs no barrier; other architectures would need acquire loads,
    which Python cannot issue, and use the per-record callbacks instead.
    """
    return platform.machine() in ("x86_64", "AMD64")


class RingReader:
    """Consumer of one ring buffer map whose records all have the layout ``record_dtype``."""

    def __init__(self, map_fd: int, data_size: int, record_dtype: np.dtype) -> None:
        if data_size & (data_size - 1):
            raise ValueError("ring buffer size must be a power of two")
        page = mmap.PAGESIZE
        self.data_size = data_size
        slot_size = (HEADER_SIZE + record_dtype.itemsize + 7) // 8 * 8
        padding = slot_size - HEADER_SIZE - record_dtype.itemsize
        fields = [("len", "<u4"), ("pg_off", "<u4"), ("record", record_dtype)]
        if padding:
            fields.append(("pad", f"V{padding}"))
        self.slot = np.dtype(fields)
        self.record = np.dtype(record_dtype)
        self._consumer_map = mmap.mmap(map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._producer_map = mmap.mmap(map_fd, page + 2 * data_size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        self._consumer_pos = np.frombuffer(self._consumer_map, dtype=np.uint64, count=1)
        self._producer_pos = np.frombuffer(self._producer_map, dtype=np.uint64, count=1)
        self._data = np.frombuffer(self._producer_map, dtype=np.uint8, offset=page)

    def read(self) -> np.ndarray:
        """Every record committed since the last read, in ring order (a copy)."""
        consumer = int(self._consumer_pos[0])
        producer = int(self._producer_pos[0])
        count = (producer - consumer) // self.slot.itemsize
        if count == 0:
            return np.empty(0, dtype=self.slot["record"])
        start = consumer & (self.data_size - 1)
        span = self._data[start : start + count * self.slot.itemsize]
        lengths = span.view(self.slot)["len"]
        busy = np.flatnonzero(lengths & BUSY_BIT)
        ready = int(busy[0]) if len(busy) else count
        kept = (lengths[:ready] & DISCARD_BIT) == 0
        # The records' bytes, copied out of the ring as rows of bytes (a structured copy of the
        # slots took four times as long); only the kept ones when some were discarded.
        rows = span[: ready * self.slot.itemsize].reshape(ready, self.slot.itemsize)
        rows = rows[:, HEADER_SIZE : HEADER_SIZE + self.record.itemsize]
        copied = rows.copy() if kept.all() else rows[kept]
        records = copied.view(self.record).reshape(len(copied))
        # Release the space only after copying out of it.
        self._consumer_pos[0] = consumer + ready * self.slot.itemsize
        return np.asarray(records)

    def close(self) -> None:
        """Unmap the ring."""
        del self._consumer_pos, self._producer_pos, self._data
        self._consumer_map.close()
        self._producer_map.close()
