"""What another user plants where root starts fdtrace: a package named ``fdtrace`` in the working
directory, and ``PYTHON*`` variables naming a directory they own. The children fdtrace starts for
itself (``rehearse --processes``'s ranks) import neither: no code of theirs runs as root."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from fdtrace.children import SAFE_PATH, child_environment, program, python_module_command
from fdtrace.rehearsal.rank import ProcessRank
from fdtrace.rehearsal.runner import Rehearsal, start_ranks, stop_ranks
from fdtrace.rehearsal.shape import Shape
from tests.unit.test_rehearsal import loopback_target, server

NOBODY = pwd.getpwnam("nobody").pw_uid

#: The planted code: it leaves a file beside itself when it runs (as whoever imported it).
PAYLOAD = "import os\nopen(os.path.join(os.path.dirname(__file__), {name!r}), 'w').write(str(os.getuid()))\n"


def plant(directory: Path, package: str, marker: str) -> Path:
    """A package ``package`` in ``directory`` (everyone may write there, as in /tmp) whose import
    writes ``marker`` beside it."""
    directory.mkdir(mode=0o777, exist_ok=True)
    os.chmod(directory, 0o1777)
    made = directory / package
    made.mkdir(exist_ok=True)
    (made / "__init__.py").write_text(PAYLOAD.format(name=marker))
    (made / "rehearsal").mkdir(exist_ok=True)
    (made / "rehearsal" / "__init__.py").write_text(PAYLOAD.format(name=marker))
    (made / "rehearsal" / "rank.py").write_text(PAYLOAD.format(name=marker))
    for path in (made, made / "rehearsal", *made.rglob("*.py")):
        if os.geteuid() == 0:
            os.chown(path, NOBODY, NOBODY)
    return made


def test_rank_processes_import_nothing_from_the_working_directory_or_python_variables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = plant(tmp_path / "shared", "fdtrace", "ran-from-cwd")
    elsewhere = plant(tmp_path / "theirs", "fdtrace", "ran-from-pythonpath")
    (tmp_path / "theirs" / "sitecustomize.py").write_text(PAYLOAD.format(name="ran-sitecustomize"))
    (tmp_path / "theirs" / "startup.py").write_text(PAYLOAD.format(name="ran-startup"))
    monkeypatch.chdir(here.parent)
    monkeypatch.setenv("PYTHONPATH", str(elsewhere.parent))
    monkeypatch.setenv("PYTHONSTARTUP", str(tmp_path / "theirs" / "startup.py"))
    monkeypatch.setenv("PYTHONINSPECT", "1")  # would leave the rank at a prompt instead of ending
    monkeypatch.setenv("PATH", f"{tmp_path / 'theirs'}:{os.environ['PATH']}")

    shape = Shape(2, 5, hold_s=0.0, processes=True)
    with server(answer=None) as (port, _):  # the rehearsal tests' echoing loopback server
        ranks = start_ranks(shape, loopback_target(port))
        try:
            assert {type(rank) for rank in ranks} == {ProcessRank}
            rehearsal = Rehearsal(shape, ranks, None, None, max_rate=10_000, duration_s=60)
            rehearsal.run()
        finally:
            stop_ranks(ranks)
    # the ranks did their work, with the installed fdtrace
    assert rehearsal.error is None and [(b.level, b.answered) for b in rehearsal.bursts] == [(10, 10)]
    planted = sorted(path.name for path in tmp_path.rglob("ran-*"))
    assert planted == []  # none of the planted modules ran


def test_a_child_is_started_isolated_with_a_fixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/tmp")
    monkeypatch.setenv("LD_PRELOAD", "/tmp/theirs.so")
    command = python_module_command("fdtrace.rehearsal.rank", "2", "127.0.0.1", "1")
    assert os.path.isabs(command[0]) and command[1:4] == ["-I", "-m", "fdtrace.rehearsal.rank"]
    assert child_environment() == {"PATH": SAFE_PATH, "LC_ALL": "C"}
    # programs are found on root's directories only, never on the caller's PATH
    monkeypatch.setenv("PATH", "/tmp")
    assert program("sh") in {f"{directory}/sh" for directory in SAFE_PATH.split(":")}
    assert program("no-such-program-of-fdtrace") is None
