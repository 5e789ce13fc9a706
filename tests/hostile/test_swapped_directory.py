"""A directory swapped under the recorder: another user who can change a parent of the output
renames the recording away and puts a link to root's other recording in its place. The output's
parents are checked when it is opened (nobody may change any of them, unless a sticky bit keeps
them from renaming root's entries), and the recording is then written only through the
descriptors of its folders: root's other recording is never touched."""

from __future__ import annotations

import hashlib
import os
import pwd
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from fdtrace.analysis import load
from fdtrace.errors import FdtraceError
from fdtrace.recording.writer import RecordingWriter
from fdtrace.safe_files import HeldDirectory, check_directory, write_atomically
from fdtrace.schema import SCHEMA_VERSION
from tests.helpers import FDTRACE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants directories as another user: needs root")

NOBODY = pwd.getpwnam("nobody").pw_uid
META = {"schema_version": SCHEMA_VERSION, "host": "h"}


def rows(i: int) -> pa.Table:
    return pa.table({"ts_ns": [i], "file_nr": [1], "file_max": [2],
                     "time": pa.array([i], pa.timestamp("ns", tz="UTC"))})


def fingerprint(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_record_refuses_an_output_under_a_directory_another_user_owns(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    nob = tmp_path / "t" / "nob"
    nob.mkdir()
    os.chown(nob, NOBODY, -1)
    result = subprocess.run([FDTRACE, "record", "-o", str(nob / "rec"), "--duration", "1"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"fdtrace: error: {nob} belongs to uid {NOBODY}, not to this user or root: choose another directory"]
    assert list(nob.iterdir()) == []


def test_parents_others_can_write_are_refused_unless_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(FdtraceError, match="can be written by other users"):
        check_directory(shared / "rec", create=True)
    os.chmod(shared, 0o1777)  # like /tmp: nobody may rename root's entries in it
    check_directory(shared / "rec", create=True)
    with pytest.raises(FdtraceError, match="can be written by other users"):
        check_directory(shared)  # but a recording is never written straight into it
    write_atomically(shared / "report.html", lambda out: out.write(b"x"), check_parent=False)  # a report may be


def test_a_link_another_user_planted_in_the_path_is_not_followed(tmp_path: Path) -> None:
    drop = tmp_path / "drop"
    drop.mkdir()
    os.chmod(drop, 0o1777)
    precious = tmp_path / "precious"
    precious.mkdir(mode=0o700)
    os.symlink(precious, drop / "link")
    os.lchown(drop / "link", NOBODY, -1)  # planted by nobody (who cannot reach into pytest's 0700 folders)
    with pytest.raises(FdtraceError, match=f"is a symbolic link of uid {NOBODY}: not followed"):
        RecordingWriter(drop / "link" / "rec", "h", META)
    assert list(precious.iterdir()) == []
    os.symlink(precious, tmp_path / "mine")  # root's own link is followed
    RecordingWriter(tmp_path / "mine" / "rec", "h", META).close()
    assert (precious / "rec" / "meta" / "host=h.json").is_file()


def test_a_recording_swapped_for_a_link_to_another_is_never_written_through(tmp_path: Path) -> None:
    other = tmp_path / "other"
    first = RecordingWriter(other, "h", META)
    for i in range(6):
        first.add("system", rows(i))
        first.flush()
    first.write_meta(complete=True)
    first.close()
    before = fingerprint(other)
    writer = RecordingWriter(tmp_path / "rec", "h", META, max_size=1)  # rotation deletes all it can
    for i in range(3):
        writer.add("system", rows(i))
        writer.flush()
    os.rename(tmp_path / "rec", tmp_path / "moved")
    os.symlink(other, tmp_path / "rec")
    for i in range(3, 9):
        writer.add("system", rows(i))
        writer.flush()
    writer.compact()
    writer.write_meta(complete=True)
    writer.close()
    assert fingerprint(other) == before  # not one file of the other recording changed or went
    moved = load(tmp_path / "moved")
    assert moved.meta["h"]["complete"] and moved.meta["h"]["rotated_out"]["files"] == 8
    assert moved.system["ts_ns"].tolist() == [8]  # the newest part, kept by the rotation


def test_a_held_directory_keeps_working_after_its_path_is_gone(tmp_path: Path) -> None:
    with HeldDirectory.open(tmp_path / "a", create_mode=0o700) as held:
        os.rename(tmp_path / "a", tmp_path / "b")
        held.write_file("x", lambda out: out.write(b"1"))
        assert (tmp_path / "b" / "x").read_bytes() == b"1" and not (tmp_path / "a").exists()
