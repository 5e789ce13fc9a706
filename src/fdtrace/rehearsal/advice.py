"""What to change, said by the doctor: its checks for the need a rehearsal measured (where the
target's limit is set, the limit to set and the command; for HAProxy, the maxconn for the shape
and the FD limit HAProxy demands for it), through the doctor's public ``need_checks``, so that
``rehearse`` and ``doctor`` never disagree on a number or a place."""

from __future__ import annotations

from fdtrace.doctor.checks import Check, Doctor


def fd_advice(pid: int, need: int, basis: str, failed: bool, connections: int,
              doctor: Doctor | None = None) -> list[Check]:
    """The doctor's checks of ``pid`` for a need of ``need`` descriptors (``basis`` says where it
    comes from) and ``connections`` at once (``Doctor.need_checks``). Empty when the process is
    gone."""
    return (doctor or Doctor()).need_checks(pid, need, basis, failed, connections, measured="the rehearsal needs")
