"""The always-on recorder as a service: the unit `fdtrace service` prints passes systemd's own
check, and its command, run as an unprivileged user holding only the unit's capabilities (PID 1
is not systemd on these machines: the unit is verified and its command run by hand), records
exact counts; a restart continues into the same recording and keeps what the first run wrote."""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdtrace.analysis import load
from tests.conftest import needs_root
from tests.helpers import FDTRACE, started

pytestmark = [needs_root(), pytest.mark.bpf,
              pytest.mark.skipif(shutil.which("systemd-analyze") is None or shutil.which("setpriv") is None,
                                 reason="needs systemd-analyze and setpriv")]

NOBODY = pwd.getpwnam("nobody")

CHILD = """
import ctypes, socket, sys
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(sys.argv[1].encode()), 0, 0, 0)  # PR_SET_NAME
for _ in range(int(sys.argv[2])):
    socket.socket().close()
"""


def unit_settings(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


@pytest.fixture()
def state() -> Iterator[Path]:
    """A folder of the unprivileged user's, as StateDirectory= makes one (outside pytest's folders,
    which only root can enter)."""
    folder = Path(tempfile.mkdtemp(prefix="fdtrace-service-", dir="/tmp"))
    os.chown(folder, NOBODY.pw_uid, NOBODY.pw_gid)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def test_the_unit_passes_systemd_s_check(tmp_path: Path) -> None:
    unit = subprocess.run([FDTRACE, "service"], capture_output=True, text=True, check=True).stdout
    path = tmp_path / "fdtrace.service"
    path.write_text(unit)
    verified = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr  # no unknown key, no bad value
    settings = unit_settings(unit)
    assert settings["ProtectSystem"] == "strict" and settings["NoNewPrivileges"] == "yes"
    assert settings["Restart"] == "on-failure" and "--resume" in settings["ExecStart"]


def test_its_command_records_exact_counts_with_only_its_capabilities_and_resumes(state: Path) -> None:
    settings = unit_settings(subprocess.run([FDTRACE, "service"], capture_output=True, text=True, check=True).stdout)
    argv = shlex.split(settings["ExecStart"])
    argv[argv.index("-o") + 1] = str(state / "recording")
    granted = settings["AmbientCapabilities"].split()
    caps = ",".join(["-all"] + ["+" + cap.lower().removeprefix("cap_") for cap in granted])
    as_service = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups",
                  f"--inh-caps={caps}", f"--ambient-caps={caps}", f"--bounding-set={caps}", "--",
                  "env", f"FDTRACE_BPF_CACHE={state / 'cache'}", *argv]
    tag = os.getpid() % 100000
    made = {f"svc-a-{tag}": 7, f"svc-b-{tag}": 5}
    for name, sockets in made.items():  # the first run, then its restart
        recorder = started(as_service, "recording to")
        child = subprocess.run([sys.executable, "-c", CHILD, name, str(sockets)], timeout=60, check=True)
        assert child.returncode == 0
        recorder.send_signal(signal.SIGTERM)  # how systemd stops it
        _, said = recorder.communicate(timeout=60)
        assert recorder.returncode == 0, said
    rec = load(state / "recording")
    assert list(rec.meta.values())[0]["runs"] == 2
    for name, sockets in made.items():
        mine = rec.events[rec.events["comm"] == name]
        assert (mine["kind"] == "socket").sum() == sockets and (mine["kind"] == "close").sum() >= sockets
        [pid] = mine["pid"].unique()
        counted = rec.counters[rec.counters["pid"] == pid]  # its exact counters (named at its exec: python)
        assert counted["sockets"].max() == sockets and counted["closes"].max() >= sockets, counted
