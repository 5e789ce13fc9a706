"""Memory that a live source frees goes back to the system.

On a busy host each poll takes up to a ring's worth of events (about 190,000 with the default
16 MiB ring: 33 MB of columns) and the view or the recorder folds them in and lets them go. With
the default allocators the freed pages stay with the process: pyarrow's mimalloc keeps its
segments, and glibc raises its mmap threshold after the first large free, so later bursts come
from heaps that are never trimmed. `fdtrace top` then held 400 MB where its live data needed
about 60 MB above its start (docs/benchmarks.md). Here large buffers are mapped and unmapped one
by one instead: each burst costs page faults, and the resident size follows what is alive.
"""

from __future__ import annotations

import ctypes
import os
import platform

#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Allocations from this size are mapped on their own and unmapped when freed (a column of
#: 190,000 events is 1.5 MB; Python's small objects stay in its own pools).
MMAP_FROM_BYTES = 256 * 1024
#: Free memory at the top of a heap beyond this is given back.
TRIM_FROM_BYTES = 1024 * 1024


def arrow_allocates_from_system() -> None:
    """Before pyarrow's first import: Arrow's C++ default pool, what its kernels and concatenations
    allocate from when handed no pool, is the system allocator too. pyarrow reads the choice once,
    as it loads; ``return_freed_memory`` later switches only the pool of pyarrow's Python calls,
    and the rest went on reserving a 1 GiB mimalloc arena that held 15 to 20 MB under a flood
    (measured: `top`'s mean resident size over 35 s of fork churn and a socket flood fell by 10
    to 14 MB in four A/B runs). A pool the user names in the environment is kept."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def return_freed_memory() -> list[str]:
    """Make pyarrow allocate from the system allocator and fix glibc's thresholds (idempotent).
    Returns what could not be set, for a note (another libc: its defaults stay)."""
    import pyarrow as pa

    missing = []
    if pa.default_memory_pool().backend_name != "system":
        pa.set_memory_pool(pa.system_memory_pool())
    libc_name = platform.libc_ver()[0]
    if libc_name != "glibc":
        return [f"the C library is not glibc ({libc_name or 'unknown'}): freed memory is returned as it decides"]
    # The process's own symbols, libc's among them: ctypes.util.find_library would run ldconfig,
    # or a compiler found on PATH, as root.
    libc = ctypes.CDLL(None)
    for parameter, value in ((_M_MMAP_THRESHOLD, MMAP_FROM_BYTES), (_M_TRIM_THRESHOLD, TRIM_FROM_BYTES)):
        if libc.mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) != 1:
            missing.append(f"mallopt({parameter}, {value}) was refused")
    return missing
