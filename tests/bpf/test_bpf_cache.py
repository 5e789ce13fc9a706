"""The compiled programs kept between starts: a second start of each command loads what the first
compiled (as each says), and anything that makes a kept image untrustworthy or out of date makes
fdtrace compile again."""

from __future__ import annotations

import json
import os
import pty
import pwd
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fdtrace.kernel.bpf_cache import CACHE_ENV, cache_key
from tests.conftest import needs_root
from tests.helpers import FDTRACE, ctypes_layout, drain

pytestmark = [needs_root(), pytest.mark.bpf]

LOADED = "BPF programs loaded as compiled at an earlier start"
COMPILED = "BPF programs compiled in "
NOBODY = pwd.getpwnam("nobody").pw_uid


def run(cache: Path, *argv: str) -> str:
    """A command's stderr (it must succeed)."""
    done = subprocess.run([FDTRACE, *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, CACHE_ENV: str(cache)})
    assert done.returncode == 0, done.stderr
    return done.stderr


def top_start(cache: Path) -> str:
    """`fdtrace top` on a pseudo-terminal, quit once its first screen is drawn: what it wrote there
    (its start-up notes follow the screen)."""
    leader, follower = pty.openpty()
    top = subprocess.Popen([FDTRACE, "top"], stdin=follower, stdout=follower, stderr=follower,
                           env={**os.environ, CACHE_ENV: str(cache), "TERM": "xterm-256color"})
    os.close(follower)
    screen = b""
    try:
        deadline = time.monotonic() + 90
        while b"file-nr" not in screen and time.monotonic() < deadline:  # the header of the first screen
            if select.select([leader], [], [], 0.5)[0]:
                screen += os.read(leader, 65536)
        assert b"file-nr" in screen
        os.write(leader, b"q")
        assert top.wait(timeout=60) == 0
        screen += drain(leader)  # what it said after leaving the screen
    finally:
        os.close(leader)
        if top.poll() is None:
            top.kill()
            top.wait()
    return screen.decode(errors="replace")


