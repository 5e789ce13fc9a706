"""How fdtrace starts a program of its own: isolated from whoever else can write near it.

fdtrace runs as root on hosts where other users plant files. A child started with the caller's
working directory, environment and a program found on ``PATH`` can be made to run their code:
Python puts the working directory first on its import path for ``-m``, honours ``PYTHONPATH``
and ``PYTHONSTARTUP``, and a ``PATH`` may name a directory they can write. Every child fdtrace
starts for its own use (not a job the user asked it to run) goes through here: Python in
isolated mode by the absolute path of the running interpreter, a fixed ``PATH``, no inherited
variables and ``/`` as its working directory.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fdtrace.errors import FdtraceError

#: The only directories a child's PATH names: root's own, never the caller's.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: A child's working directory: nothing another user can plant in it is ever imported or read.
CHILD_CWD = "/"


def child_environment(**extra: str) -> dict[str, str]:
    """The whole environment of a child: a fixed PATH, the C locale and ``extra``; nothing of
    the caller's (no ``PYTHON*``, ``LD_*`` or ``PATH`` of theirs)."""
    return {"PATH": SAFE_PATH, "LC_ALL": "C", **extra}


def python_interpreter() -> str:
    """The absolute path of the interpreter running fdtrace (its virtual environment's, so the
    child imports the same fdtrace). Raises FdtraceError when Python cannot say it."""
    executable = sys.executable
    if not executable or not os.path.isabs(executable) or not os.access(executable, os.X_OK):
        raise FdtraceError(f"cannot start a Python child: the interpreter's path {executable!r} is not an "
                           "absolute path to a program")
    return executable


def python_module_command(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args`` isolated: ``-I`` keeps the working
    directory, the script's directory, ``PYTHON*`` variables and the user's site-packages off the
    import path, so only the installed fdtrace can be imported."""
    return [python_interpreter(), "-I", "-m", module, *args]


def program(*candidates: str) -> str | None:
    """The first of ``candidates`` (absolute paths, or names looked up on SAFE_PATH only) that is
    an executable file, None when none is."""
    for candidate in candidates:
        paths = [Path(candidate)] if os.path.isabs(candidate) else [
            Path(directory) / candidate for directory in SAFE_PATH.split(":")]
        for path in paths:
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return None
