"""Compiled program images kept between starts, so that a second start loads in milliseconds what
bcc's clang takes seconds to make.

An image is kept under a key made of everything its instructions depend on: the C source, the
compiler flags, the kernel (release, build and architecture), bcc's version, the kernel headers
bcc compiles against, and the format files of the tracepoints whose arguments bcc lays out from
them. Any change to one of those is another key, so the programs are compiled again; an entry
that is not what its key says (damaged, planted, of another layout) is compiled again too and
replaced. The cache is a directory only root (or the user fdtrace runs as) can write, opened as
any output directory is (``fdtrace.safe_files``); one anyone else could change is not used.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from fdtrace.errors import FdtraceError
from fdtrace.kernel.features import FORMATS_ENV, TRACEFS
from fdtrace.kernel.programs import IMAGE_FORMAT, ProgramImage, bcc_version, compile_image
from fdtrace.safe_files import PRIVATE_DIR, PRIVATE_FILE, HeldDirectory

#: Where images are kept unless FDTRACE_BPF_CACHE names another directory ("off": nowhere).
DEFAULT_DIR = Path("/var/cache/fdtrace")
CACHE_ENV = "FDTRACE_BPF_CACHE"
#: Images kept at most (each set of options is one: record, record --stacks, trace, export...).
MAX_ENTRIES = 32
MAX_ENTRY_BYTES = 64 << 20
_SUFFIX = ".bpfimage"
_TRACEPOINT_PROBE = re.compile(rb"TRACEPOINT_PROBE\(\s*(\w+)\s*,\s*(\w+)\s*\)")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _bounded(path: Path, limit: int = 1 << 16) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read(limit)
    except OSError:
        return b""


def _headers() -> list[object]:
    """What identifies the kernel headers bcc compiles against."""
    build = Path("/lib/modules") / platform.release()
    found: list[object] = []
    for name in ("build", "source"):
        found.append(os.path.realpath(build / name))
    for relative in ("include/generated/autoconf.h", "include/generated/utsrelease.h"):
        found.append(_digest(_bounded(build / "build" / relative, 1 << 20)))
    kheaders = Path("/sys/kernel/kheaders.tar.xz")
    found.append(os.stat(kheaders).st_size if kheaders.exists() else None)
    return found


def cache_key(text: bytes, cflags: list[str], formats_root: Path | None = None) -> str:
    """The key of the image of ``text`` compiled with ``cflags`` on this host."""
    root = formats_root or Path(os.environ.get(FORMATS_ENV, TRACEFS / "events"))
    formats = {f"{c.decode()}:{e.decode()}": _digest(_bounded(root / c.decode() / e.decode() / "format"))
               for c, e in sorted(set(_TRACEPOINT_PROBE.findall(text)))}
    uname = os.uname()
    described = {"image": IMAGE_FORMAT, "text": _digest(text), "cflags": cflags,
                 "kernel": [uname.release, uname.version, uname.machine], "bcc": bcc_version(),
                 "headers": _headers(), "formats": formats}
    return _digest(json.dumps(described, sort_keys=True).encode())


@dataclass
class Loaded:
    """An image, whether it came from the cache, and what to tell the user about it."""

    image: ProgramImage
    from_cache: bool
    note: str


def cache_directory() -> Path | None:
    """The cache's directory, or None when it is turned off."""
    setting = os.environ.get(CACHE_ENV)
    if setting is not None and setting.strip().lower() in ("off", "0", "no", ""):
        return None
    return Path(setting) if setting else DEFAULT_DIR


def load_or_compile(text: bytes, cflags: list[str], directory: Path | None = None) -> Loaded:
    """The image of these programs: from the cache when it holds a good one for this key, else
    compiled (and kept). Raises FdtraceError when compiling fails."""
    directory = directory if directory is not None else cache_directory()
    if directory is None:
        return _compiled(text, cflags, f"not kept ({CACHE_ENV}=off)")
    key = cache_key(text, cflags)
    try:
        held = HeldDirectory.open(directory, create_mode=PRIVATE_DIR)
    except FdtraceError as refused:
        return _compiled(text, cflags, f"not kept: the cache is refused ({refused})")
    with held:
        name = key + _SUFFIX
        why = ""
        if held.exists(name):
            try:
                image = _read(held, name, key)
                os.utime(name, dir_fd=held.fd, follow_symlinks=False)  # the newest are kept
                return Loaded(image, True, f"BPF programs loaded as compiled at an earlier start ({directory})")
            except (OSError, ValueError) as exc:
                why = f"; the kept image was not usable ({exc}) and was replaced"
        began = time.monotonic()
        image = compile_image(text, cflags)
        seconds = time.monotonic() - began
        try:
            entry = json.dumps({"key": key, "sha256": _digest(image.to_json())}).encode() + b"\n" + image.to_json()
            held.write_file(name, lambda out: out.write(entry), PRIVATE_FILE)
            _trim(held)
        except OSError as exc:
            return Loaded(image, False, f"BPF programs compiled in {seconds:.1f} s, not kept in {directory} "
                                        f"({exc.strerror})")
        return Loaded(image, False, f"BPF programs compiled in {seconds:.1f} s and kept in {directory} for the next "
                                    f"start{why}")


def _compiled(text: bytes, cflags: list[str], why: str) -> Loaded:
    began = time.monotonic()
    image = compile_image(text, cflags)
    return Loaded(image, False, f"BPF programs compiled in {time.monotonic() - began:.1f} s, {why}")


def _read(held: HeldDirectory, name: str, key: str) -> ProgramImage:
    """A kept image, trusted only if it is a regular file of root or ours that nobody else can
    write, names its key and matches its own checksum."""
    with held.open_file(name) as file:
        info = os.fstat(file.fileno())
        if info.st_uid not in (0, os.geteuid()) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(f"owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):o}")
        if info.st_size > MAX_ENTRY_BYTES:
            raise ValueError(f"larger than {MAX_ENTRY_BYTES} bytes")
        data = file.read(MAX_ENTRY_BYTES + 1)
    head, _, body = data.partition(b"\n")
    try:
        described = json.loads(head)
    except ValueError:
        raise ValueError("no header") from None
    if not isinstance(described, dict) or described.get("key") != key or described.get("sha256") != _digest(body):
        raise ValueError("its header does not match its key or its content")
    return ProgramImage.from_json(body)


def _trim(held: HeldDirectory) -> None:
    """Keep the newest MAX_ENTRIES images."""
    entries = []
    for name in held.names():
        if name.endswith(_SUFFIX):
            try:
                entries.append((held.lstat(name).st_mtime_ns, name))
            except OSError:
                continue
    for _, name in sorted(entries)[:-MAX_ENTRIES]:
        try:
            held.unlink(name)
        except OSError:
            pass