def test_a_second_start_of_each_command_loads_what_the_first_compiled(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = run(cache, "record", "-o", str(tmp_path / "r1"), "--duration", "0.2")
    assert COMPILED in first and f"kept in {cache}" in first
    assert LOADED in run(cache, "record", "-o", str(tmp_path / "r2"), "--duration", "0.2")
    assert COMPILED in run(cache, "record", "--stacks", "-o", str(tmp_path / "s1"), "--duration", "0.2")
    assert LOADED in run(cache, "record", "--stacks", "-o", str(tmp_path / "s2"), "--duration", "0.2")
    run(cache, "export", "--listen", "127.0.0.1:0", "--duration", "0.2")
    assert LOADED in run(cache, "export", "--listen", "127.0.0.1:0", "--duration", "0.2")
    top_start(cache)
    assert LOADED in top_start(cache)
    images = sorted(p.name for p in cache.iterdir())
    assert len(images) == len({*images}) >= 3 and all(name.endswith(".bpfimage") for name in images)
    assert all((p.stat().st_mode & 0o077) == 0 and p.stat().st_uid == 0 for p in cache.iterdir())


def test_a_kept_image_that_is_not_what_it_should_be_is_compiled_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    argv = ("trace", "--errors-only", "--duration", "0.2")
    assert COMPILED in run(cache, *argv)
    [image] = list(cache.iterdir())
    data = bytearray(image.read_bytes())
    data[-100] ^= 0xFF  # a flipped byte: its checksum no longer holds
    image.write_bytes(bytes(data))
    said = run(cache, *argv)
    assert COMPILED in said and "the kept image was not usable" in said and "replaced" in said
    assert LOADED in run(cache, *argv)  # the replacement is good
    os.chown(image, NOBODY, -1)  # planted by another user: never loaded
    said = run(cache, *argv)
    assert COMPILED in said and f"owned by uid {NOBODY}" in said
    os.chown(image, 0, -1)
    os.chmod(cache, 0o777)  # a cache anyone could write is not used at all
    said = run(cache, *argv)
    assert COMPILED in said and "the cache is refused" in said and "can be written by other users" in said
    os.chmod(cache, 0o700)
    off = subprocess.run([FDTRACE, *argv], capture_output=True, text=True, timeout=120,
                         env={**os.environ, CACHE_ENV: "off"})
    assert off.returncode == 0 and f"not kept ({CACHE_ENV}=off)" in off.stderr


def test_a_changed_tracepoint_format_is_another_key(tmp_path: Path) -> None:
    """The format files of the tracepoints whose arguments bcc lays out are part of the key: a
    kernel whose format changed gets its programs compiled again."""
    from fdtrace.kernel.features import TRACEFS

    formats = tmp_path / "events"
    for category, event in (("sched", "sched_process_exec"), ("sched", "sched_process_exit")):
        (formats / category / event).mkdir(parents=True)
        shutil.copyfile(TRACEFS / "events" / category / event / "format", formats / category / event / "format")
    text = b"TRACEPOINT_PROBE(sched, sched_process_exec) {}\nTRACEPOINT_PROBE(sched, sched_process_exit) {}\n"
    before = cache_key(text, ["-DX"], formats)
    assert cache_key(text, ["-DX"], formats) == before  # the same host, the same key
    exec_format = formats / "sched" / "sched_process_exec" / "format"
    exec_format.write_text(exec_format.read_text().replace("old_pid", "old_tid"))
    assert cache_key(text, ["-DX"], formats) != before
    assert cache_key(text, ["-DY"], formats) != cache_key(text, ["-DX"], formats)


MAPPED = """
import sys
from fdtrace.kernel.loader import TraceOptions
from fdtrace.kernel.session import KernelSession
session = KernelSession(TraceOptions())
session.start()
maps = open("/proc/self/maps").read()
print(session.notes[0] if session.notes else "", "|", "libbcc.so" in maps, "libLLVM" in maps, "bcc" in sys.modules)
session.stop()
"""


def test_a_start_from_kept_programs_loads_neither_bcc_nor_its_compiler(tmp_path: Path) -> None:
    """Compiling loads bcc (and LLVM with it); a start from the kept image needs only libbcc_bpf,
    which keeps about 60 MB of pages out of every live command."""
    def start() -> tuple[str, list[str]]:
        done = subprocess.run([sys.executable, "-c", MAPPED], capture_output=True, text=True, timeout=120,
                              env={**os.environ, CACHE_ENV: str(tmp_path / "cache")})
        assert done.returncode == 0, done.stderr
        said, _, loaded = done.stdout.strip().rpartition("|")
        return said, loaded.split()

    said, loaded = start()
    assert COMPILED in said and loaded == ["True", "True", "True"]
    said, loaded = start()
    assert LOADED in said and loaded == ["False", "False", "False"]


def test_the_map_types_are_read_as_bcc_reads_them(tmp_path: Path) -> None:
    """fdtrace's reading of bcc's type descriptions (``ctype_of``, which spares it importing bcc)
    gives every map of the programs, --stacks and --pid included, the layout bcc's own gives."""
    from bcc import BPF

    from fdtrace.kernel.bpf_cache import load_or_compile
    from fdtrace.kernel.features import probe_kernel
    from fdtrace.kernel.loader import TraceOptions, program_cflags, program_text
    from fdtrace.kernel.programs import ctype_of

    options = TraceOptions(stacks=True, pids=(os.getpid(),), follow=True)
    image = load_or_compile(program_text().encode(), program_cflags(options, probe_kernel()), tmp_path).image
    descriptions = [desc for spec in image.maps for desc in (spec.key_desc, spec.leaf_desc) if desc]
    assert len(descriptions) >= 2 * 15
    for desc in descriptions:
        parsed = json.loads(desc)
        assert ctypes_layout(ctype_of(parsed)) == ctypes_layout(BPF._decode_table_type(parsed)), desc
