"""The figures of a rehearsal, from what its bursts measured: the most connections held, where
the target first failed and how, the descriptors it used per connection (the slope), what the
shape needs (``analysis.needs.rehearsed_need``) and the doctor's recommendation."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fdtrace.analysis.needs import rehearsed_need
from fdtrace.display import shown
from fdtrace.doctor.checks import Check
from fdtrace.doctor.report import as_table
from fdtrace.fits import theil_sen
from fdtrace.policy import FD_EXHAUSTION_ERRNOS
from fdtrace.rehearsal.shape import Shape
from fdtrace.rehearsal.target import Target
from fdtrace.rehearsal.watch import TargetFailure


@dataclass
class Burst:
    """One burst of one step: opened at once, answered or failed, held, closed.

    Attributes:
        step: the ramp step (from 1).
        burst: the burst of that step (from 1).
        level: connections opened at once.
        answered: connections the target answered (held at once during the hold).
        failures: the connections that failed, by how (refused, reset, unanswered, closed
            during the hold, ...).
        fds_before: the target's open descriptors before the burst (None: not traced).
        fds_held: its open descriptors while the answered connections were held.
        threads: its threads while they were held.
        target_failures: the target's failures the tracer saw during the burst, by label
            (``socket EMFILE``, ``oom_kill``, ``exited (SIGKILL)``).
        first_target_failure: the first of them.
        listen_overflows, listen_drops: TcpExt ListenOverflows and ListenDrops during the burst
            (the whole host's: another listener's count too).
        settled: the target's descriptors came back to ``fds_before`` after the close.
    """

    step: int
    burst: int
    level: int
    answered: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    fds_before: int | None = None
    fds_held: int | None = None
    threads: int | None = None
    target_failures: dict[str, int] = field(default_factory=dict)
    first_target_failure: TargetFailure | None = None
    listen_overflows: int | None = None
    listen_drops: int | None = None
    settled: bool = True

    @property
    def failed(self) -> bool:
        """Whether a connection or the target failed."""
        return bool(self.failures) or bool(self.target_failures)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        first = self.first_target_failure
        return {"step": self.step, "burst": self.burst, "connections": self.level, "answered": self.answered,
                "failures": self.failures, "target_fds_before": self.fds_before, "target_fds_held": self.fds_held,
                "target_threads": self.threads, "target_failures": self.target_failures,
                "first_target_failure": None if first is None else first.label,
                "listen_overflows": self.listen_overflows, "listen_drops": self.listen_drops, "settled": self.settled}


def fds_per_connection(bursts: list[Burst]) -> float | None:
    """The descriptors the target took per connection held: the slope (``fits.theil_sen``) of its
    open descriptors (before each burst, and while its answered connections were held) against
    the connections held, rounded to hundredths; None when no connection was answered."""
    points = []
    for burst in bursts:
        if burst.fds_before is not None and burst.fds_held is not None and burst.answered:
            points += [(0, burst.fds_before), (burst.answered, burst.fds_held)]
    line = theil_sen(points)
    return None if line is None else round(line.slope, 2)


def held_and_failed_at(bursts: list[Burst]) -> tuple[int, int | None, Burst | None]:
    """(held, failed_at, the burst that failed): the most connections answered at once with no
    failure among them; the concurrency at which the target first failed: one more than it had
    answered when connections of that burst failed, or the burst's whole level when only the
    tracer saw the failure (every connection was answered)."""
    held = 0
    for burst in bursts:
        held = max(held, burst.answered)
        if burst.failed:
            return held, burst.answered + 1 if burst.failures else burst.level, burst
    return held, None, None


def describe_failure(burst: Burst, errors: dict[tuple[str, str], int], soft: int | None) -> dict[str, Any]:
    """How the target failed in ``burst``: its first failure (the errno and the call), its
    exhaustion calls by syscall (the exact counters), what the connections met, and one
    sentence."""
    first = burst.first_target_failure
    calls = {f"{syscall} {name}": count for (syscall, name), count in sorted(errors.items())
             if name in FD_EXHAUSTION_ERRNOS}
    clients = dict(sorted(burst.failures.items(), key=lambda item: -item[1]))
    parts = []
    if first is not None and first.errno:
        counted = ", ".join(f"{label.split()[0]} ({count})" for label, count in calls.items()
                            if label.endswith(first.errno)) or first.syscall
        table = "the system's file table" if first.errno == "ENFILE" else (
            f"its descriptor table ({soft} soft limit)" if soft is not None else "its descriptor table")
        parts.append(f"{first.errno} on {counted}: {table} was full")
    elif first is not None:
        parts.append("the target was OOM-killed" if first.kind == "oom_kill" else f"the target {first.label}")
    if clients:
        parts.append("; ".join(f"{count} connections {reason}" for reason, count in clients.items()))
    return {"errno": first.errno if first is not None and first.errno else None,
            "syscall": first.syscall if first is not None and first.syscall else None,
            "kind": first.kind if first is not None else None,
            "calls": calls, "connections": clients, "text": "; ".join(parts) or "connections failed"}


#: The doctor's checks of a program's own connection limit, which judge a failure without EMFILE.
CONNECTION_LIMITS = ("nginx worker_connections vs the rehearsed shape", "haproxy maxconn vs the rehearsed shape")


@dataclass
class RehearsalResult:
    """A rehearsal's outcome and its figures.

    Attributes:
        target: where the load went.
        shape: the load.
        pid, comm: the process traced (None for a target elsewhere that names none).
        bursts: each burst, in order (the last one failed, or the shape held).
        fd_soft_limit, fd_hard_limit: the target's descriptor limits before the load.
        first_fds: the target's open descriptors when the rehearsal began.
        errors: the exact counters' failed calls of the target, by (syscall, errno).
        peak_fds, peak_threads: the most the tracer's samples saw.
        stopped: why the rehearsal stopped before the shape was played (None: it was).
        project_ranks: ``--project-ranks``.
        advice: the doctor's checks for the need (filled by ``advise``).
        notes: what the reader should know (losses, a target that kept descriptors).
    """

    target: Target
    shape: Shape
    pid: int | None
    comm: str | None
    bursts: list[Burst]
    fd_soft_limit: int | None = None
    fd_hard_limit: int | None = None
    first_fds: int | None = None
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    peak_fds: int | None = None
    peak_threads: int | None = None
    stopped: str | None = None
    project_ranks: int | None = None
    advice: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def idle_fds(self) -> int | None:
        """The target's open descriptors before the first burst."""
        return self.bursts[0].fds_before if self.bursts else self.first_fds

    @property
    def held(self) -> int:
        """The most connections answered at once with no failure among them."""
        return held_and_failed_at(self.bursts)[0]

    @property
    def failed_at(self) -> int | None:
        """The concurrency at which the target first failed (None: it did not)."""
        return held_and_failed_at(self.bursts)[1]

    @property
    def status(self) -> str:
        """``failed`` (exit status 2), ``held`` (0), or ``incomplete`` (1: stopped first)."""
        if held_and_failed_at(self.bursts)[2] is not None:
            return "failed"
        return "incomplete" if self.stopped else "held"

    @property
    def exit_code(self) -> int:
        """0 when the shape held, 2 when the target failed, 1 when it stopped before either."""
        return {"held": 0, "failed": 2, "incomplete": 1}[self.status]

    @property
    def failure(self) -> dict[str, Any] | None:
        """How the target first failed (``describe_failure``), None when it did not."""
        burst = held_and_failed_at(self.bursts)[2]
        if burst is None:
            return None
        found = describe_failure(burst, self.errors, self.fd_soft_limit)
        found["judged_by"] = self.judged_by
        if self.judged_by:
            found["text"] += f"; {self.judged_by}"
        return found

    @property
    def judged_by(self) -> str | None:
        """A failure without EMFILE or ENFILE judged by the program's own connection limit (its
        check of the doctor's that failed: nginx's worker_connections, haproxy's maxconn)."""
        burst = held_and_failed_at(self.bursts)[2]
        if burst is None or (burst.first_target_failure is not None and burst.first_target_failure.errno):
            return None
        for check in self.advice:
            if check.status.name == "FAIL" and check.name in CONNECTION_LIMITS:
                return f"no descriptor ran out: its own connection limit did ({check.current})"
        return None

    @property
    def fds_per_connection(self) -> float | None:
        """Descriptors the target took per connection (``fds_per_connection``)."""
        return fds_per_connection(self.bursts)

    def needed(self, connections: int) -> tuple[int, str] | None:
        """(descriptors, why) the target needs to hold ``connections`` at once; None when
        the rehearsal could not measure it."""
        slope, idle = self.fds_per_connection, self.idle_fds
        if slope is None or idle is None:
            return None
        return rehearsed_need(idle, slope, connections)

    @property
    def needed_fds(self) -> int | None:
        """What the target needs for the shape (ranks x connections per rank)."""
        found = self.needed(self.shape.total)
        return None if found is None else found[0]

    @property
    def projected_connections(self) -> int | None:
        """The connections of ``--project-ranks`` ranks of the same shape."""
        return None if self.project_ranks is None else self.project_ranks * self.shape.per_rank

    def advise(self) -> None:
        """Fill ``advice`` with the doctor's checks for the largest need asked: the projected
        ranks' when given, else the shape's."""
        from fdtrace.rehearsal.advice import fd_advice

        connections = self.projected_connections or self.shape.total
        found = self.needed(connections)
        if self.pid is None or found is None:
            return
        need, basis = found
        failure = self.failure
        out_of_fds = failure is not None and failure["errno"] in FD_EXHAUSTION_ERRNOS
        self.advice = fd_advice(self.pid, need, basis, out_of_fds, connections)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        projected = None
        if self.projected_connections is not None:
            found = self.needed(self.projected_connections)
            projected = {"ranks": self.project_ranks, "connections": self.projected_connections,
                         "needed_fds": None if found is None else found[0]}
        return {
            "target": self.target.text, "address": self.target.address, "port": self.target.port,
            "local": self.target.local, "pid": self.pid, "comm": self.comm, "shape": self.shape.as_dict(),
            "status": self.status, "stopped": self.stopped, "held": self.held, "failed_at": self.failed_at,
            "failure": self.failure, "idle_fds": self.idle_fds, "fd_soft_limit": self.fd_soft_limit,
            "fd_hard_limit": self.fd_hard_limit, "fds_per_connection": self.fds_per_connection,
            "needed_fds": self.needed_fds, "projected": projected, "peak_fds": self.peak_fds,
            "peak_threads": self.peak_threads,
            "failed_calls": {f"{syscall} {name}": n for (syscall, name), n in sorted(self.errors.items())},
            "bursts": [b.as_dict() for b in self.bursts], "advice": [c.as_dict() for c in self.advice],
            "notes": self.notes,
        }

    def as_json(self) -> str:
        """``as_dict`` as JSON."""
        return json.dumps(self.as_dict(), indent=1)

    def as_text(self) -> str:
        """For a terminal: the target, a line per burst, the verdict, the figures, the changes."""
        traced = (f"pid {self.pid} ({shown(self.comm)}), FD limit {self.fd_soft_limit or 'unlimited'} soft / "
                  f"{self.fd_hard_limit or 'unlimited'} hard, {self.idle_fds} open idle"
                  if self.pid is not None else "not traced (not on this host)")
        shape = self.shape
        lines = [f"rehearsal of {shown(self.target.text)} -> {traced}",
                 f"shape: {shape.ranks} ranks x {shape.per_rank} connections = {shape.total} at once, "
                 f"{shape.bursts} burst{'s' * (shape.bursts > 1)} per step, {shape.ramp} step"
                 f"{'s' * (shape.ramp > 1)}, held {shape.hold_s:g} s", ""]
        header = ("STEP", "BURST", "CONNECTIONS", "ANSWERED", "FAILED", "TARGET FDS", "TARGET FAILURES")
        rows = [header]
        for burst in self.bursts:
            fds = "" if burst.fds_held is None else f"{burst.fds_before} -> {burst.fds_held}"
            target = ", ".join(f"{label} {count}" for label, count in burst.target_failures.items())
            rows.append((str(burst.step), str(burst.burst), str(burst.level), str(burst.answered),
                         str(sum(burst.failures.values())), fds, target))
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                  for row in rows]
        lines.append("")
        failure = self.failure
        if failure is not None:
            lines.append(f"FAILED at {self.failed_at} connections (held {self.held}): {failure['text']}")
        elif self.stopped:
            lines.append(f"INCOMPLETE: {self.stopped} (held {self.held} with no failure)")
        else:
            lines.append(f"HELD: {self.held} connections at once with no failure")
        if self.fds_per_connection is not None:
            lines.append(f"descriptors per connection: {self.fds_per_connection:.2f} (the slope), "
                         f"{self.idle_fds} held idle")
        for connections, label in ((shape.total, f"{shape.ranks} ranks"),
                                   (self.projected_connections, f"{self.project_ranks} ranks")):
            found = self.needed(connections) if connections is not None else None
            if found is not None:
                lines.append(f"needed for {connections} connections ({label}): {found[0]} descriptors")
        lines += [f"note: {shown(text)}" for text in self.notes]
        if self.advice:  # the doctor's table, without its overall line: the verdict is the one above
            lines += ["", "What to change (as fdtrace doctor says it):",
                      as_table(self.advice, overall=False)]
        return "\n".join(lines)
