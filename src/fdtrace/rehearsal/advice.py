"""What to change, said by the doctor: the RLIMIT_NOFILE recommendation for the need a rehearsal
measured, where the target's limit is set and how to change it there, and (for HAProxy) its
configuration's checks, all from ``fdtrace.doctor`` so that ``rehearse`` and ``doctor`` never
disagree on a number or a place."""

from __future__ import annotations

from fdtrace.doctor.checks import Check, Doctor, Status, by_usage
from fdtrace.integrations.haproxy import HaproxyConfig
from fdtrace.policy import with_margin


def fd_advice(pid: int, need: int, basis: str, failed: bool, connections: int,
              doctor: Doctor | None = None) -> list[Check]:
    """The doctor's checks of ``pid`` for a need of ``need`` descriptors (``basis`` says where it
    comes from): where its limit is set, the soft limit to set (the need with the margin) and
    the command to set it, fs.nr_open when the limit would pass it; for HAProxy, its maxconn
    against the ``connections`` the shape holds at once (with the margin), then the doctor's
    checks of its configuration. ``failed``: the target failed under the load, so the limit
    check fails whatever its usage. Empty when the process is gone.

    The doctor has no public entry for a need computed elsewhere; its own steps are called
    here, unchanged (``Doctor.process_checks`` runs the same ones for the need it computes)."""
    doctor = doctor or Doctor()
    sample = doctor.sampler.sample(pid)
    if sample is None:
        return []
    scope = f"pid {pid} ({sample.comm})"
    soft, hard = sample.fd_soft_limit, sample.fd_hard_limit
    configs = doctor._haproxy_configs(pid, scope) if sample.comm.startswith("haproxy") else []
    where, how = doctor._limit_source(pid, soft, configs)
    checks = [Check(scope, "RLIMIT_NOFILE source", Status.OK, where)]
    if soft is None:
        checks.append(Check(scope, "RLIMIT_NOFILE soft", Status.OK, f"unlimited; the rehearsal needs {need}"))
    else:
        status = Status.FAIL if failed or need > soft else by_usage(need, soft)
        current = f"{soft} ({sample.open_fds} open now; the rehearsal needs {need}, {need / soft:.0%})"
        checks += doctor._raise_fd_limit(scope, pid, soft, hard, need, basis, status, current, how)
    recommended = next((c.recommended for c in checks if c.name == "RLIMIT_NOFILE soft" and c.recommended), "")
    for config, problems in configs:
        checks += problems
        if config is not None:
            checks += _maxconn_checks(scope, config, connections)
            checks += doctor._haproxy_checks(pid, scope, soft, config, recommended)
    return checks


def _maxconn_checks(scope: str, config: HaproxyConfig, connections: int) -> list[Check]:
    """HAProxy's maxconn against the connections the shape holds at once: the incident's
    "maxconn from the measured peak connections plus a margin"."""
    if config.maxconn is None:
        return []
    wanted = with_margin(connections)
    status = Status.FAIL if config.maxconn < connections else Status.WARN if config.maxconn < wanted else Status.OK
    return [Check(scope, "haproxy maxconn vs the rehearsed shape", status,
                  f"maxconn {config.maxconn} for {connections} connections at once",
                  f"maxconn >= {wanted}" if status else "",
                  f"set maxconn {wanted} in the global section of {config.path}, and the FD limit with it"
                  if status else "")]
