"""A setuid program named haproxy (issue 37, N): `nobody` runs a setuid-root copy of a program
under the name haproxy with ``-f`` naming a root-only file. Its effective uid is 0, so a doctor
that checks file access as the process's effective (or filesystem) uid would read root's file on
nobody's behalf. Configuration files are read with the real uid's rights and never for a process
whose ids differ or whose program is setuid or setgid: doctor says why, and never shows the file."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import FDTRACE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes a setuid program and runs it as nobody: needs root")

NOBODY = pwd.getpwnam("nobody")
SECRET = "SECRET-5b0e7d22"
SECRET_CONFIG = f"global\n    maxconn {SECRET}\n    ulimit-n {SECRET}\n    stats socket /run/{SECRET}.sock\n"
#: The program the copies run: it waits, whatever its arguments (the -f are for doctor to see).
WAIT = "import time; print('ready', flush=True); time.sleep(60)"
IDS_DIFFER = "its effective ids are not its real ones (uid {uid}): a setuid or setgid program's files are not read " \
             "on its behalf"
SETID_PROGRAM = "its program is setuid or setgid: its files are not read on its behalf"


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder everyone may search, where the copies of the interpreter are made."""
    path = Path(tempfile.mkdtemp(prefix="fdtrace-setuid-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def secret() -> Iterator[Path]:
    """A root-only configuration (0600) in a folder everyone may search: only its mode protects it."""
    path = Path(tempfile.mkdtemp(prefix="fdtrace-secret-"))
    os.chmod(path, 0o755)
    cfg = path / "rootonly.cfg"
    cfg.write_text(SECRET_CONFIG)
    cfg.chmod(0o600)
    yield cfg
    shutil.rmtree(path, ignore_errors=True)


def haproxy_copy(folder: Path, mode: int) -> Path:
    """A root-owned copy of this Python interpreter named haproxy, with ``mode``."""
    program = folder / "haproxy"
    shutil.copy(os.path.realpath(sys.executable), program)
    os.chown(program, 0, 0)
    program.chmod(mode)
    return program


def doctor_of(program: Path, secret: Path, preexec: Callable[[], None] | None = None,
              **user: int) -> list[str]:
    """doctor's findings about the haproxy configuration of ``program`` started with -f SECRET."""
    proc = subprocess.Popen([str(program), "-I", "-c", WAIT, "-f", "/etc/shadow", "-f", str(secret)],
                            stdout=subprocess.PIPE, text=True, preexec_fn=preexec, start_new_session=True, **user)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        runs = [subprocess.run([FDTRACE, "doctor", "--pid", str(proc.pid), *flag], capture_output=True, text=True,
                               timeout=60) for flag in (["--json"], [])]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for run in runs:
        assert run.returncode in (0, 1, 2) and "Traceback" not in run.stderr, run.stderr
        assert SECRET not in run.stdout + run.stderr and "root:" not in run.stdout + run.stderr
    return [check["current"] for check in json.loads(runs[0].stdout)["checks"] if check["name"] == "haproxy config"]


def test_a_setuid_root_haproxy_of_nobodys_has_no_file_read_for_it(folder: Path, secret: Path) -> None:
    program = haproxy_copy(folder, 0o4755)
    found = doctor_of(program, secret, user=NOBODY.pw_uid, group=NOBODY.pw_gid, extra_groups=[])
    why = IDS_DIFFER.format(uid=NOBODY.pw_uid)
    assert found == [f"/etc/shadow: not read: {why}", f"{secret}: not read: {why}"]


def test_a_process_whose_real_uid_is_nobody_and_effective_uid_root_has_no_file_read_for_it(
        folder: Path, secret: Path) -> None:
    program = haproxy_copy(folder, 0o755)  # no setuid bit: only its ids differ
    found = doctor_of(program, secret, preexec=lambda: os.setresuid(NOBODY.pw_uid, 0, 0))
    why = IDS_DIFFER.format(uid=NOBODY.pw_uid)
    assert found == [f"/etc/shadow: not read: {why}", f"{secret}: not read: {why}"]


def test_a_setuid_program_run_by_root_has_no_file_read_for_it(folder: Path, secret: Path) -> None:
    program = haproxy_copy(folder, 0o4755)  # all its ids are root's: only its program tells
    found = doctor_of(program, secret)
    assert found == [f"/etc/shadow: not read: {SETID_PROGRAM}", f"{secret}: not read: {SETID_PROGRAM}"]


def test_the_same_haproxy_without_setuid_run_by_root_has_its_file_read(folder: Path, secret: Path) -> None:
    """The control: root's own haproxy, nothing setuid, has root's configuration read (its values
    are no numbers here: named, not shown)."""
    program = haproxy_copy(folder, 0o755)
    secret.write_text("global\n    maxconn many\n")  # read: its value no number (named, not shown)
    found = doctor_of(program, secret)
    assert f"{secret}: maxconn is not a number" in found
