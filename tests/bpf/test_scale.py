"""fdtrace scale and the ledger against real gloo DDP jobs (CPU), with /proc as the ground truth.

One module fixture runs the small jobs once, in a network namespace with only loopback: one
recording of the job at 2 and 3 ranks under a 48-descriptor limit, and one of the job at 4 ranks
and of a job that makes a second world-sized Gloo group; /proc is watched meanwhile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fdtrace.analysis import load
from fdtrace.analysis.rank_ledger import job_ledgers
from fdtrace.analysis.scale import project
from tests.bpf.test_ddp_phases import free_port
from tests.helpers import FDTRACE

torch = pytest.importorskip("torch")
# The fixture runs four small jobs under the tracer and two real ones: minutes on a busy machine.
pytestmark = [pytest.mark.bpf, pytest.mark.timeout(3000)]
TRAIN = str(Path(__file__).parents[1] / "data" / "ddp_train.py")
LIMIT = 48


@dataclass
class RankSeen:
    """One rank process as /proc saw it at its most descriptors."""

    pid: int
    world: int
    port: int
    fds: int = 0
    inodes: set[int] = field(default_factory=set)
    tcp: list[tuple[int, int, str, int]] = field(default_factory=list)  # local port, remote port, state, inode


class ProcWatch:
    """Polls the namespace's rank processes (mp.spawn's children) every few ms: each one's open
    descriptors at their peak, with its socket inodes and (``tables``) the namespace's TCP table
    then."""

    def __init__(self, netns: str, tables: bool = False) -> None:
        self.netns = os.stat(f"/run/netns/{netns}").st_ino
        self.tables = tables
        self.seen: dict[int, RankSeen] = {}
        self.ignored: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ProcWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in [int(name) for name in os.listdir("/proc") if name.isdigit()]:
                if pid in self.ignored:
                    continue
                try:
                    self._look(pid)
                except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError, IndexError):
                    pass
            time.sleep(0.02)

    def _look(self, pid: int) -> None:
        rank = self.seen.get(pid)
        if rank is None:
            if os.stat(f"/proc/{pid}/ns/net").st_ino != self.netns:
                self.ignored.add(pid)
                return
            if b"spawn_main" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return  # (not ignored: a process forked in the namespace may exec a rank next)
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            parent = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
            if b"--world" not in parent:
                return
            world = int(parent[parent.index(b"--world") + 1])
            port = int(parent[parent.index(b"--port") + 1])
            rank = self.seen[pid] = RankSeen(pid, world, port)
        links = []
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                links.append(os.readlink(f"/proc/{pid}/fd/{name}"))
            except FileNotFoundError:
                pass
        inodes = {int(link[8:-1]) for link in links if link.startswith("socket:[")}
        if len(links) > rank.fds:
            rank.fds, rank.inodes, rank.tcp = len(links), inodes, []
        elif len(links) < rank.fds or inodes != rank.inodes:
            return
        if not self.tables:
            return
        # The kernel hands /proc/net/tcp out a page at a time, each page resumed by its position in
        # the table: a socket made or closed between two pages shifts the rest, and a line comes
        # twice or not at all. The lines of every read while the rank is at its peak are kept,
        # each once (a socket's inode names it).
        known = set(rank.tcp)
        for table in ("tcp", "tcp6"):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                cols = line.split()
                entry = (int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16), cols[3], int(cols[9]))
                if entry not in known:
                    known.add(entry)
                    rank.tcp.append(entry)


@dataclass
class Runs:
    small: Path  # the job at 2 and 3 ranks, each rank under LIMIT descriptors
    four: Path  # the job at 4 ranks, and the job with a second Gloo group at 3 ranks
    four_port: int
    group_port: int
    seen: dict[int, RankSeen]
    netns: list[str]
    tmp: Path


def _job(world: int, port: int, tmp: Path, *extra: str) -> str:
    return (f"prlimit --nofile={LIMIT}:{LIMIT} {sys.executable} {TRAIN} --world {world} --steps 4 --step-sleep 0.4 "
            f"--port {port} --checkpoint {tmp}/ckpt-{port}.pt {' '.join(extra)}")


def _run(argv: list[str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    tmp = tmp_path_factory.mktemp("scale")
    name = f"fdtrace-scale-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        netns = ["ip", "netns", "exec", name]
        ports = [free_port() for _ in range(4)]
        with ProcWatch(name, tables=True) as watch:
            _run([*netns, FDTRACE, "run", "--record", str(tmp / "small"), "--", "sh", "-ec",
                  f"{_job(2, ports[0], tmp)}\n{_job(3, ports[1], tmp)}"])
            _run([*netns, FDTRACE, "run", "--record", str(tmp / "four"), "--", "sh", "-ec",
                  f"{_job(4, ports[2], tmp)}\n{_job(3, ports[3], tmp, '--second-group')}"])
        yield Runs(tmp / "small", tmp / "four", ports[2], ports[3], watch.seen, netns, tmp)
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def _real_peaks(runs: Runs, world: int) -> tuple[subprocess.CompletedProcess[str], list[int]]:
    """A real run of the job at ``world`` ranks under LIMIT (phases marked, not recorded): its
    ranks' peaks of open descriptors from /proc, largest first."""
    port = free_port()
    with ProcWatch(runs.netns[3]) as watch:
        result = subprocess.run([*runs.netns, FDTRACE, "run", "--", "sh", "-ec", _job(world, port, runs.tmp)],
                                capture_output=True, text=True, timeout=900)
    return result, sorted((r.fds for r in watch.seen.values() if r.port == port), reverse=True)


