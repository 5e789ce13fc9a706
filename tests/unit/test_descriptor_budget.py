"""The descriptor budget checked before the probes attach: its parts, and what sinks reserve."""

from __future__ import annotations

import gc
import re
import resource

import pytest

from fdtrace.errors import FdtraceError
from fdtrace.kernel.features import KernelFeatures
from fdtrace.kernel.loader import TraceOptions
from fdtrace.kernel.session import (
    DETACH_HELPER_DESCRIPTORS,
    GO_WATCH_DESCRIPTORS,
    OWN_DESCRIPTORS,
    STACKS_DESCRIPTORS,
    check_nofile,
    descriptor_budget,
    planned_probes,
    release_descriptors,
    reserve_descriptors,
)

FEATURES = KernelFeatures(syscall_exits=["socket", "accept4", "connect", "close", "openat"],
                          syscall_enters=["close", "connect", "exit_group"],
                          lifecycle=["task:task_newtask", "sock:inet_sock_set_state"], accept_peer=True,
                          descriptor_enters=["pipe2", "socketpair"], close_range=True)


class Owner:
    """A sink or source that reserves descriptors."""


def test_the_probes_counted_are_those_the_options_attach() -> None:
    assert len(planned_probes(FEATURES, TraceOptions())) == 3 + 1 + 5 + 1  # entries, accept4's, exits, newtask
    errors_only = planned_probes(FEATURES, TraceOptions(errors_only=True))
    assert "syscalls:sys_enter_close" not in errors_only and "syscalls:sys_enter_accept4" not in errors_only
    stacks = planned_probes(FEATURES, TraceOptions(stacks=True, connections=True))
    assert {"syscalls:sys_enter_pipe2", "syscalls:sys_enter_socketpair", "syscalls:sys_exit_close_range",
            "sock:inet_sock_set_state"} <= set(stacks)
    assert len(stacks) == 10 + 3 + 1


def test_the_parts_of_the_budget() -> None:
    owner = Owner()
    reserve_descriptors(owner, "recording to /tmp/x", 16)
    reserve_descriptors(owner, "metrics on :9", 20)
    try:
        budget = descriptor_budget(FEATURES, TraceOptions(stacks=True), open_now=5)
        assert budget.parts == (("open already", 5), ("13 probes", 26), ("its own", OWN_DESCRIPTORS),
                                ("--stacks", STACKS_DESCRIPTORS), ("the detach helper", DETACH_HELPER_DESCRIPTORS),
                                ("Go programs watched", GO_WATCH_DESCRIPTORS), ("metrics on :9", 20),
                                ("recording to /tmp/x", 16))
        assert budget.needed == (5 + 26 + OWN_DESCRIPTORS + STACKS_DESCRIPTORS + DETACH_HELPER_DESCRIPTORS
                                 + GO_WATCH_DESCRIPTORS + 36)
    finally:
        release_descriptors(owner)
    assert descriptor_budget(FEATURES, TraceOptions(), open_now=5).needed == (5 + 20 + OWN_DESCRIPTORS + 2
                                                                              + GO_WATCH_DESCRIPTORS)


def test_a_reservation_ends_with_its_owner() -> None:
    owner = Owner()
    reserve_descriptors(owner, "gone soon", 1000)
    assert descriptor_budget(FEATURES, TraceOptions(), open_now=0).needed >= 1000
    del owner
    gc.collect()
    assert descriptor_budget(FEATURES, TraceOptions(), open_now=0).needed < 1000


def test_a_hard_limit_below_the_budget_is_refused_in_one_line() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit to fall short of")
    owner = Owner()
    reserve_descriptors(owner, "a sink", hard)
    try:
        with pytest.raises(FdtraceError) as refused:
            check_nofile(FEATURES, TraceOptions())
    finally:
        release_descriptors(owner)
    text = str(refused.value)
    # the descriptors open already, as the refusal counted them (another thread may open one meanwhile)
    open_then = int(re.search(r"open already: (\d+)", text).group(1))  # type: ignore[union-attr]
    needed = descriptor_budget(FEATURES, TraceOptions(), open_now=open_then).needed + hard
    assert "\n" not in text and text.startswith(f"the hard RLIMIT_NOFILE is {hard}: fdtrace needs {needed} file "
                                                "descriptors (open already: ")
    assert f"a sink: {hard}); raise it (prlimit --nofile={needed}:{needed}, ulimit -Hn" in text
    assert check_nofile(FEATURES, TraceOptions()).needed < hard
