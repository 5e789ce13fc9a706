"""What a process needs of its RLIMIT_NOFILE: the one needs model of the live view, doctor (live
and --from), info, the report and rehearse."""

from __future__ import annotations

from typing import Any


def is_known(value: Any) -> bool:
    """Whether a figure is there (not None, NaN or pandas' NA; no pandas needed)."""
    return value is not None and type(value).__name__ != "NAType" and value == value


def need_of(soft: Any, peak: Any, emfile: int, worst_second: int, maxsock: Any,
            config_need: int | None = None, source: str | None = None,
            maxsock_from: str | None = None) -> tuple[int, str]:
    """(descriptors needed, why) for one process's RLIMIT_NOFILE: the one needs model of the live
    view, doctor (live and --from), info and the report.

    The need is the largest of its peak of open descriptors and what the program demands of
    itself (HAProxy's Maxsock from `show info`, else what its configuration's maxconn makes);
    only when it demands nothing known does a process that failed with EMFILE need its limit in
    force then (``soft``, set by ``source``) plus the opens it refused in its worst second (a
    retry counted again: a guess, which the program's own demand replaces)."""
    known = [(int(peak), f"peak {int(peak)} open")] if is_known(peak) else []
    demanded = []
    if is_known(maxsock):
        said = "its configuration's maxconn, nbthread and listeners" if maxsock_from == "configuration" else "show info"
        demanded.append((int(maxsock), f"HAProxy's Maxsock {int(maxsock)} ({said})"))
    if config_need is not None:
        demanded.append((config_need, f"its maxconn needs ~{config_need}"))
    known += demanded
    if emfile and is_known(soft) and not demanded:
        set_by = f" ({source})" if source else ""
        known.append((int(soft) + int(worst_second), f"its limit {int(soft)}{set_by} plus the {int(worst_second)} "
                                                     "opens refused with EMFILE in its worst second"))
    if not known:
        return 0, "nothing recorded"
    return max(known, key=lambda item: item[0])