def test_scale_projects_a_real_six_rank_run_and_a_max_world_the_limit_allows(runs: Runs) -> None:
    out = subprocess.run([FDTRACE, "scale", str(runs.small), "--world", "6", "--json"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    projection = json.loads(out.stdout)
    assert projection["world"] == 6 and [r["rank"] for r in projection["ranks"]] == list(range(6))
    assert projection["seen_worlds"] == [2, 3]
    assert {r["limit"] for r in projection["ranks"]} == {LIMIT}
    for rank in projection["ranks"]:
        assert rank["fds"] == sum(rank["by_owner"].values())
        assert rank["by_owner"]["pairs"] == 5  # the full mesh: one per peer
    assert projection["ranks"][0]["by_owner"]["store_server"] == 6  # the store: one per rank, on rank 0
    result, real = _real_peaks(runs, 6)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(real) == 6, real
    projected = sorted((r["fds"] for r in projection["ranks"]), reverse=True)
    print(f"6 ranks: projected {projected}, /proc {real}")  # the figures docs/scale.md gives (pytest -rA)
    for mine, truth in zip(projected, real, strict=True):
        assert abs(mine - truth) <= max(2, 0.1 * truth), (projected, real)
    first, max_world = projection["first_limit"], projection["max_world"]
    assert first["name"] == "RLIMIT_NOFILE of rank 0" and first["at_world"] == max_world + 1
    assert max_world > 6
    result, real = _real_peaks(runs, max_world)
    assert result.returncode == 0, result.stderr[-3000:]
    print(f"max_world {max_world}: /proc {real}")
    assert len(real) == max_world and max(real) <= LIMIT, real


def test_the_ledger_of_four_ranks_matches_proc(runs: Runs) -> None:
    [four, group] = job_ledgers(load(runs.four))
    assert four.world_size == 4 and four.store_port == runs.four_port and four.store_rank == 0
    assert four.rendezvous == f"127.0.0.1:{runs.four_port}"
    owners = four.by_owner()
    assert owners["pairs"].tolist() == [3, 3, 3, 3]
    assert owners["store_server"].tolist() == [4, 0, 0, 0]
    assert owners["store_client"].tolist() == [1, 1, 1, 1]
    # /proc: each rank's established connections (its own socket inodes in the namespace's table)
    ranks = [r for r in runs.seen.values() if r.port == runs.four_port]
    assert len(ranks) == 4
    port = runs.four_port
    store = [r for r in ranks if any(lp == port and st == "0A" and ino in r.inodes for lp, _, st, ino in r.tcp)]
    assert len(store) == 1
    for rank in ranks:
        mine = [(lp, rp) for lp, rp, st, ino in rank.tcp if st == "01" and ino in rank.inodes]
        pairs = [c for c in mine if port not in c]
        assert len(pairs) == 3, mine
        served = [c for c in mine if c[0] == port]
        assert len(served) == (4 if rank is store[0] else 0)
    ledger = four.owners
    assert set(ledger[ledger["owner"] == "pairs"]["phase"]) == {"init_process_group"}
    assert group.world_size == 3


def test_a_second_gloo_group_doubles_the_pairs(runs: Runs) -> None:
    [_four, group] = job_ledgers(load(runs.four))
    assert group.by_owner()["pairs"].tolist() == [4, 4, 4]
    assert set(group.owners[group.owners["owner"] == "pairs"]["phase"]) == {"init_process_group", "new_group"}
    one = project(job_ledgers(load(runs.small)), 16)
    two = project([group], 16)
    for role in one.roles:
        assert two.roles[role]["by_owner"]["pairs"] == 2 * one.roles[role]["by_owner"]["pairs"] == 30


def test_bad_input_is_one_line(runs: Runs) -> None:
    mixed = subprocess.run([FDTRACE, "scale", str(runs.four), "--world", "8"], capture_output=True, text=True,
                           timeout=120)
    assert mixed.returncode != 0 and mixed.stderr.count("\n") == 1
    assert mixed.stderr.startswith("fdtrace: error: the recordings are of different jobs")
    emfile = Path(__file__).parents[1] / "data" / "emfile"
    none = subprocess.run([FDTRACE, "scale", str(emfile), "--world", "8"], capture_output=True, text=True, timeout=120)
    assert none.returncode != 0 and none.stderr.count("\n") == 1 and "no distributed job" in none.stderr
