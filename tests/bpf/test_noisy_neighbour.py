"""The flight recorder's incident budget against a noisy neighbour (issues 35 and 37 H): an 8 MiB
ring, one early EMFILE incident of root's program, then a socket flood and another user's
program (run as nobody) failing every 1.5 s. The early incident's window is trimmed to what the
budget holds, never given up: every one of its EMFILE failures is in the recording at the end,
which stays within --max-size plus --keep-incidents, and the exit line, info and the metadata
say what was trimmed or given up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fdtrace.analysis import load
from fdtrace.cli.common import parse_size
from tests.conftest import needs_root
from tests.helpers import FDTRACE, started

pytestmark = [needs_root(), pytest.mark.bpf]

MAX_SIZE = "8M"
KEEP = parse_size(MAX_SIZE) // 2  # --keep-incidents' default
EARLY_REFUSED = 47  # socket() calls of the early incident refused with EMFILE
NOISY_EVERY_S, NOISY_REFUSED = 1.5, 3  # the neighbour's burst: this many EMFILE, this often
FLOOD_S = 30  # at most: the flood stops once the ring has turned over
PYTHON = "/usr/bin/python3"  # readable by nobody (the worktree's venv may not be)

TAG = os.getpid() % 100000
NAME = """
import ctypes
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"NAME"), 0, 0, 0)  # PR_SET_NAME: this test's events only
"""
EARLY = NAME.replace("NAME", f"early-{TAG}") + f"""
import socket, sys
held, refused = [], 0
while refused < {EARLY_REFUSED}:
    try:
        held.append(socket.socket())
    except OSError as exc:
        assert exc.errno == 24, exc
        refused += 1
print(refused, flush=True)
sys.stdin.read()  # alive (its uid readable) until the test has seen its window
"""
FLOOD = r"""
#include <pthread.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
static struct timespec end;
static void *flood(void *seed) {  /* close() of a random fd (fdtrace's cheapest event, its fd column
                                      all but incompressible: the ring fills fast), and socket()+close() */
    struct timespec now;
    unsigned int state = (unsigned int)(long)seed;
    do {
        for (int i = 0; i < 1000; i++)
            close(i % 8 ? 1000000 + (int)(rand_r(&state) % 1000000) : socket(AF_INET, SOCK_STREAM, 0));
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (now.tv_sec < end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec < end.tv_nsec));
    return seed;
}
int main(int argc, char **argv) {  /* THREADS threads for argv[1] seconds, named argv[2] */
    pthread_t threads[THREADS];
    prctl(PR_SET_NAME, argv[2], 0, 0, 0);
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += atoi(argv[1]);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, flood, (void *)(long)(i + 1));
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    return 0;
}
""".replace("THREADS", "2")
NOISY = NAME.replace("NAME", f"noisy-{TAG}") + f"""
import select, socket, sys, time
refused = 0
while True:  # until its stdin closes
    tick, held, failed = time.monotonic(), [], 0
    while failed < {NOISY_REFUSED}:
        try:
            held.append(socket.socket())
        except OSError:
            failed += 1
    refused += failed
    for sock in held:
        sock.close()
    if select.select([sys.stdin], [], [], max(0.0, tick + {NOISY_EVERY_S} - time.monotonic()))[0]:
        break
