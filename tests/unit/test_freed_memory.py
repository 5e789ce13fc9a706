"""A live source's freed bursts go back to the system (sources/memory.py): a burst of columns the
size of a full ring's events, decoded and let go, leaves the resident size where it was."""

from __future__ import annotations

import subprocess
import sys

BURSTS = """
import sys
import numpy as np
import pyarrow as pa
if sys.argv[1] == "returned":
    from fdtrace.sources.memory import return_freed_memory
    assert return_freed_memory() == [], "not set"
    assert pa.default_memory_pool().backend_name == "system"

def resident_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

def burst(rows):  # a full ring's events: 190,000 rows of 20 columns, filtered, and a copy
    table = pa.table({f"c{i}": np.arange(rows, dtype=np.int64) + i for i in range(20)})
    kept = table.filter(pa.compute.greater(table["c0"], 10))
    columns = [np.asarray(kept[f"c{i}"]).copy() for i in range(20)]
    del table, kept, columns

burst(1_000)  # the libraries' own pages, mapped at first use
before = resident_mb()
for _ in range(5):
    burst(190_000)
print(round(resident_mb() - before))
"""


def _kept_after_bursts(mode: str) -> int:
    run = subprocess.run([sys.executable, "-c", BURSTS, mode], capture_output=True, text=True, timeout=60, check=True)
    return int(run.stdout.strip())


def test_bursts_of_columns_give_their_memory_back() -> None:
    returned = _kept_after_bursts("returned")
    default = _kept_after_bursts("default")
    assert returned < 10, f"{returned} MB kept after the bursts"
    assert default > returned + 20, f"the default allocators kept {default} MB, returned {returned} MB"


POOL_OF_A_COMMAND = """
import sys
from fdtrace.cli import main
try:
    main([sys.argv[1], "--help"])  # the group chooses before the command runs (or prints its help)
except SystemExit:
    pass
import os
import pyarrow as pa
print(pa.default_memory_pool().backend_name, os.environ.get("ARROW_DEFAULT_MEMORY_POOL", "unset"), file=sys.stderr)
"""


def _pool(command: str, environment: dict[str, str]) -> str:
    run = subprocess.run([sys.executable, "-c", POOL_OF_A_COMMAND, command], capture_output=True, text=True,
                         timeout=60, check=True, env=environment)
    return run.stderr.strip()


def test_the_live_commands_have_arrow_allocate_from_the_system_unless_told_otherwise() -> None:
    """Arrow's C++ default pool is chosen as pyarrow loads: every command that can trace the live
    kernel chooses the system allocator before that (no mimalloc arena kept under a flood); a pool
    the user names stays, and the commands that read recordings keep Arrow's default."""
    import os

    from fdtrace.cli import LIVE_COMMANDS

    plain = {key: value for key, value in os.environ.items() if key != "ARROW_DEFAULT_MEMORY_POOL"}
    assert {command: _pool(command, plain) for command in sorted(LIVE_COMMANDS)} == \
        dict.fromkeys(sorted(LIVE_COMMANDS), "system system")
    assert _pool("record", {**plain, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}) == "mimalloc mimalloc"
    assert _pool("info", plain).endswith(" unset")
