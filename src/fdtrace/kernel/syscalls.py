"""Syscall names by number, for this machine's architecture, from the kernel's own numbering as
its user-space headers declare it (``#define __NR_read 0``).

bcc has such a table too, but importing it loads libbcc with LLVM's compiler (about 60 MB that a
live view started from kept programs does not otherwise need), and it runs ``ausyscall`` found
on PATH, as root.
"""

from __future__ import annotations

import os
import platform
import re
import stat
from functools import lru_cache

#: The headers that number the syscalls, by machine: the C library's copy of the kernel's
#: user-space headers (linux-libc-dev), then those of the running kernel's build (which bcc needs).
_HEADERS = {
    "x86_64": ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "/usr/include/asm/unistd_64.h",
               "/lib/modules/{release}/build/arch/x86/include/generated/uapi/asm/unistd_64.h"),
    "aarch64": ("/usr/include/asm-generic/unistd.h", "/lib/modules/{release}/build/include/uapi/asm-generic/unistd.h"),
}
#: A header is read up to this many bytes (x86-64's is under 10 KiB).
MAX_HEADER_BYTES = 256 << 10
_DEFINE = re.compile(rb"^#define\s+__NR(?:3264)?_([a-z0-9_]+)\s+(\d+)\s*$", re.MULTILINE)


@lru_cache(maxsize=1024)
def syscall_name(number: int) -> str:
    """The name of syscall ``number`` ("read"), or "syscall_NUMBER" where it is not known."""
    return syscall_numbers().get(number, f"syscall_{number}")


@lru_cache(maxsize=1)
def syscall_numbers() -> dict[int, str]:
    """This machine's syscalls by number (empty when no header is found): the first header of
    ``_HEADERS`` that root owns and only root may change, read bounded."""
    release = os.uname().release
    for candidate in _HEADERS.get(platform.machine(), ()):
        text = _root_file(candidate.format(release=release))
        if text:
            numbers = {int(number): name.decode() for name, number in _DEFINE.findall(text)}
            if numbers:
                return numbers
    return {}


def _root_file(path: str) -> bytes | None:
    """A regular file's first ``MAX_HEADER_BYTES``, when root owns it and neither its group nor
    others may write it (a header another user planted is not read); else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
            return None
        return os.read(fd, MAX_HEADER_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
