"""Writing files as root in places other users can reach, without following or reusing anything
they planted: directories are checked (owned by root or us, not writable by others, not a
symlink) and opened with O_NOFOLLOW; files are written under a fresh O_EXCL name through the
directory's descriptor, then renamed over the final name (a rename replaces the entry itself,
never what a planted link points to)."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from fdtrace.errors import FdtraceError

#: Files only their owner reads, and the same with --shared.
PRIVATE_FILE, SHARED_FILE = 0o600, 0o644
PRIVATE_DIR, SHARED_DIR = 0o700, 0o755


def check_directory(path: Path) -> None:
    """Refuse (one line) a directory that another user could have planted or can change: a
    symlink, not a directory, owned by someone other than root or the caller, or writable by
    its group or others."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise FdtraceError(f"{path}: cannot use this directory ({exc.strerror})") from None
    if stat.S_ISLNK(info.st_mode):
        raise FdtraceError(f"{path} is a symbolic link: give the directory itself")
    if not stat.S_ISDIR(info.st_mode):
        raise FdtraceError(f"{path} exists and is not a directory")
    if info.st_uid not in (0, os.geteuid()):
        raise FdtraceError(f"{path} belongs to uid {info.st_uid}, not to this user or root: choose another directory")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise FdtraceError(f"{path} can be written by other users (mode {stat.S_IMODE(info.st_mode):o}): "
                           "choose another directory, or chmod go-w it")


def make_directory(path: Path, mode: int = PRIVATE_DIR) -> None:
    """Create a directory (and its parents as needed) or accept an existing one that passes
    ``check_directory``."""
    try:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
    except FileExistsError:
        pass  # a file or a link of that name: check_directory says which
    except OSError as exc:
        raise FdtraceError(f"{path}: cannot create the directory ({exc.strerror})") from None
    check_directory(path)


def write_atomically(path: Path, write: Callable[[BinaryIO], object], mode: int = PRIVATE_FILE,
                     check_parent: bool = True) -> None:
    """Write a file whole: under a fresh hidden name made with O_EXCL|O_NOFOLLOW in its
    directory (opened with O_NOFOLLOW), fsynced, then renamed over ``path``. ``check_parent``:
    also refuse a directory other users can write (recordings); a report may go to /tmp,
    whose sticky bit already keeps others from renaming over it. Raises OSError."""
    directory = path.parent
    if check_parent:
        check_directory(directory)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        temporary = f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=dir_fd)
        try:
            os.fchmod(fd, mode)  # the umask does not decide who may read it
            with os.fdopen(fd, "wb") as out:
                write(out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(temporary, dir_fd=dir_fd)
            except OSError:
                pass
            raise
    finally:
        os.close(dir_fd)


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes, opened without blocking and without following a link (a FIFO or a
    device planted under the name cannot hang or flood the reader), at most ``limit`` bytes.
    Raises OSError for anything else, or a larger file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return data


def is_regular(path: Path) -> bool:
    """Whether a name is a regular file itself (not a link, FIFO, device or folder)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def write_text_atomically(path: Path, text: str, mode: int = PRIVATE_FILE, check_parent: bool = False) -> None:
    """``write_atomically`` for text."""
    write_atomically(path, lambda out: out.write(text.encode()), mode, check_parent)
