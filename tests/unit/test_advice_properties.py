"""Properties of every rule of the advice layer (fdtrace.advice), over random and extreme inputs
(0, 1, the limit itself, huge values): no Change lowers the limit in force, or sets it to what
it already is, and every value is a whole number within its need and the need with the margin
(issue 33: "never advise a limit below the one in force"). A fixed seed: a failure replays."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pytest

from fdtrace.advice.change import AT_START, Change, LimitPlace, fd_limit_change
from fdtrace.advice.fixes import (
    SOMAXCONN_ADVISED,
    THREAD_PLACES,
    file_max_change,
    go_exceeded_change,
    somaxconn_change,
    thread_change,
)
from fdtrace.advice.haproxy import MAX_COUNT, HaproxyShape, accepts, maxconn_change
from fdtrace.advice.memory import MemoryFit, memory_change
from fdtrace.advice.nginx import NginxShape
from fdtrace.policy import LIMIT_MARGIN, with_margin
from fdtrace.units import MIB

CASES = 3000
HUGE = (1 << 40, MAX_COUNT, (1 << 62) - 1)


def counts(rng: random.Random, low: int = 0) -> Iterator[int]:
    """Counts as the rules meet them: the edges, small, near round limits, and huge."""
    for value in (0, 1, 2, 63, 64, 65, 1023, 1024, 8220, 65535, 65536, *HUGE):
        if value >= low:
            yield value
    for _ in range(CASES):
        yield rng.choice((rng.randrange(low, 100), rng.randrange(max(low, 1), 1 << 20), rng.randrange(low, 1 << 34)))


def pairs(seed: int, low_need: int = 0) -> list[tuple[int, int | None]]:
    """(need, limit in force) pairs: random, equal, just above and below each other, no limit."""
    rng = random.Random(seed)
    found: list[tuple[int, int | None]] = []
    for need in counts(rng, low_need):
        limit = rng.choice((None, 0, 1, need, need + 1, max(need - 1, 0), with_margin(need), with_margin(need) - 1,
                            rng.randrange(0, 1 << 36), *HUGE))
        found.append((need, limit))
    return found


def assert_raises_only(change: Change | None, need: int, limit: int | None) -> None:
    """A change sets a whole number above the limit in force, at least the need, at most the
    need with the margin (one more for rounding); none when the limit in force holds the need."""
    if change is None:
        return
    assert isinstance(change.value, int) and change.value >= 1, change
    if limit is not None:
        assert change.value > limit, (need, limit, change)
    assert need <= change.value <= with_margin(need) + 1, (need, limit, change)
    assert change.command and change.where and str(change.value) in change.command.replace(",", ""), change


@pytest.mark.parametrize("place", [AT_START, LimitPlace("haproxy", "/etc/haproxy/haproxy.cfg"),
                                   LimitPlace("nginx", "/etc/nginx/nginx.conf"),
                                   LimitPlace("unit", "haproxy.service")])
def test_an_fd_limit_is_only_ever_raised(place: LimitPlace) -> None:
    rng = random.Random(1)
    for need, soft in pairs(2):
        hard = rng.choice((None, soft, (soft or 0) + rng.randrange(0, 1 << 20)))
        change = fd_limit_change(need, "measured", soft, hard, place)
        assert_raises_only(change, need, soft)
        if soft is not None and with_margin(need) > soft and need >= 1:
            assert change is not None  # a need the limit in force does not hold is always answered


def test_a_thread_limit_is_only_ever_raised() -> None:
    rng = random.Random(3)
    for used, limit in pairs(4):
        kind = rng.choice(sorted(THREAD_PLACES))
        change = thread_change(kind, used, limit, rng.choice((None, "app.service", "session-1.scope")))
        doubled = 2 if kind in ("threads-max", "pid_max") else 1
        if change is not None:
            assert change.value > (limit if limit is not None else 0) and change.value >= used, (kind, used, limit)
            assert change.value == with_margin(used) * doubled, (kind, used, limit, change)
        elif limit is not None and used >= 1:
            assert with_margin(used) * doubled <= limit  # held: nothing to raise
    for said in counts(random.Random(5)):
        exceeded = go_exceeded_change(said)
        assert exceeded is None if said < 1 else exceeded is not None and exceeded.value > said


def test_file_max_and_somaxconn_are_only_ever_raised() -> None:
    for file_nr, file_max in pairs(6):
        if file_max is None:
            continue
        change = file_max_change(file_nr, file_max)
        if change is not None:
            assert change.value > file_max and change.value >= 2 * file_nr, (file_nr, file_max, change)
    for somaxconn in [None, *counts(random.Random(7))]:
        for overflowed in (False, True):
            change = somaxconn_change(somaxconn, overflowed)
            if change is not None:
                assert change.value == SOMAXCONN_ADVISED and (somaxconn is None or change.value > somaxconn)
            elif somaxconn is not None and overflowed:
                assert somaxconn >= SOMAXCONN_ADVISED


def test_memory_max_is_only_ever_raised_and_in_whole_mib() -> None:
    rng = random.Random(8)
    for connections, limit in pairs(9):
        per = rng.choice((1.0, 512.0, 100 * 1024.0, 4 * MIB))
        fit = MemoryFit(per, rng.choice((0.0, 12.0 * MIB)), 0.0, 10, 0, 100, "cgroup usage")
        peak = rng.choice((None, 0, limit, (limit or 0) * 4 // 5, (limit or 0) * 9 // 10))
        said = memory_change(rng.choice(("haproxy", "app")), limit, peak, fit if connections else None,
                             connections or None, "its maxconn")
        if said.change is None:
            continue
        value = said.change.value
        assert value % MIB == 0 and value >= MIB, said
        assert limit is not None and value > limit, (connections, limit, said)
        need = said.need if said.need is not None else peak
        assert need is not None and value >= need * LIMIT_MARGIN - 1, said
        assert value <= math.ceil(need * LIMIT_MARGIN / MIB) * MIB + MIB, said


def test_haproxy_s_maxconn_is_only_ever_raised_and_its_pair_is_one_haproxy_accepts() -> None:
    rng = random.Random(10)
    for connections, maxconn in pairs(11, low_need=1):
        connections = min(connections, MAX_COUNT // 8)
        shape = HaproxyShape(nbthread=rng.randrange(1, 65), binds=rng.randrange(0, 5),
                             stats_sockets=rng.randrange(0, 3), checks=rng.randrange(0, 10), splice=rng.random() < 0.3)
        demanded = shape.maxsock(min(max(maxconn or 1, 1), MAX_COUNT // 8))  # the FD limit its maxconn demands
        fd_in_force = rng.choice((None, 64, 1024, demanded, demanded + 1, *HUGE))
        change = maxconn_change(connections, maxconn, shape, fd_in_force, "/etc/haproxy/haproxy.cfg")
        if change is None:
            assert maxconn is not None and with_margin(connections) <= maxconn
            continue
        assert change.value > (maxconn or 0) and change.value >= connections
        assert change.value == min(with_margin(connections), MAX_COUNT)
        if "ulimit-n " in change.command:  # the FD limit named: above the one in force, and accepted
            fd = int(change.command.split("ulimit-n ")[1].split()[0])
            assert fd_in_force is not None and fd > fd_in_force and accepts(change.value, fd, shape)
        else:  # the FD limit in force holds what HAProxy demands for it
            assert fd_in_force is None or accepts(change.value, fd_in_force, shape)
        wanted, limit = shape.pair(connections)
        assert accepts(wanted, limit, shape) and wanted >= connections


def test_nginx_s_worker_connections_and_fd_limit_are_only_ever_raised() -> None:
    rng = random.Random(12)
    for connections, worker_connections in pairs(13, low_need=1):
        shape = NginxShape("/etc/nginx/nginx.conf", worker_connections=min(max(worker_connections or 1, 1), MAX_COUNT),
                           listeners=rng.randrange(0, 4))
        change = shape.connections_change(min(connections, MAX_COUNT // 4))
        if change is not None:
            assert change.value > shape.worker_connections
        assert_raises_only(shape.fd_change(connections, "rehearsed", worker_connections, None), connections,
                           worker_connections)
