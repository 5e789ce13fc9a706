"""The host's own view of its clock: adjtimex(2) read for real, chronyc's tracking line parsed."""

from __future__ import annotations

from fdtrace.kernel.clock import adjtimex_quality, parse_chrony_tracking


def test_adjtimex_reads_this_kernel() -> None:
    quality = adjtimex_quality()
    assert isinstance(quality.synchronized, bool)
    assert quality.est_error_us is not None and quality.max_error_us is not None
    assert 0 <= quality.est_error_us <= quality.max_error_us


def test_chrony_tracking_line() -> None:
    # chronyc -c tracking: ref id, address, stratum, ref time, system time (correction, + = slow), ...
    slow = "A9FEA97B,169.254.169.123,4,1764590000.123456789,0.000012345,-0.000001234,0.000023456,-1.234,0.001," \
           "0.050,0.000123,0.000456,64.2,Normal"
    assert parse_chrony_tracking(slow) == -12_345  # the clock is 12.345 µs behind
    assert parse_chrony_tracking(slow.replace(",0.000012345,", ",-0.5,")) == 500_000_000
    assert parse_chrony_tracking("506 Cannot talk to daemon") is None
    assert parse_chrony_tracking("a,b,c,d,e,f") is None
