"""A process's files read as that process could: from its own working directory, no higher than its
root, through links only where it may go, never a file its user may not read (real processes of
nobody's)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdtrace.integrations.haproxy import read_process_configs
from fdtrace.procfs import ProcFS
from fdtrace.procfs.process_files import NotReadableError, ProcessFiles

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts processes as another user: needs root")

NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fdtrace-files-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def nobodys(folder: Path) -> Iterator[int]:
    """A process of nobody's working in ``folder``."""
    proc = subprocess.Popen(["sleep", "60"], cwd=folder, user=NOBODY.pw_uid, group=NOBODY.pw_gid, extra_groups=[])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_relative_path_is_the_processs_own_working_directorys(folder: Path, nobodys: int) -> None:
    (folder / "haproxy.cfg").write_text("global\n    maxconn 321\n")
    reads = read_process_configs(ProcFS(), nobodys, ["haproxy", "-f", "haproxy.cfg"])
    assert [(str(r.path), r.config.maxconn if r.config else None, r.not_read) for r in reads] == [
        ("haproxy.cfg", 321, None)]


def test_climbing_out_of_its_folder_reaches_only_what_it_may_read(folder: Path, nobodys: int) -> None:
    files = ProcessFiles(ProcFS(), nobodys)
    up = "../" * (len(folder.parts) + 3)  # past / : stays at its root
    with pytest.raises(NotReadableError, match=f"^uid {NOBODY.pw_uid} may not read /etc/shadow"):
        files.read(up + "etc/shadow")
    assert files.read(up + "etc/hostname") == Path("/etc/hostname").read_bytes()


def test_a_loop_of_links_ends(folder: Path, nobodys: int) -> None:
    (folder / "a").symlink_to(folder / "b")
    (folder / "b").symlink_to(folder / "a")
    with pytest.raises(NotReadableError, match="more than 40 links"):
        ProcessFiles(ProcFS(), nobodys).read(str(folder / "a"))


def test_a_file_that_is_not_there(folder: Path, nobodys: int) -> None:
    with pytest.raises(NotReadableError, match=f"^{folder}/missing.cfg: No such file or directory$"):
        ProcessFiles(ProcFS(), nobodys).read(str(folder / "missing.cfg"))


def test_a_gone_process_has_no_files(folder: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(NotReadableError, match="the process's user is not known"):
        ProcessFiles(ProcFS(), proc.pid)
