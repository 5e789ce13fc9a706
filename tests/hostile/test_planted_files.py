"""What another user plants where root's fdtrace writes: a directory they own or can write, a
symlink under a name fdtrace is about to write. Nothing of root's may be overwritten, nothing
may become readable by others, and a refusal is one line (root: the planted files are made as
``nobody``)."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from fdtrace.recording.writer import RecordingWriter
from fdtrace.schema import SCHEMA_VERSION
from tests.helpers import FDTRACE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as another user: needs root")

EMFILE = Path(__file__).parents[1] / "data" / "emfile"
NOBODY = pwd.getpwnam("nobody").pw_uid


def fdtrace(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FDTRACE, *argv], capture_output=True, text=True, timeout=60)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fdtrace: error: "), result.stderr
    return lines[0]


def test_record_refuses_a_directory_another_user_owns_or_everyone_can_write(tmp_path: Path) -> None:
    planted = tmp_path / "inc"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    result = fdtrace("record", "-o", str(planted), "--duration", "1")
    assert "can be written by other users" in one_line_error(result)
    os.chown(planted, NOBODY, -1)
    os.chmod(planted, 0o755)
    assert "belongs to uid" in one_line_error(fdtrace("record", "-o", str(planted), "--duration", "1"))
    assert list(planted.iterdir()) == []  # nothing written into it


def test_record_refuses_an_output_that_is_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    assert "symbolic link" in one_line_error(fdtrace("record", "-o", str(tmp_path / "link"), "--duration", "1"))


def test_planted_names_in_the_recording_are_replaced_never_followed(tmp_path: Path) -> None:
    """Links left under the names the writer uses (its final names and the old temporary ones)
    are replaced as entries: the files they point to keep their content."""
    precious = tmp_path / "precious"
    precious.write_text("root's file\n")
    out = tmp_path / "rec"
    (out / "meta").mkdir(parents=True, mode=0o700)
    os.chmod(out, 0o700)
    (out / "meta" / "host=h.json.tmp").symlink_to(precious)
    (out / "system" / "host=h").mkdir(parents=True, mode=0o700)
    (out / "system" / "host=h" / "part-000001.parquet").symlink_to(precious)
    (out / "system" / "host=h" / "part-000002.parquet.tmp").symlink_to(precious)
    writer = RecordingWriter(out, "h", {"schema_version": SCHEMA_VERSION, "host": "h"})
    for i in range(2):
        writer.add("system", pa.table({"ts_ns": [i], "file_nr": [1], "file_max": [2],
                                       "time": pa.array([i], pa.timestamp("ns", tz="UTC"))}))
        writer.flush()
    writer.write_meta(complete=True)
    writer.close()
    assert precious.read_text() == "root's file\n"
    part = out / "system" / "host=h" / "part-000001.parquet"
    assert not part.is_symlink() and stat.S_IMODE(part.stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "meta" / "host=h.json").stat().st_mode) == 0o600


def test_reports_and_totals_are_private_unless_shared(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    result = fdtrace("report", str(EMFILE), "-o", str(report))
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(report.stat().st_mode) == 0o600
    shared = tmp_path / "shared.md"
    assert fdtrace("report", str(EMFILE), "-o", str(shared), "--shared").returncode == 0
    assert stat.S_IMODE(shared.stat().st_mode) == 0o644


def test_a_report_over_a_planted_symlink_replaces_the_link(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.write_text("root's file\n")
    drop = tmp_path / "drop"
    drop.mkdir(mode=0o1777)
    os.chmod(drop, 0o1777)  # like /tmp
    (drop / "report.html").symlink_to(precious)
    os.lchown(drop / "report.html", NOBODY, -1)  # planted by nobody
    result = fdtrace("report", str(EMFILE), "-o", str(drop / "report.html"))
    assert result.returncode == 0, result.stderr
    assert precious.read_text() == "root's file\n"
    assert not (drop / "report.html").is_symlink()


@pytest.mark.parametrize("command", [["trace", "--duration", "0.5"], ["record", "-o", "{out}", "--duration", "0.5"]])
def test_a_hard_fd_limit_too_low_for_the_probes_is_one_line(command: list[str], tmp_path: Path) -> None:
    argv = [part.format(out=tmp_path / "rec") for part in command]
    result = subprocess.run(["prlimit", "--nofile=64:64", FDTRACE, *argv], capture_output=True, text=True, timeout=60)
    line = one_line_error(result)
    assert "the hard RLIMIT_NOFILE is 64: fdtrace needs" in line and "prlimit --nofile=" in line
    assert not (tmp_path / "rec").exists()  # nothing left behind that would block -o next time


def test_record_on_a_busy_listen_port_leaves_no_stub_directory(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = fdtrace("record", "-o", str(tmp_path / "rec"), "--listen", f"127.0.0.1:{port}", "--duration", "1")
    assert "cannot serve metrics" in one_line_error(result)
    assert not (tmp_path / "rec").exists()


def test_every_output_refuses_a_folder_another_user_owns_in_one_line(tmp_path: Path) -> None:
    """report, trace-export, run --phases-out and service --install write through a held folder:
    one of nobody's is refused before anything is written or run (no traceback)."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    assert "belongs to uid" in one_line_error(fdtrace("report", str(EMFILE), "-o", str(theirs / "r.html")))
    assert "belongs to uid" in one_line_error(fdtrace("trace-export", str(EMFILE), "-o", str(theirs / "t.json")))
    assert "belongs to uid" in one_line_error(fdtrace("service", "--install", "--unit-dir", str(theirs)))
    ran = tmp_path / "ran"
    refused = fdtrace("run", "--phases-out", str(theirs / "p.jsonl"), "--", "touch", str(ran))
    assert "belongs to uid" in one_line_error(refused) and not ran.exists()  # refused before the job ran
    assert os.listdir(theirs) == []