print(refused, flush=True)
"""


def parts_size(out: Path) -> int:
    total = 0
    for part in out.glob("*/host=*/part-*.parquet"):
        try:
            total += part.stat().st_size
        except FileNotFoundError:  # merged or rotated out meanwhile
            pass
    return total


def meta_of(out: Path) -> dict:
    for path in (out / "meta").glob("host=*.json"):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):  # being replaced
            pass
    return {}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    work = tmp_path_factory.mktemp("neighbour")
    out = work / "rec"
    (work / "flood.c").write_text(FLOOD)
    subprocess.run(["gcc", "-O2", "-pthread", "-o", str(work / "flood"), str(work / "flood.c")], check=True,
                   timeout=60)
    recorder = started([FDTRACE, "record", "-o", str(out), "--max-size", MAX_SIZE, "--rotate", "1",
                        "--interval", "0.5", "--comm", f"early-{TAG}", "--comm", f"flood-{TAG}",
                        "--comm", f"noisy-{TAG}"], "recording to")
    peak = 0
    try:
        early = subprocess.Popen(["prlimit", "--nofile=32:32", PYTHON, "-c", EARLY], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        assert early.stdout is not None and early.stdin is not None
        refused = int(early.stdout.readline())
        deadline = time.monotonic() + 30
        while not any(w.get("program") == f"early-{TAG}" for w in meta_of(out).get("incident_windows", [])):
            assert time.monotonic() < deadline, "the early incident's window never reached the metadata"
            time.sleep(0.1)
        early.stdin.close()
        early.wait(timeout=30)
        flood = subprocess.Popen([str(work / "flood"), str(FLOOD_S), f"flood-{TAG}"])
        noisy = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "prlimit",
                                  "--nofile=16:16", PYTHON, "-c", NOISY], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, cwd="/")
        turned = None  # when the ring first deleted a part
        while flood.poll() is None and (turned is None or time.monotonic() < turned + 2):
            peak = max(peak, parts_size(out))
            if turned is None and meta_of(out).get("rotated_out", {}).get("files"):
                turned = time.monotonic()
            time.sleep(0.25)
        flood.terminate()
        flood.wait(timeout=30)
        noisy_refused = int(noisy.communicate("", timeout=30)[0])
        assert noisy.returncode == 0
    finally:
        recorder.send_signal(signal.SIGINT)
        _, said = recorder.communicate(timeout=60)
    assert recorder.returncode == 0, said
    return {"out": out, "refused": refused, "noisy": noisy_refused, "said": said, "peak": peak}


def test_every_emfile_of_the_early_incident_outlives_the_flood_and_the_neighbour(run: dict[str, object]) -> None:
    out = run["out"]
    assert isinstance(out, Path)
    meta = meta_of(out)
    assert meta["rotated_out"]["files"] > 0 and meta["bytes"] > parse_size(MAX_SIZE)  # the ring turned over
    events = load(out).events
    early = events[(events["comm"] == f"early-{TAG}") & (events["errno"] == "EMFILE")]
    assert len(early) == run["refused"] == EARLY_REFUSED
    [window] = [w for w in meta["incident_windows"] if w["program"] == f"early-{TAG}"]
    assert window["uid"] == 0 and window["incidents"] == {"EMFILE/ENFILE": EARLY_REFUSED}
    noisy = events[(events["comm"] == f"noisy-{TAG}") & (events["errno"] == "EMFILE")]
    assert 0 < int(run["noisy"]) and len(noisy) <= int(run["noisy"])  # the neighbour did fail, as nobody
    assert all(w["uid"] == 65534 for w in meta["incident_windows"] if w["program"] == f"noisy-{TAG}")


def test_the_recording_stays_within_its_bounds(run: dict[str, object]) -> None:
    out = run["out"]
    assert isinstance(out, Path)
    bound = parse_size(MAX_SIZE) + KEEP
    assert parts_size(out) <= bound and int(run["peak"]) <= bound, (parts_size(out), run["peak"], bound)


def test_the_exit_line_info_and_the_metadata_say_what_was_trimmed_or_given_up(run: dict[str, object]) -> None:
    out = run["out"]
    assert isinstance(out, Path)
    meta = meta_of(out)
    kept, dropped = meta["incident_windows"], meta["incidents_dropped"]
    trimmed = sum(w["trimmed"] for w in kept)
    assert trimmed == meta["incidents_trimmed"] and trimmed >= 1  # 30 s after the early one: more than 4 MiB
    [line] = [line for line in str(run["said"]).splitlines() if line.startswith("fdtrace: recorded")]
    assert f"incident windows: {len(kept)} kept ({trimmed} trimmed to fit --keep-incidents)" in line, line
    assert f"; {meta['rotated_out']['files']} oldest files ({meta['rotated_out']['bytes']} bytes" in line, line
    assert (f"{dropped['windows']} given up ({dropped['incidents']} incidents)" in line) == (dropped["windows"] > 0)
    shown = subprocess.run([FDTRACE, "info", str(out)], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    [early] = [line for line in shown.stdout.splitlines() if f"early-{TAG} (uid 0)" in line]
    assert f"EMFILE/ENFILE {EARLY_REFUSED}" in early and "trimmed" in early
