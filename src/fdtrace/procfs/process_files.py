"""Another user's process's files, read as that process could read them: anyone can start a
program named haproxy or nginx with -f /etc/shadow or -c /root/secret, and fdtrace runs as root,
so a path from a command line is walked from the process's own root or working directory, each
folder and file checked against the process's real user and groups (``ProcessFiles``), and only
a bounded regular file is read. The integrations (HAProxy's -f, nginx's -c) read through it."""

from __future__ import annotations

import os
import stat
from collections import deque

from fdtrace.procfs.reader import READ_ERRORS, Credentials, ProcFS, skip_reason
from fdtrace.safe_files import MAX_LINKS

#: Bytes read at most from one file.
MAX_FILE_BYTES = 1 << 20


class NotReadableError(Exception):
    """A file the process could not read, or that is not read on its behalf: why, in words."""


def may_access(st: os.stat_result, who: Credentials, user_bit: int, group_bit: int, other_bit: int) -> bool:
    """Whether ``who`` has the permission of these bits on a file, as the kernel decides it from
    the mode (the owner's bits, else the group's, else the others'; root has them all)."""
    if who.uid == 0:
        return True
    if st.st_uid == who.uid:
        return bool(st.st_mode & user_bit)
    if st.st_gid in who.gids:
        return bool(st.st_mode & group_bit)
    return bool(st.st_mode & other_bit)


def _mode(st: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}, group {st.st_gid}"


def _reopen(fd: int, walked: str, flags: int) -> int:
    """The very file checked, opened again through its O_PATH descriptor ``fd`` with ``flags``."""
    try:
        return os.open(f"/proc/self/fd/{fd}", flags | os.O_CLOEXEC)
    except OSError as exc:
        raise NotReadableError(f"{walked}: {exc.strerror}") from None


