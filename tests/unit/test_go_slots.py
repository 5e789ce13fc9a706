"""The Go uprobe slots by priority (issue 37 G): root's and the system services' programs take
any free slot, another user's only outside those kept for them and up to a cap per user."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from fdtrace.kernel.loader import GO_SYSTEM_SLOTS, GO_USER_SLOTS, MAX_GO_BINARIES, BpfTracer


def slot_left(slots: Counter[int], uid: int) -> bool:
    return BpfTracer._slot_left(SimpleNamespace(_go_slots=slots), uid)  # type: ignore[arg-type]


def test_one_user_takes_its_cap_and_root_still_gets_a_slot() -> None:
    slots: Counter[int] = Counter()
    taken = 0
    for _ in range(300):  # the trial's 300 fake Go programs of one user
        if slot_left(slots, 1001):
            slots[1001] += 1
            taken += 1
    assert taken == GO_USER_SLOTS
    assert slot_left(slots, 0) and slot_left(slots, 999) and slot_left(slots, 1002)


def test_users_together_leave_the_kept_slots_to_root_and_services() -> None:
    users = (MAX_GO_BINARIES - GO_SYSTEM_SLOTS) // GO_USER_SLOTS
    slots: Counter[int] = Counter(dict.fromkeys(range(1000, 1000 + users), GO_USER_SLOTS))
    assert not slot_left(slots, 5000) and slot_left(slots, 0)
    slots[0] = GO_SYSTEM_SLOTS
    assert not slot_left(slots, 0)  # every slot taken: counted as refused, even for root
