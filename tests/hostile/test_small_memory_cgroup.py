"""fdtrace in a memory cgroup too small for its BPF maps (issue 27, item 11): the kernel refuses a
map with ENOMEM, and fdtrace says that in one line (not "Failed to compile BPF module"), exit 2,
with nothing recorded."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import needs_root
from tests.helpers import FDTRACE, memory_cgroup

pytestmark = [needs_root(), pytest.mark.bpf]



def test_maps_refused_for_want_of_memory_are_named_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "FDTRACE_BPF_CACHE": str(tmp_path / "cache")}
    # compiled first, outside the cgroup (clang alone needs more than the cgroup allows): the run
    # inside it loads the kept programs and gets as far as making the maps
    warm = subprocess.run([FDTRACE, "record", "-o", str(tmp_path / "warm"), "--duration", "0.1"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert warm.returncode == 0, warm.stderr
    with memory_cgroup(80 << 20) as procs:
        small = subprocess.run(["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", FDTRACE, "record", "-o",
                                str(tmp_path / "small"), "--duration", "1"], env=env, capture_output=True, text=True,
                               timeout=120)
    errors = [line for line in small.stderr.splitlines() if "error" in line]
    assert small.returncode == 2 and len(errors) == 1, small.stderr
    assert errors[0].startswith("fdtrace: error: cannot make the BPF map ") and "Cannot allocate memory" in errors[0]
    assert "memory cgroup too small" in errors[0] and "compile" not in small.stderr.lower()
    assert not (tmp_path / "small").exists()
