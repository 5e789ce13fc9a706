"""The memory half of the needs model (fdtrace.advice.memory): the memory a connection costs,
fitted robustly from (sockets, bytes) samples, and what a number of connections needs against a
limit: one rule (memory_change) whose Change doctor, the report and the live view render."""

from __future__ import annotations

import random

from fdtrace.advice.memory import (
    MAX_FIT_POINTS,
    MemoryLevels,
    connections_to_hold,
    memory_change,
    memory_fit,
    memory_fit_levels,
    memory_levels,
)
from fdtrace.policy import LIMIT_MARGIN
from fdtrace.units import MIB

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
    # 2,000 socket counts in buckets of 32 (the smallest power of two that keeps 64 at most)
    assert fit is not None and fit.points == 63 and fit.per_connection == PER
    assert (fit.sockets_from, fit.sockets_to) == (0, 1999)


def test_what_connections_need_against_the_limit_and_what_to_change() -> None:
    fit = memory_fit([(n, BASE + PER * n) for n in range(0, 1400, 50)], "cgroup usage")
    assert fit is not None
    said = memory_change("haproxy", 256 * MIB, None, fit, 4096, "its maxconn")
    assert said.need == BASE + PER * 4096
    assert said.why.startswith("at 4,096 connections (its maxconn) haproxy needs about 412 MiB, about 100 KiB per "
                               "connection") and said.why.endswith("; its cgroup allows 256 MiB")
    fits = int((256 * MIB / LIMIT_MARGIN - BASE) / PER)
    assert said.change is not None and said.change.resource == "MemoryMax" and said.change.value == 495 * MIB
    assert said.change.command == (f"lower maxconn to {fits:,} (what its cgroup holds with the margin) or raise "
                                   "MemoryMax= of its unit (memory.max, memory.limit_in_bytes) to 495M "
                                   "(and tune.bufsize)")
    assert said.change.reason == said.why
    assert memory_change("haproxy", 256 * MIB, None, fit, 100, "its maxconn").change is None  # fits
    other = memory_change("server", 256 * MIB, None, fit, 4096, "the FD limit recommended for it").change
    assert other is not None and other.command.startswith(f"hold at most {fits:,} connections")


def test_the_place_is_the_unit_when_its_service_is_known() -> None:
    fit = memory_fit([(n, BASE + PER * n) for n in range(0, 1400, 50)], "cgroup usage")
    change = memory_change("haproxy", 256 * MIB, None, fit, 4096, "its maxconn", "haproxy.service").change
    assert change is not None
    assert change.where == "MemoryMax= in [Service] of haproxy.service (memory.max of its cgroup)"
    assert "raise MemoryMax= in [Service] of haproxy.service (memory.max of its cgroup) to 495M" in change.command
    # a session's scope is no unit file to edit: the generic places
    assert memory_change("x", 256 * MIB, 250 * MIB, unit="session-3.scope").change.where.startswith(  # type: ignore[union-attr]
        "MemoryMax= of its unit")


def test_a_cgroup_near_its_limit_without_a_fit_is_raised_above_the_limit_never_below() -> None:
    near = memory_change("app", 100 * MIB, 90 * MIB)
    assert near.need is None and near.change is not None
    assert near.change.value == 108 * MIB and near.change.command == (
        "raise MemoryMax= of its unit (memory.max, memory.limit_in_bytes) to 108M, or find what holds the memory")
    assert near.change.reason == "its cgroup peaked at 90 MiB of 100 MiB"
    # at 80 % its peak with the margin (96 MiB) is held by the limit in force: nothing lower is advised
    assert memory_change("app", 100 * MIB, 80 * MIB).change is None
    assert memory_change("app", 100 * MIB, 70 * MIB).change is None  # far from it
    assert memory_change("app", None, 90 * MIB).change is None  # no limit


def test_the_same_samples_give_the_same_fit_however_they_are_collected() -> None:
    """The live view sums every sample per socket count as it comes; the report sums them in SQL
    and hands over the levels in whatever order its engine returns: one fit, to the last bit."""
    rng = random.Random(7)
    samples = [(s, BASE + PER * s + rng.randrange(-4096, 4096)) for s in rng.choices(range(10, 900), k=3000)]
    as_they_come = memory_fit(samples, "cgroup usage")
    levels = memory_levels(samples)
    rng.shuffle(levels)
    summed_elsewhere = memory_fit_levels(levels, "cgroup usage")
    assert as_they_come is not None and as_they_come == summed_elsewhere
    assert as_they_come.points == 57  # some 860 socket counts in buckets of 16
    said = [memory_change("haproxy", 100 * MIB, None, fit, 1728, "its maxconn") for fit in (as_they_come,
                                                                                            summed_elsewhere)]
    assert said[0] == said[1]


def test_the_connections_to_hold() -> None:
    assert connections_to_hold(4096, 9000) == (4096, "its maxconn")
    assert connections_to_hold(None, 1728) == (1728, "the FD limit recommended for it")
    assert connections_to_hold(None, None) == (None, "")
    assert connections_to_hold(0, 0) == (None, "")


def test_buckets_stay_bounded_and_do_not_depend_on_the_order_samples_come_in() -> None:
    """The live view keeps at most MAX_FIT_POINTS buckets per process (issue 34: memory bounded by
    what is shown): buckets double in width as socket counts spread, and whichever order the
    samples come in, the same buckets hold the same integer sums."""
    rng = random.Random(11)
    samples = [(s, BASE + PER * s + rng.randrange(-4096, 4096)) for s in rng.choices(range(0, 5000), k=4000)]
    rising, shuffled = MemoryLevels(), MemoryLevels()
    for sockets, memory in sorted(samples):
        rising.add(sockets, memory)
    rng.shuffle(samples)
    for sockets, memory in samples:
        shuffled.add(sockets, memory)
    assert rising.width == shuffled.width == 128 and len(rising.buckets) <= MAX_FIT_POINTS
    assert rising.buckets == shuffled.buckets and (rising.low, rising.high) == (shuffled.low, shuffled.high)
    assert sum(count for _, _, count in rising.buckets.values()) == 4000
    one = MemoryLevels()
    one.add(7, 100)
    assert one.points() == [(7.0, 100.0)] and one.width == 1
