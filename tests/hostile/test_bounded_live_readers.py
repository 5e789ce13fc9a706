"""Live readers of another user's data bounded by what they may cost (issue 37, B and C): a
library whose string table is moved to a 64 MiB sparse tail, mapped many times over by threads
blocked in it, and a fake CPython whose runtime holds thousands of thread states. Before, the
first made `record` reach 6 GB in 12 s (every copy's 64 MiB of zeros read and kept), the second
held a round for 200 s. Each planted process runs as `nobody`; each command runs in a memory
cgroup of its own, whose peak is fdtrace's memory (and a regression is killed there, not on the
machine)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import FDTRACE, memory_cgroup

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("gcc") is None,
                                reason="plants processes as nobody, built with gcc: needs root")

#: The copies of the crafted library one process maps (the trial's 300, fewer to keep it quick:
#: before, 40 copies were already 2.5 GiB).
COPIES = 40
#: Where the string table is moved to, and its claimed size: 64 MiB of a sparse tail.
SPARSE_AT = SPARSE_SIZE = 64 << 20
#: fdtrace's own peak memory may not pass this (its imports take about 120 MiB).
MAX_MEMORY_BYTES = 400 << 20
#: The cgroup the commands run in (a regression is killed there, not on the host).
CGROUP_BYTES = 1 << 30

LIBRARY = r"""
#include <unistd.h>
__attribute__((noinline)) long wait_here(int fd) { char b; long r = read(fd, &b, 1); return r + 1; }
"""
VICTIM = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static int pipefd[2];
static void *run(void *f) { ((long (*)(int))f)(pipefd[0]); return 0; }
int main(int argc, char **argv) {
    if (pipe(pipefd)) return 1;
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        pthread_t t;
        pthread_create(&t, 0, run, dlsym(h, "wait_here"));
    }
    printf("ready\n");
    fflush(stdout);
    pause();
}
"""


def gcc(source: str, out: Path, *flags: str) -> Path:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", "-O1", "-fno-omit-frame-pointer", *flags, "-o", str(out), str(src)], check=True,
                   capture_output=True, timeout=120)
    return out


def move_strtab_to_sparse_tail(library: Path) -> None:
    """Point the library's .strtab (the table .symtab links to) at SPARSE_SIZE bytes at SPARSE_AT,
    and make the file that long: a hole, no bytes on disk."""
    data = bytearray(library.read_bytes())
    shoff, = struct.unpack_from("<Q", data, 0x28)
    entry, count = struct.unpack_from("<HH", data, 0x3A)
    for index in range(count):
        at = shoff + index * entry
        if struct.unpack_from("<I", data, at + 4)[0] == 2:  # SHT_SYMTAB
            link, = struct.unpack_from("<I", data, at + 0x28)
            strings = shoff + link * entry
            struct.pack_into("<QQ", data, strings + 0x18, SPARSE_AT, SPARSE_SIZE)
            break
    else:
        raise AssertionError("no .symtab")
    library.write_bytes(data)
    os.truncate(library, SPARSE_AT + SPARSE_SIZE)


