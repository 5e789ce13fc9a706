"""``info`` reads the system and clock tables through the engine (their extremes and each host's
last clock row come back, not the rows): what it says of them is what the rows hold."""

from __future__ import annotations

import pandas as pd

from fdtrace.analysis.engines.dataset import Recording
from fdtrace.analysis.summary import summary

START = pd.Timestamp("2026-11-30 04:00:00", tz="UTC")


def _recording(system: pd.DataFrame, clock: pd.DataFrame) -> Recording:
    meta = {host: {"kernel": "6.1", "fdtrace_version": "test", "complete": True} for host in ("a", "b")}
    return Recording(events=pd.DataFrame(), samples=pd.DataFrame(), system=system, losses=pd.DataFrame(),
                     counters=pd.DataFrame(), clock=clock, haproxy=pd.DataFrame(), phases=pd.DataFrame(), meta=meta)


def _system(overflows: list[int], drops: list[int]) -> pd.DataFrame:
    seconds = range(len(overflows))
    return pd.DataFrame({"ts_ns": [s * 10**9 for s in seconds],
                         "time": [START + pd.Timedelta(seconds=s) for s in seconds], "host": "a",
                         "file_nr": 1000, "file_max": 1 << 20, "somaxconn": 128,
                         "listen_overflows": overflows, "listen_drops": drops})


def test_a_listen_queue_that_overflowed_is_said_with_how_much_it_grew() -> None:
    clock = pd.DataFrame(columns=["host", "ts_ns", "synchronized", "max_error_us"])
    text = summary(_recording(_system([10, 12, 17], [4, 4, 4]), clock))
    assert ("net.core.somaxconn: TcpExt ListenOverflows grew by 7 during the recording; "
            "a listen queue overflowed: sysctl -w net.core.somaxconn=65535") in text
    assert "ListenDrops" not in text  # it did not grow
    assert "somaxconn" not in summary(_recording(_system([10, 10, 10], [4, 4, 4]), clock))


def test_each_host_s_last_word_on_its_clock_decides() -> None:
    # a: unsynchronized, then synchronized (nothing to say); b: the other way round.
    clock = pd.DataFrame({"host": ["a", "a", "b", "b"], "ts_ns": [1, 2, 2, 1],
                          "synchronized": [False, True, False, True],
                          "max_error_us": [9_000_000, 5, 16_000_000, 5]})
    text = summary(_recording(_system([1], [1]), clock))
    host_a, host_b = text.split("\nhost a: ")[1].split("\nhost b: ")
    assert "own clock" not in host_a
    assert ("  own clock: not synchronized (adjtimex), maximum error 16.000 s: its wall times are only as good "
            "as that") in host_b.splitlines()


def test_each_host_s_counters_and_limits_are_its_own() -> None:
    """A fleet's hosts count TcpExt since their own boots and have their own fs.file-max: one
    host's growth is not measured against another's count, nor its handles against another's
    limit."""
    from fdtrace.advice.fixes import file_max_change

    grew = _system([10, 12, 17], [4, 4, 4]).assign(file_nr=[80_000, 85_000, 90_000], file_max=100_000)
    steady = _system([1000, 1000, 1000], [900, 900, 900]).assign(host="b", file_nr=1000, file_max=50_000)
    clock = pd.DataFrame(columns=["host", "ts_ns", "synchronized", "max_error_us"])
    text = summary(_recording(pd.concat([grew, steady], ignore_index=True), clock))
    assert "TcpExt ListenOverflows grew by 7 on a during the recording" in text
    assert "ListenDrops" not in text
    change = file_max_change(90_000, 100_000)  # host a's: 90 % of its own table
    assert change is not None
    assert f"fs.file-max on a: {change.reason}; set it to at least {change.value:,}" in text
