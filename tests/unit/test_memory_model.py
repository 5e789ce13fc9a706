"""The memory half of the needs model (fdtrace.policy): the memory a connection costs, fitted
robustly from (sockets, bytes) samples, and what a number of connections needs against a limit."""

from __future__ import annotations

from fdtrace.advice.memory import memory_advice, memory_fit
from fdtrace.policy import LIMIT_MARGIN, MIB

PER = 100 * 1024
BASE = 12 * MIB


def test_the_slope_is_the_memory_of_a_connection_whatever_one_odd_sample_says() -> None:
    points = [(n, BASE + PER * n) for n in range(0, 1400, 50)]
    points[5] = (points[5][0], points[5][1] + 80 * MIB)  # a sample taken mid-burst
    fit = memory_fit(points, "cgroup usage")
    assert fit is not None
    assert fit.per_connection == PER and fit.base == BASE and fit.points == len(points)
    assert (fit.sockets_from, fit.sockets_to) == (0, 1350)
    assert fit.at(4096) == BASE + PER * 4096


def test_no_fit_without_growth_in_connections() -> None:
    assert memory_fit([(20, BASE)] * 30, "RSS") is None  # one socket count: nothing to fit
    assert memory_fit([(n, BASE) for n in (10, 11, 12, 13, 14)], "RSS") is None  # a span of 4 sockets
    assert memory_fit([(n, BASE - PER * n) for n in range(0, 500, 50)], "RSS") is None  # shrinking: no cost
    assert memory_fit([(n, BASE + PER * n) for n in range(0, 400, 100)], "RSS") is None  # 4 samples


def test_many_samples_are_bounded_and_give_the_same_slope() -> None:
    fit = memory_fit([(n % 2000, BASE + PER * (n % 2000)) for n in range(100_000)], "RSS")
    assert fit is not None and fit.points == 120 and fit.per_connection == PER


def test_what_connections_need_against_the_limit_and_what_to_change() -> None:
    fit = memory_fit([(n, BASE + PER * n) for n in range(0, 1400, 50)], "cgroup usage")
    assert fit is not None
    need, why, change = memory_advice("haproxy", fit, 4096, "its maxconn", 256 * MIB)
    assert need == BASE + PER * 4096
    assert why.startswith("at 4,096 connections (its maxconn) haproxy needs about 412 MiB, about 100 KiB per "
                          "connection") and why.endswith("; its cgroup allows 256 MiB")
    fits = int((256 * MIB / LIMIT_MARGIN - BASE) / PER)
    assert change == (f"lower maxconn to {fits:,} (what its cgroup holds with the margin) or raise MemoryMax= of its "
                      "unit (memory.max, memory.limit_in_bytes) to 495M (and tune.bufsize)")
    assert memory_advice("haproxy", fit, 100, "its maxconn", 256 * MIB)[2] == ""  # fits: nothing to change
    assert memory_advice("server", fit, 4096, "the FD limit recommended for it", 256 * MIB)[2].startswith(
        f"hold at most {fits:,} connections")
