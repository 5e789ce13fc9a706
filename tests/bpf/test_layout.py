"""The C structs as compiled match the numpy layout used to decode them."""

from __future__ import annotations

import ctypes

import pytest

from fdtrace.schema import COUNTERS, RAW_EVENT_DTYPE
from tests.conftest import LiveTracer

pytestmark = pytest.mark.bpf


def test_event_struct_matches_decoder_dtype(live_tracer: LiveTracer) -> None:
    leaf = live_tracer.source.tracer._programs["event_layout"].Leaf
    assert ctypes.sizeof(leaf) == RAW_EVENT_DTYPE.itemsize
    c_fields = [name for name, *_ in leaf._fields_ if not name.startswith("__pad")]
    assert [n.rstrip("_") for n in c_fields] == list(RAW_EVENT_DTYPE.names)
    for c_name, np_name in zip(c_fields, RAW_EVENT_DTYPE.names, strict=True):
        assert getattr(leaf, c_name).offset == RAW_EVENT_DTYPE.fields[np_name][1], np_name


def test_counter_struct_has_one_slot_per_counter(live_tracer: LiveTracer) -> None:
    leaf = live_tracer.source.tracer._programs["counters"].Leaf
    assert len(leaf().n) == len(COUNTERS)
