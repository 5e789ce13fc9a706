"""`fdtrace service`: the systemd unit of an always-on flight recorder, printed or installed."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import click

from fdtrace.children import CHILD_CWD, child_environment, program
from fdtrace.cli.common import fail, note, parse_size, say
from fdtrace.errors import FdtraceError

#: The unit's name, as installed.
UNIT_NAME = "fdtrace.service"


def render_unit(user: str, max_size: str, keep_incidents: str, rotate: float, fdtrace: str | None = None) -> str:
    """The unit, for this installation of fdtrace (its ExecStart is this very fdtrace)."""
    template = (resources.files("fdtrace") / "data" / UNIT_NAME).read_text()
    program = fdtrace or str(Path(sys.executable).with_name("fdtrace"))
    docs = Path(__file__).resolve().parents[3] / "docs" / "service.md"
    text = (template.replace("@FDTRACE@", program).replace("@USER@", user).replace("@MAX_SIZE@", max_size)
            .replace("@KEEP_INCIDENTS@", keep_incidents).replace("@ROTATE@", f"{rotate:g}"))
    if docs.is_file():
        return text.replace("@DOCS@", docs.as_uri())
    return "\n".join(line for line in text.splitlines() if "@DOCS@" not in line) + "\n"


@click.command()
@click.option("--install", is_flag=True,
              help="Write the unit to --unit-dir and make its user (root); print it otherwise.")
@click.option("--user", default="fdtrace", show_default=True, help="The system user the recorder runs as.")
@click.option("--max-size", default="2G", show_default=True, help="The ring's size (record --max-size).")
@click.option("--keep-incidents", default="1G", show_default=True,
              help="Kept around incidents besides the ring (record --keep-incidents).")
@click.option("--rotate", type=float, default=60.0, show_default=True,
              help="Seconds of parts merged into one file (record --rotate).")
@click.option("--unit-dir", type=click.Path(file_okay=False), default="/etc/systemd/system", show_default=True,
              help="Where --install writes the unit.")
def service(install: bool, user: str, max_size: str, keep_incidents: str, rotate: float, unit_dir: str) -> None:
    """The systemd unit of an always-on recorder: everything in a bounded ring under
    /var/lib/fdtrace, the minutes around each incident kept apart from it, restarted on failure
    into the same recording, as a user holding only the capabilities tracing needs."""
    for name, value in (("--max-size", max_size), ("--keep-incidents", keep_incidents)):
        try:
            parse_size(value)
        except ValueError as exc:
            fail(FdtraceError(f"{name}: {exc}"))
    if rotate <= 0:
        fail(FdtraceError("--rotate must be positive"))
    if not user.replace("-", "").replace("_", "").isalnum():
        fail(FdtraceError(f"--user {user!r}: not a user name"))
    unit = render_unit(user, max_size, keep_incidents, rotate)
    if not install:
        say(unit, nl=False)
        return
    _install(unit, user, Path(unit_dir))


def _install(unit: str, user: str, unit_dir: Path) -> None:
    from fdtrace.safe_files import SHARED_FILE, HeldDirectory, write_text_atomically

    if os.geteuid() != 0:
        fail(FdtraceError("--install writes a system unit and makes a user: run it as root"))
    try:  # the folder is checked before anything is made
        HeldDirectory.open(unit_dir).close()
    except FdtraceError as error:
        fail(error)
    try:
        import pwd

        pwd.getpwnam(user)
    except KeyError:
        useradd = program("useradd")
        if useradd is None:
            fail(FdtraceError(f"there is no user {user} and no useradd to make one: make it, then run this again"))
        made = subprocess.run([useradd, "--system", "--no-create-home", "--home-dir", "/var/lib/fdtrace",
                               "--shell", "/usr/sbin/nologin", "--user-group", user], capture_output=True, text=True,
                              env=child_environment(), cwd=CHILD_CWD, stdin=subprocess.DEVNULL)
        if made.returncode != 0:
            fail(FdtraceError(f"useradd {user} failed: {' '.join(made.stderr.split())[:200]}"))
        note(f"made the system user {user}")
    path = unit_dir / UNIT_NAME
    try:
        write_text_atomically(path, unit, SHARED_FILE, check_parent=True)
    except FdtraceError as error:
        fail(error)
    except OSError as exc:
        fail(FdtraceError(f"{path}: cannot write the unit ({exc.strerror})"))
    note(f"wrote {path}")
    if Path("/run/systemd/system").is_dir():
        systemctl = program("/usr/bin/systemctl", "/bin/systemctl")
        if systemctl is not None:
            subprocess.run([systemctl, "daemon-reload"], check=False, env=child_environment(), cwd=CHILD_CWD,
                           stdin=subprocess.DEVNULL)
        note(f"start it, and at every boot: systemctl enable --now {UNIT_NAME}")
    else:
        note("systemd is not running here: the unit takes effect where it is (systemctl enable --now fdtrace)")
