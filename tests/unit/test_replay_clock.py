"""Replay of a two-host recording whose hosts' wall clocks disagree by a known offset: the
hosts' events come out on the reference host's clock, in the order they truly happened, the
same timeline that ``open_dataset`` gives the analyses. The recording is written by fdtrace's
own recording writer (bench/fleet_data.py, the benchmark's generator at a small size), with
the TCP connections between the two hosts that bound the offset."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from fdtrace.analysis import load
from fdtrace.sources.replay import ReplaySource

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from fleet_data import HostTruth, generate_fleet  # noqa: E402

#: host-01's wall clock runs this far ahead of host-00's (and of true time).
AHEAD_NS = 1_500_000_000
#: The generator's handshakes take 30 µs each way: the offset is known within this.
UNCERTAINTY_NS = 30_000


class FakeClock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[HostTruth]]:
    root = tmp_path_factory.mktemp("two_hosts")
    return root, generate_fleet(root, hosts=2, events_per_host=4_000, seconds=20, clock_errors_ns={1: AHEAD_NS})


def replayed(root: Path) -> pa.Table:
    """Every event a replay hands out, polled along at 10x speed to the end."""
    clock = FakeClock()
    source = ReplaySource(root, speed=10.0, clock=clock)
    seen = []
    while not source.player.finished:
        clock.ns += 50_000_000
        seen.append(source.poll().events)
    return pa.concat_tables(seen)


def test_replay_puts_both_hosts_on_one_clock(two_hosts: tuple[Path, list[HostTruth]]) -> None:
    root, truths = two_hosts
    events = replayed(root)
    assert events.num_rows == sum(t.events for t in truths)
    hosts = np.asarray(events["host"].cast(pa.string()).to_pylist())
    times = events["time"].cast(pa.int64()).to_numpy()
    assert (np.diff(times) >= 0).all()  # handed out in time order, both hosts together

    # host-01's times moved back by the offset its connections with host-00 bound
    offsets = load(root).clock_offsets.set_index("host")
    estimate = int(offsets.loc["host-01", "offset_ns"])
    assert abs(estimate - AHEAD_NS) <= UNCERTAINTY_NS
    for truth, shift in zip(truths, (0, estimate), strict=True):
        mine = times[hosts == truth.host]
        assert mine.size == truth.events
        failures = events.filter(pa.compute.equal(events["host"].cast(pa.string()), truth.host))
        errno = np.asarray(failures["errno"].cast(pa.string()).fill_null("").to_pylist())
        kinds = np.asarray(failures["kind"].cast(pa.string()).to_pylist())
        first = mine[(errno == "EMFILE") | (errno == "ENFILE") | (kinds == "oom_kill")].min()
        assert first == truth.first_failure_ns - shift

    # the same timeline as the analyses': host by host and time by time, in order
    loaded = load(root).events
    assert hosts.tolist() == loaded["host"].astype(str).tolist()
    assert times.tolist() == loaded["time"].astype("int64").tolist()


def test_uncorrected_the_hosts_would_be_out_of_order(two_hosts: tuple[Path, list[HostTruth]]) -> None:
    """The check above can fail: on each host's own clock, host-01's storm comes 1.5 s after
    host-00's, and the order of the two hosts' events differs from the corrected one."""
    root, truths = two_hosts
    plain = load(root, clock_correction=False).events
    corrected = replayed(root)
    assert plain["host"].astype(str).tolist() != corrected["host"].cast(pa.string()).to_pylist()
    first = {t.host: t.first_failure_ns for t in truths}
    assert first["host-01"] - first["host-00"] > AHEAD_NS - 1_000_000_000
