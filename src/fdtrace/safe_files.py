"""Writing files as root in places other users can reach, without following or reusing anything
they planted.

A directory fdtrace writes in is opened once, by a walk from ``/`` that checks every directory on
the way (owned by root or us; writable by nobody else unless the sticky bit keeps others from
renaming our entries, as in /tmp; a symbolic link followed only when root or we own it), and is
then held by its descriptor (``HeldDirectory``): every file is created, renamed, listed and
deleted relative to that descriptor, so nobody can swap a directory under fdtrace once it writes.
Files are written under a fresh O_EXCL|O_NOFOLLOW name, fsynced, then renamed over the final
name (a rename replaces the entry itself, never what a planted link points to).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from fdtrace.errors import FdtraceError

#: Files only their owner reads, and the same with --shared.
PRIVATE_FILE, SHARED_FILE = 0o600, 0o644
PRIVATE_DIR, SHARED_DIR = 0o700, 0o755
#: Symbolic links followed at most on the way to a directory (the kernel's own bound).
MAX_LINKS = 40

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _trusted(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _writable_by_others(mode: int) -> bool:
    return bool(mode & (stat.S_IWGRP | stat.S_IWOTH))


def _refuse(where: str, why: str) -> FdtraceError:
    return FdtraceError(f"{where} {why}")


def _check_opened(fd: int, where: str, final: bool, shared_final: bool) -> None:
    """Refuse a directory another user owns or can change entries of (see the module's doc)."""
    info = os.fstat(fd)
    if not _trusted(info.st_uid):
        raise _refuse(where, f"belongs to uid {info.st_uid}, not to this user or root: choose another directory")
    if _writable_by_others(info.st_mode):
        sticky = bool(info.st_mode & stat.S_ISVTX)
        if not sticky or (final and not shared_final):
            raise _refuse(where, f"can be written by other users (mode {stat.S_IMODE(info.st_mode):o}): "
                                 "choose another directory, or chmod go-w it")


def _open_walk(path: Path, create_mode: int | None, shared_final: bool, may_be_missing: bool = False) -> int | None:
    """The descriptor of ``path``'s directory, opened one checked step at a time from ``/``;
    missing directories are made with ``create_mode`` (None: refused, or with ``may_be_missing``
    the walk ends there and gives None)."""
    shown = str(path)
    pending = list(Path(os.path.abspath(path)).parts[1:])
    fd = os.open("/", _DIRECTORY_FLAGS)
    links = 0
    where = "/"
    try:
        _check_opened(fd, "/", not pending, shared_final)
        while pending:
            name = pending.pop(0)
            final = not pending
            where = shown if final else os.path.join(where, name)
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if may_be_missing:
                    os.close(fd)
                    return None
                if create_mode is None:
                    raise _refuse(where, "does not exist") from None
                try:
                    os.mkdir(name, create_mode, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: looked at below like any other
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                if final:
                    raise _refuse(where, "is a symbolic link: give the directory itself")
                if not _trusted(info.st_uid):
                    raise _refuse(where, f"is a symbolic link of uid {info.st_uid}: not followed")
                links += 1
                if links > MAX_LINKS:
                    raise _refuse(shown, "has too many levels of symbolic links")
                target = Path(os.readlink(name, dir_fd=fd))
                if target.is_absolute():
                    os.close(fd)
                    fd = os.open("/", _DIRECTORY_FLAGS)
                    pending = list(target.parts[1:]) + pending
                else:
                    pending = list(target.parts) + pending
                continue
            if not stat.S_ISDIR(info.st_mode):
                raise _refuse(where, "exists and is not a directory")
            child = os.open(name, _DIRECTORY_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            _check_opened(fd, where, final, shared_final)
    except FdtraceError:
        os.close(fd)
        raise
    except OSError as exc:
        os.close(fd)
        raise FdtraceError(f"{where}: cannot use this directory ({exc.strerror})") from None
    return fd


class HeldDirectory:
    """A directory opened once (``open``) and used only through its descriptor.

    Attributes:
        path: what it was opened as (for messages; never walked again).
        fd: its descriptor.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open(cls, path: Path, create_mode: int | None = None, shared: bool = False) -> HeldDirectory:
        """Open ``path`` as a checked walk from ``/`` (see the module's doc), making what is
        missing with ``create_mode``. ``shared``: the directory itself may be writable by others
        when its sticky bit is set (reports may go to /tmp); a recording's may not. Raises
        FdtraceError (one line)."""
        fd = _open_walk(Path(path), create_mode, shared)
        assert fd is not None
        return cls(fd, Path(path))

    def subdirectory(self, name: str, create_mode: int | None = None) -> HeldDirectory:
        """A directory in this one (made with ``create_mode`` when missing), checked the same way."""
        where = self.path / name
        try:
            if create_mode is not None:
                try:
                    os.mkdir(name, create_mode, dir_fd=self.fd)
                except FileExistsError:
                    pass
            info = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                raise _refuse(str(where), "is a symbolic link: not followed")
            if not stat.S_ISDIR(info.st_mode):
                raise _refuse(str(where), "exists and is not a directory")
            fd = os.open(name, _DIRECTORY_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            raise FdtraceError(f"{where}: cannot use this directory ({exc.strerror})") from None
        try:
            _check_opened(fd, str(where), True, False)
        except FdtraceError:
            os.close(fd)
            raise
        return HeldDirectory(fd, where)

    def names(self) -> list[str]:
        """The entries, as they are now."""
        return os.listdir(self.fd)

    def lstat(self, name: str) -> os.stat_result:
        """An entry's own status (a link is not followed). Raises OSError."""
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def exists(self, name: str) -> bool:
        """Whether an entry of that name is here (of any type, a link too)."""
        try:
            self.lstat(name)
        except FileNotFoundError:
            return False
        return True

    def open_file(self, name: str) -> BinaryIO:
        """A regular file of this directory for reading (never a link, FIFO or device: those
        raise OSError)."""
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, f"{self.path / name}: not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "rb")

    def write_file(self, name: str, write: Callable[[BinaryIO], object], mode: int = PRIVATE_FILE) -> int:
        """Write a file whole: under a fresh hidden name made with O_EXCL|O_NOFOLLOW, fsynced,
        then renamed over ``name``. Returns its size. Raises OSError."""
        temporary = f".{name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=self.fd)
        try:
            os.fchmod(fd, mode)  # the umask does not decide who may read it
            with os.fdopen(fd, "wb") as out:
                write(out)
                out.flush()
                os.fsync(out.fileno())
                size = os.fstat(out.fileno()).st_size
            os.replace(temporary, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(temporary, dir_fd=self.fd)
            except OSError:
                pass
            raise
        return size

    def unlink(self, name: str) -> None:
        """Delete an entry (a file or a link; never what a link points to). Raises OSError."""
        os.unlink(name, dir_fd=self.fd)

    def open_lock(self, name: str, mode: int = PRIVATE_FILE) -> int:
        """The descriptor of a lock file here (made when missing; never a link or a FIFO)."""
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode,
                     dir_fd=self.fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, f"{self.path / name}: not a regular file")
        return fd

    def close(self) -> None:
        """Let go of the descriptor (once)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> HeldDirectory:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()


def check_directory(path: Path, create: bool = False) -> None:
    """Refuse (one line) a directory that another user could have planted or can change, or
    whose parents another user can change (see the module's doc). With ``create``, a directory
    not made yet is checked as far as its path exists (nothing is made)."""
    fd = _open_walk(Path(path), None, False, may_be_missing=create)
    if fd is not None:
        os.close(fd)


def write_atomically(path: Path, write: Callable[[BinaryIO], object], mode: int = PRIVATE_FILE,
                     check_parent: bool = True) -> None:
    """Write one file whole in a directory opened as a checked walk (``HeldDirectory``).
    ``check_parent``: its directory may not be writable by others at all (recordings); without
    it, one whose sticky bit keeps others from renaming over the file is taken (a report in
    /tmp). Raises OSError, or FdtraceError for a directory refused."""
    with HeldDirectory.open(path.parent, shared=not check_parent) as directory:
        directory.write_file(path.name, write, mode)


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
    """Whether a name is a regular file itself (not a link, FIFO or device or folder)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def write_text_atomically(path: Path, text: str, mode: int = PRIVATE_FILE, check_parent: bool = False) -> None:
    """``write_atomically`` for text."""
    write_atomically(path, lambda out: out.write(text.encode()), mode, check_parent)
