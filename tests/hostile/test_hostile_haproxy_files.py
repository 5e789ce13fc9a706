"""A process named haproxy that `nobody` starts names root's files with -f: root's `fdtrace
doctor` reads them only as nobody could (never echoing what they hold), and says why it did not."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import FDTRACE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts processes as another user: needs root")

NOBODY = pwd.getpwnam("nobody")
SECRET = "SECRET-7f3a9c41"
#: A configuration whose values are the secret: any echo of one would show it.
SECRET_CONFIG = f"global\n    maxconn {SECRET}\n    ulimit-n {SECRET}\n    stats socket /run/{SECRET}.sock\n"


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder everyone may search (pytest's tmp_path is under a folder of root's only)."""
    path = Path(tempfile.mkdtemp(prefix="fdtrace-hostile-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def root_only() -> Iterator[Path]:
    """A folder of root's in /root (0700, as /root itself)."""
    path = Path(tempfile.mkdtemp(prefix="fdtrace-secret-", dir="/root"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def doctor_of_nobodys_haproxy(folder: Path, *args: str) -> tuple[str, str]:
    """doctor's JSON and table for a process of nobody's named haproxy, run with ARGS."""
    script = folder / "haproxy"
    script.write_text("#!/bin/sh\nsleep 60\n")
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), *args], user=NOBODY.pw_uid, group=NOBODY.pw_gid, extra_groups=[],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/comm").read_text().strip() != "haproxy":  # exec'd through /bin/sh
            assert time.monotonic() < deadline
            time.sleep(0.02)
        runs = [subprocess.run([FDTRACE, "doctor", "--pid", str(proc.pid), *json_flag], capture_output=True,
                               text=True, timeout=60) for json_flag in (["--json"], [])]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for run in runs:
        assert run.returncode in (1, 2) and "Traceback" not in run.stderr, run.stderr
        assert SECRET not in run.stdout + run.stderr
    return runs[0].stdout, runs[1].stdout


def config_findings(text: str) -> list[str]:
    return [check["current"] for check in json.loads(text)["checks"] if check["name"] == "haproxy config"]


def test_a_root_only_file_of_roots_is_not_read_for_nobody(folder: Path, root_only: Path) -> None:
    secret = root_only / "secret.cfg"
    secret.write_text(SECRET_CONFIG)
    secret.chmod(0o600)
    as_json, table = doctor_of_nobodys_haproxy(folder, "-f", str(secret))
    assert config_findings(as_json) == [f"{secret}: not read: uid {NOBODY.pw_uid} may not search /root "
                                        "(mode 0700, owner uid 0, group 0)"]
    assert str(secret) in table


def test_a_file_of_roots_nobody_may_not_read_is_not_read(folder: Path) -> None:
    secret = folder / "secret.cfg"  # in a folder everyone may search: the file's own mode decides
    secret.write_text(SECRET_CONFIG)
    secret.chmod(0o640)
    as_json, _ = doctor_of_nobodys_haproxy(folder, "-f", str(secret))
    assert config_findings(as_json) == [f"{secret}: not read: uid {NOBODY.pw_uid} may not read {secret} "
                                        "(mode 0640, owner uid 0, group 0)"]


def test_a_link_of_nobodys_to_a_file_of_roots_is_not_followed_past_what_nobody_may(folder: Path,
                                                                                   root_only: Path) -> None:
    secret = root_only / "secret.cfg"
    secret.write_text(SECRET_CONFIG)
    secret.chmod(0o644)  # readable by all, but in a folder only root may search
    planted = folder / "nobodys"
    planted.mkdir()
    os.chown(planted, NOBODY.pw_uid, NOBODY.pw_gid)
    (planted / "haproxy.cfg").symlink_to(secret)
    os.lchown(planted / "haproxy.cfg", NOBODY.pw_uid, NOBODY.pw_gid)
    as_json, _ = doctor_of_nobodys_haproxy(folder, "-f", str(planted / "haproxy.cfg"))
    assert config_findings(as_json) == [f"{planted / 'haproxy.cfg'}: not read: uid {NOBODY.pw_uid} may not search "
                                        "/root (mode 0700, owner uid 0, group 0)"]


def test_a_file_of_a_third_user_is_not_read(folder: Path) -> None:
    theirs = folder / "theirs.cfg"
    theirs.write_text(SECRET_CONFIG)
    theirs.chmod(0o644)
    daemon = pwd.getpwnam("daemon")
    os.chown(theirs, daemon.pw_uid, daemon.pw_gid)
    as_json, _ = doctor_of_nobodys_haproxy(folder, "-f", str(theirs))
    assert config_findings(as_json) == [f"{theirs}: not read: {theirs} belongs to uid {daemon.pw_uid}, neither the "
                                        f"process's user (uid {NOBODY.pw_uid}) nor root"]


def test_nobodys_own_file_is_read_and_a_value_that_is_no_number_is_named_not_shown(folder: Path) -> None:
    own = folder / "own.cfg"
    own.write_text(SECRET_CONFIG.replace(f"stats socket /run/{SECRET}.sock\n", ""))
    own.chmod(0o600)
    os.chown(own, NOBODY.pw_uid, NOBODY.pw_gid)
    as_json, _ = doctor_of_nobodys_haproxy(folder, "-f", str(own))
    assert config_findings(as_json) == [f"{own}: maxconn is not a number", f"{own}: ulimit-n is not a number"]


def test_a_directory_of_configurations_is_read_file_by_file_as_the_process_could(folder: Path) -> None:
    confd = folder / "conf.d"
    confd.mkdir()
    (confd / "a.cfg").write_text("global\n    maxconn 100\n")  # root's, readable by all: read
    (confd / "b.cfg").write_text(SECRET_CONFIG)
    (confd / "b.cfg").chmod(0o600)  # root's only: not read
    as_json, _ = doctor_of_nobodys_haproxy(folder, "-f", str(confd))
    assert config_findings(as_json) == [f"{confd}: not read: uid {NOBODY.pw_uid} may not read {confd / 'b.cfg'} "
                                        "(mode 0600, owner uid 0, group 0)"]
