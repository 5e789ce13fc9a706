"""Bad recordings get one clear error naming the file and the problem."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fdtrace.analysis import load
from fdtrace.errors import FdtraceError
from fdtrace.schema import SCHEMA_VERSION


def fdtrace_info(path: Path) -> subprocess.CompletedProcess[str]:
    code = f"import sys; sys.argv = ['fdtrace', 'info', {str(path)!r}]; from fdtrace.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_directory_that_is_not_a_recording(tmp_path: Path) -> None:
    with pytest.raises(FdtraceError, match="not an fdtrace recording"):
        load(tmp_path)
    result = fdtrace_info(tmp_path)
    assert result.returncode != 0 and result.stderr.startswith("fdtrace: error: ")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_wrong_schema_version_is_refused(tmp_path: Path) -> None:
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "host=a.json").write_text(json.dumps({"schema_version": 99, "host": "a"}))
    with pytest.raises(FdtraceError, match=f"schema version 99, this fdtrace reads versions 1 to {SCHEMA_VERSION}"):
        load(tmp_path)


def test_corrupt_metadata_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "host=a.json").write_text("{trunc")
    with pytest.raises(FdtraceError, match=r"host=a\.json: unreadable recording metadata"):
        load(tmp_path)


def test_a_recording_without_events_reports_and_summarises_as_empty(tmp_path: Path) -> None:
    """A valid recording in which nothing happened (a quiet host, --pid of an idle process)."""
    import pyarrow as pa

    from fdtrace.recording.writer import RecordingWriter
    from fdtrace.schema import SCHEMA_VERSION

    writer = RecordingWriter(tmp_path, "quiet", {"schema_version": SCHEMA_VERSION, "host": "quiet"})
    writer.add("system", pa.table({"ts_ns": [1, 2], "file_nr": [10, 11], "file_max": [100, 100],
                                   "time": pa.array([1, 2], pa.timestamp("ns", tz="UTC"))}))
    writer.flush()
    writer.write_meta(complete=True)
    writer.close()
    rec = load(tmp_path)
    assert len(rec.events) == 0 and {"kind", "pid", "errno"} <= set(rec.events.columns)
    assert len(rec.system) == 2
    assert fdtrace_info(tmp_path).returncode == 0
    code = (f"import sys; sys.argv = ['fdtrace', 'report', {str(tmp_path)!r}, '-o', {str(tmp_path / 'r.md')!r}];"
            "from fdtrace.cli import main; main()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "r.md").read_text().startswith("#")