class ProcessFiles:
    """A process's files as it could open them: paths walked from its root (/proc/PID/root) or
    working directory (/proc/PID/cwd), one component at a time and without following a link
    blindly, each folder searched only where its real user and groups may search it (never for
    a process whose effective ids are not its real ones, or whose program is setuid or setgid); a file is read
    only when its owner is the process's user or root and the process's user and groups may
    read it, up to ``limit`` bytes, and only a regular file. Raises NotReadableError with the reason.

    On a procfs tree a test made (no /proc/PID/root there), paths are walked from this host's /.
    """

    def __init__(self, procfs: ProcFS, pid: int, limit: int = MAX_FILE_BYTES) -> None:
        self.procfs = procfs
        self.pid = pid
        self.limit = limit
        try:
            self.who = procfs.credentials(pid)
        except READ_ERRORS as error:
            raise NotReadableError(f"the process's user is not known ({skip_reason(error)})") from None
        # A setuid or setgid program (su linked as haproxy, -f /etc/shadow) runs with rights its
        # user does not have: nothing is read on its behalf, neither as its effective ids nor as
        # its real ones (it chose its name and arguments).
        if self.who.changed:
            raise NotReadableError(f"its effective ids are not its real ones (uid {self.who.uid}): a setuid or "
                                   "setgid program's files are not read on its behalf")
        if self._setid_binary():
            raise NotReadableError("its program is setuid or setgid: its files are not read on its behalf")

    def _setid_binary(self) -> bool:
        """Whether the process's executable has the setuid or setgid bit (or cannot be told)."""
        if not self.procfs.live and not os.path.lexists(self.procfs.exe(self.pid)):
            return False  # a procfs tree a test made, without executables
        try:
            mode = os.stat(self.procfs.exe(self.pid)).st_mode
        except OSError:
            return True  # gone, or hidden: not read on its behalf
        return bool(mode & (stat.S_ISUID | stat.S_ISGID))

    def _start(self, name: str) -> int:
        base = f"{self.procfs.root}/{self.pid}/{name}"
        if not self.procfs.live and not os.path.lexists(base):
            base = "/" if name == "root" else base
        try:
            return os.open(base, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            where = "root directory" if name == "root" else "working directory"
            raise NotReadableError(f"its {where} cannot be opened ({exc.strerror})") from None

    def _cwd_shown(self) -> str:
        """The process's working directory as messages name it (within its root)."""
        try:
            return os.readlink(f"{self.procfs.root}/{self.pid}/cwd")
        except OSError:
            return "."

    def _walk(self, path: str) -> tuple[int, os.stat_result, str]:
        """(an O_PATH descriptor of what ``path`` names, its stat, the path walked), each folder
        on the way checked; the caller closes the descriptor."""
        root = self._start("root")
        try:
            root_st = os.fstat(root)
            current = os.dup(root) if path.startswith("/") else self._start("cwd")
            walked = "/" if path.startswith("/") else self._cwd_shown()
            parts = deque(path.split("/"))
            links = 0
            while True:
                st = os.fstat(current)
                while parts and parts[0] in ("", "."):
                    parts.popleft()
                if not parts:
                    return current, st, walked
                name = parts.popleft()
                if not stat.S_ISDIR(st.st_mode):
                    os.close(current)
                    raise NotReadableError(f"{walked} is not a directory")
                if not may_access(st, self.who, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
                    os.close(current)
                    raise NotReadableError(f"uid {self.who.uid} may not search {walked} ({_mode(st)})")
                if name == ".." and (st.st_dev, st.st_ino) == (root_st.st_dev, root_st.st_ino):
                    continue  # above its root is its root
                try:
                    child = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
                    child_st = os.fstat(child)
                    if stat.S_ISLNK(child_st.st_mode):
                        os.close(child)
                        links += 1
                        if links > MAX_LINKS:
                            raise NotReadableError(f"more than {MAX_LINKS} links in {path}")
                        target = os.readlink(name, dir_fd=current)
                        parts.extendleft(reversed(target.split("/")))
                        if target.startswith("/"):
                            os.close(current)
                            current, walked = os.dup(root), "/"
                        continue
                except OSError as exc:
                    os.close(current)
                    raise NotReadableError(f"{os.path.normpath(os.path.join(walked, name))}: {exc.strerror}") from None
                except NotReadableError:
                    os.close(current)
                    raise
                os.close(current)
                current, walked = child, os.path.normpath(os.path.join(walked, name))
        finally:
            os.close(root)

    def _check_owner(self, st: os.stat_result, what: str) -> None:
        if st.st_uid not in (self.who.uid, 0):
            raise NotReadableError(f"{what} belongs to uid {st.st_uid}, neither the process's user (uid "
                              f"{self.who.uid}) nor root")
        if not may_access(st, self.who, stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH):
            raise NotReadableError(f"uid {self.who.uid} may not read {what} ({_mode(st)})")

    def read(self, path: str) -> bytes:
        """A regular file's bytes, read as the process could (see the class)."""
        fd, st, walked = self._walk(path)
        try:
            if not stat.S_ISREG(st.st_mode):
                raise NotReadableError(f"{walked} is not a regular file")
            self._check_owner(st, walked)
            readable = _reopen(fd, walked, os.O_RDONLY | os.O_NONBLOCK)
        finally:
            os.close(fd)
        try:
            data = os.read(readable, self.limit + 1)
        except OSError as exc:
            raise NotReadableError(f"{walked}: {exc.strerror}") from None
        finally:
            os.close(readable)
        if len(data) > self.limit:
            raise NotReadableError(f"{walked} is larger than {self.limit} bytes")
        return data

    def files_of(self, path: str, suffix: str, at_most: int) -> list[str]:
        """The files a PATH stands for: PATH, or the names ending in ``suffix`` of the directory
        it names (listed as the process could list it, sorted), at most ``at_most``."""
        fd, st, walked = self._walk(path)
        try:
            if not stat.S_ISDIR(st.st_mode):
                return [path]
            self._check_owner(st, walked)
            if not may_access(st, self.who, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
                raise NotReadableError(f"uid {self.who.uid} may not search {walked} ({_mode(st)})")
            listing = _reopen(fd, walked, os.O_RDONLY | os.O_DIRECTORY)
        finally:
            os.close(fd)
        try:
            names = sorted(name for name in os.listdir(listing) if name.endswith(suffix))
        finally:
            os.close(listing)
        return [os.path.join(path, name) for name in names[:at_most]]
