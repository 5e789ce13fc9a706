"""`fdtrace run`'s phases folder: a job that runs as another user, and files fdtrace did not
write there, get a clear word, never a lost job status or a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import FDTRACE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs a job as another user: needs root")
MARK = "from fdtrace.integrations.phases import phase\nwith phase('eval'):\n    pass\nprint('ran')\n"


def test_a_job_that_runs_as_another_user_says_it_cannot_write_its_marks() -> None:
    result = subprocess.run([FDTRACE, "run", "--", "runuser", "-u", "nobody", "--", sys.executable, "-c", MARK],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ran", result.stderr
    assert "cannot write its phase marks" in result.stderr and "Traceback" not in result.stderr
    assert "0 phase marks" in result.stderr


def test_a_stray_file_in_the_phases_folder_keeps_the_jobs_exit_status() -> None:
    code = "import os\nopen(os.path.join(os.environ['FDTRACE_PHASES_DIR'], 'stray.txt'), 'w').close()\n"
    result = subprocess.run([FDTRACE, "run", "--", sys.executable, "-c", code + "raise SystemExit(3)"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
    assert "holds files fdtrace did not write" in result.stderr
    left = [line.split("left ")[1].split(":")[0] for line in result.stderr.splitlines() if "left " in line]
    for folder in left:
        for leftover in Path(folder).iterdir():
            leftover.unlink()
        Path(folder).rmdir()