@pytest.fixture(scope="module")
def planted() -> Iterator[Path]:
    """A folder `nobody` can read, for what the attacker plants."""
    folder = Path(tempfile.mkdtemp(prefix="fdtrace-hostile-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def blocked_threads(pid: int, syscall: int) -> int:
    count = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            count += (task / "syscall").read_text().split()[0] == str(syscall)
        except (OSError, IndexError):
            pass
    return count


def start_as_nobody(argv: list[str], threads: int, syscall: int = 0) -> subprocess.Popen[str]:
    """``argv`` started as nobody, once it says "ready" and ``threads`` of its threads are blocked
    in ``syscall`` (0: read)."""
    process = subprocess.Popen(argv, user="nobody", group="nogroup", stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while blocked_threads(process.pid, syscall) < threads:
        assert time.monotonic() < deadline, "the planted threads never blocked"
        time.sleep(0.05)
    return process


def cgroup_peak(procs: Path) -> int:
    """The most memory the cgroup of ``procs`` was charged since it was made (v2 memory.peak, v1
    memory.max_usage_in_bytes): what fdtrace allocated after it moved there, its own exec on. Not
    the child's ru_maxrss, which counts the pages of the test process it was forked from."""
    for name in ("memory.peak", "memory.max_usage_in_bytes"):
        if (procs.parent / name).exists():
            return int((procs.parent / name).read_text())
    raise AssertionError("the memory cgroup keeps no peak")


def fdtrace_measured(args: list[str], procs: Path, out: Path,
                     timeout: float = 120) -> tuple[int, int, str, str]:
    """(exit status, peak memory in bytes, stdout, stderr) of a fdtrace command run in a fresh
    memory cgroup (``procs``: its cgroup.procs)."""
    with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
        process = subprocess.Popen([FDTRACE, *args], stdout=stdout, stderr=stderr,
                                   preexec_fn=lambda: procs.write_text(str(os.getpid())))
        deadline = time.monotonic() + timeout
        while True:
            pid, status, _ = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                process.kill()
                raise AssertionError(f"fdtrace {' '.join(args)} ran past {timeout} s")
            time.sleep(0.05)
        process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, cgroup_peak(procs), (out / "stdout").read_text(), (out / "stderr").read_text()


@pytest.fixture(scope="module")
def sparse_victim(planted: Path) -> Iterator[subprocess.Popen[str]]:
    """A nobody process mapping COPIES copies of a library whose string table is a 64 MiB hole,
    a thread blocked in read() inside each."""
    library = gcc(LIBRARY, planted / "libplanted.so", "-shared", "-fPIC")
    move_strtab_to_sparse_tail(library)
    copies = []
    for index in range(COPIES):
        copy = planted / f"libplanted{index}.so"
        subprocess.run(["cp", "--sparse=always", str(library), str(copy)], check=True)
        copies.append(str(copy))
    assert sum(os.stat(c).st_blocks * 512 for c in copies) < 4 << 20  # a few MiB on disk in all
    victim = gcc(VICTIM, planted / "victim", "-lpthread", "-ldl")
    process = start_as_nobody([str(victim), *copies], threads=COPIES)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_threads_of_a_process_mapping_sparse_libraries_read_no_hole(sparse_victim: subprocess.Popen[str],
                                                                     tmp_path: Path) -> None:
    import json

    with memory_cgroup(CGROUP_BYTES) as procs:
        status, peak, stdout, stderr = fdtrace_measured(["threads", "--pid", str(sparse_victim.pid), "--json"],
                                                        procs, tmp_path)
    assert status == 0, stderr
    assert peak < MAX_MEMORY_BYTES, f"fdtrace threads reached {peak >> 20} MiB"
    said = json.loads(stdout)
    assert said["threads"] == COPIES + 1
    blocked = [s for s in said["census"] if s["syscall"] == "read"]
    assert sum(s["threads"] for s in blocked) == COPIES
    # every copy's table was refused on its bytes on disk, and that is counted, once per copy
    assert said["unread"] == [f"symbols of {COPIES} binaries not read (tables larger than the file holds on disk, "
                              "or unreadable)"]


def test_record_beside_a_process_mapping_sparse_libraries(sparse_victim: subprocess.Popen[str],
                                                          tmp_path: Path) -> None:
    out = tmp_path / "rec"
    with memory_cgroup(CGROUP_BYTES) as procs:
        status, peak, _, stderr = fdtrace_measured(
            # --top 0: the victim's census alone (the host's other processes are no part of the count)
            ["record", "-o", str(out), "--duration", "4", "--interval", "0.5", "--pid", str(sparse_victim.pid),
             "--top", "0"],
            procs, tmp_path)
    assert status == 0, stderr
    assert peak < MAX_MEMORY_BYTES, f"fdtrace record reached {peak >> 20} MiB"
    said = f"symbols of {COPIES} binaries not read (tables larger than the file holds on disk, or unreadable)"
    assert f"left unread: {said}" in stderr
    info = subprocess.run([FDTRACE, "info", str(out)], capture_output=True, text=True, timeout=120)
    assert info.returncode == 0 and f"\n  left unread while recording: {said}\n" in info.stdout, info.stdout


#: A fake CPython 3.11 (its executable is named python3.11, exporting _PyRuntime and Py_Version):
#: INTERPRETERS interpreters of THREADS thread states each, every state naming the process's own
#: thread and a chain of FRAMES frames, each frame's code with a line table of LINETABLE bytes.
FAKE_PYTHON = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
unsigned char _PyRuntime[4096];
uint64_t Py_Version = 0x030B00F0;  /* 3.11.0 final */
#define W(base, at, value) (*(uint64_t *)((char *)(base) + (at)) = (uint64_t)(value))
static void *text(const char *s) {  /* a compact ASCII str object */
    char *o = calloc(1, 48 + strlen(s) + 1);
    W(o, 16, strlen(s));
    *(uint32_t *)(o + 32) = 4 | 32 | 64;  /* kind 1, compact, ascii */
    memcpy(o + 48, s, strlen(s));
    return o;
}
int main(int argc, char **argv) {
    int interpreters = atoi(argv[1]), threads = atoi(argv[2]), frames = atoi(argv[3]);
    long linetable = atol(argv[4]);
    char *previous = 0, *first = 0;
    for (int f = frames - 1; f >= 0; f--) {  /* the innermost frame last: it is the current one */
        char *code = calloc(1, 256), *frame = calloc(1, 128), *table = calloc(1, 32 + linetable);
        W(table, 16, linetable);
        W(code, 112, text("/srv/app.py"));
        W(code, 128, text(f == 0 ? "planted_wait" : "planted_caller"));
        W(code, 136, table);
        *(int32_t *)(code + 72) = 7;
        W(frame, 32, code);
        W(frame, 48, previous);
        W(frame, 56, code + 184);  /* its first instruction */
        previous = first = frame;
    }
    char *cframe = calloc(1, 64);
    W(cframe, 8, first);
    char *interpreter = 0;
    for (int i = 0; i < interpreters; i++) {
        char *next = calloc(1, 64), *state = 0;
        W(next, 0, interpreter);
        for (int t = 0; t < threads; t++) {
            char *s = calloc(1, 256);
            W(s, 8, state);
            W(s, 56, cframe);
            W(s, 160, getpid());
            state = s;
        }
        W(next, 16, state);
        interpreter = next;
    }
    W(_PyRuntime, 40, interpreter);
    printf("ready\n");
    fflush(stdout);
    char b;
    return read(0, &b, 1) < 0;
}
"""


@pytest.fixture(scope="module")
def fake_python(planted: Path) -> Iterator[subprocess.Popen[str]]:
    """The trial's fake CPython: 16 interpreters of 4096 thread states, 128 frames under each,
    each frame's code with a 1 MiB line table (never touched: no memory of the process's)."""
    from fdtrace.procfs.python_frames import LAYOUTS

    layout = LAYOUTS[3, 11]  # the offsets FAKE_PYTHON writes at
    assert (layout.interpreters_head, layout.threads_head, layout.thread_next, layout.native_thread_id,
            layout.cframe, layout.current_frame, layout.frame_code, layout.frame_previous, layout.frame_prev_instr,
            layout.code_filename, layout.code_qualname, layout.code_linetable, layout.code_firstlineno,
            layout.code_instructions, layout.ascii_data) == (40, 16, 8, 160, 56, 8, 32, 48, 56, 112, 128, 136, 72,
                                                             184, 48)
    binary = gcc(FAKE_PYTHON, planted / "python3.11", "-rdynamic")
    process = subprocess.Popen([str(binary), "16", "4096", "128", str(1 << 20)], user="nobody", group="nogroup",
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while blocked_threads(process.pid, 0) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_fake_cpython_walk_is_abandoned_within_its_bounds_and_said(fake_python: subprocess.Popen[str],
                                                                      tmp_path: Path) -> None:
    import json

    began = time.monotonic()
    with memory_cgroup(CGROUP_BYTES) as procs:
        status, peak, stdout, stderr = fdtrace_measured(["threads", "--pid", str(fake_python.pid), "--json"],
                                                        procs, tmp_path)
    took = time.monotonic() - began
    assert status == 0, stderr
    assert took < 20, f"took {took:.1f} s"  # 200 s before, for one round
    assert peak < MAX_MEMORY_BYTES, f"fdtrace threads reached {peak >> 20} MiB"
    said = json.loads(stdout)
    # the right answer: its one thread waits in read() in the Python function planted innermost
    assert said["census"] == [{"syscall": "read", "fd_kind": "pipe", "site": "planted_wait (app.py:7)", "threads": 1}]
    assert said["python"]["version"] == "3.11"
    assert said["python"]["frames_unread"].startswith("walk abandoned after 1 threads' stacks (more than 4096 "
                                                      "thread states)")
    assert said["unread"] == ["1 Python stack walks abandoned (over their bounds)"]


def test_record_beside_a_fake_cpython_keeps_its_rounds(fake_python: subprocess.Popen[str], tmp_path: Path) -> None:
    from fdtrace.analysis import load

    out = tmp_path / "rec"
    with memory_cgroup(CGROUP_BYTES) as procs:
        status, peak, _, stderr = fdtrace_measured(
            ["record", "-o", str(out), "--duration", "5", "--interval", "0.5", "--pid", str(fake_python.pid)],
            procs, tmp_path)
    assert status == 0, stderr
    assert peak < MAX_MEMORY_BYTES, f"fdtrace record reached {peak >> 20} MiB"
    assert "Python stack walks abandoned (over their bounds)" in stderr
    times = sorted(set(load(out).samples.query(f"pid == {fake_python.pid}")["ts_ns"]))
    gaps = [(b - a) / 1e9 for a, b in zip(times, times[1:], strict=False)]
    assert len(times) >= 4 and max(gaps) < 3.0, gaps  # a round every 0.5 s; one was 199.8 s late before


#: The trial's -f list: 400 paths that all name one folder of 64 configuration files of 1 MiB.
CONFIG_PATHS = 400
CONFIG_FILES = 64


def test_a_long_f_list_reads_a_bounded_configuration(planted: Path, tmp_path: Path) -> None:
    import json

    from fdtrace.integrations.haproxy import MAX_CONFIG_PATHS, MAX_PROCESS_CONFIG_BYTES

    folder = planted / "configs"
    folder.mkdir()
    folder.chmod(0o755)
    for index in range(CONFIG_FILES):
        with open(folder / f"{index:02d}.cfg", "wb") as config:
            config.write(b"#" * (1 << 20))
    for index in range(CONFIG_PATHS):
        (folder / f"d{index}").mkdir()
    script = planted / "haproxy"
    script.write_text("#!/bin/sh\nsleep 60\n")
    script.chmod(0o755)
    args = [word for index in range(CONFIG_PATHS) for word in ("-f", f"d{index}/..")]  # each the folder itself
    process = subprocess.Popen([str(script), *args], user="nobody", group="nogroup", cwd=folder,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{process.pid}/comm").read_text().strip() != "haproxy":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        began = time.monotonic()
        with memory_cgroup(CGROUP_BYTES) as procs:
            status, peak, stdout, stderr = fdtrace_measured(["doctor", "--pid", str(process.pid), "--json"], procs,
                                                            tmp_path)
        took = time.monotonic() - began
    finally:
        os.killpg(process.pid, 9)
        process.wait()
    assert status in (0, 1, 2) and "Traceback" not in stderr, stderr
    assert took < 20, f"took {took:.1f} s"  # 58.4 s between two rounds before
    assert peak < MAX_MEMORY_BYTES, f"fdtrace doctor reached {peak >> 20} MiB"
    findings = [c["current"] for c in json.loads(stdout)["checks"] if c["name"] == "haproxy config"]
    spent = [f"d{index}/..: not read: the {MAX_PROCESS_CONFIG_BYTES >> 20} MiB of configuration read for one "
             "process were read" for index in range(1, MAX_CONFIG_PATHS)]
    rest = (f"d{MAX_CONFIG_PATHS}/..: not read: {CONFIG_PATHS - MAX_CONFIG_PATHS} more -f paths on the command "
            f"line not followed (at most {MAX_CONFIG_PATHS})")
    assert [f for f in findings if "not read" in f] == [*spent, rest]
