"""The checks, read from a procfs and a sysfs tree (tests pass fake ones)."""

from __future__ import annotations

import enum
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fdtrace.advice.change import AT_START, Change, LimitPlace, fd_limit_change, near_limit
from fdtrace.advice.fixes import (
    SOMAXCONN_LOW,
    file_max_change,
    go_exceeded_change,
    listen_fix,
    somaxconn_change,
    thread_change,
)
from fdtrace.advice.haproxy import HaproxyShape, maxconn_change
from fdtrace.advice.memory import memory_change, memory_max
from fdtrace.advice.needs import need_of
from fdtrace.advice.threads import GO_THREADS_ADVICE
from fdtrace.analysis.report.advice import go_said
from fdtrace.children import CHILD_CWD, child_environment, program
from fdtrace.integrations.haproxy import (
    HaproxyConfig,
    HeldBackError,
    config_fds,
    config_maxconn,
    config_shape,
    info_number,
    read_process_configs,
    show_info,
)
from fdtrace.integrations.nginx import NginxConfig, read_nginx_config
from fdtrace.policy import THREADS_COUNTED, USAGE_CRITICAL, USAGE_WARN, with_margin
from fdtrace.procfs.golang import GO_DEFAULT_MAX_THREADS
from fdtrace.procfs.reader import PROC_ROOT, ProcessAccessDeniedError, ProcessGoneError, ProcFS
from fdtrace.procfs.room import refusal
from fdtrace.procfs.sampler import ProcSampler
from fdtrace.procfs.thread_limits import threads_by_uid
from fdtrace.schema.records import ProcessSample
from fdtrace.units import kib

#: systemd's systemctl, by absolute path: never the first one on a PATH someone else may have set.
SYSTEMCTL = program("/usr/bin/systemctl", "/bin/systemctl")


class Status(enum.IntEnum):
    """Outcome of a check; the exit code of `fdtrace doctor` is the worst one."""

    OK = 0
    WARN = 1
    FAIL = 2


@dataclass
class RecordedProcess:
    """What a recording holds of one process: for a process that is gone, all that is known."""

    comm: str
    start_ns: int | None = None
    fd_soft_limit: int | None = None
    fd_hard_limit: int | None = None
    peak_fds: int | None = None
    emfile: int = 0  # EMFILE failures
    emfile_worst_second: int = 0
    maxsock: int | None = None  # HAProxy's show info
    threads: int | None = None  # at the sample nearest its thread limit
    thread_limit_kind: str | None = None
    thread_limit: int | None = None
    thread_count: int | None = None  # what that limit counts
    thread_growth: float = 0.0  # threads per second over the recording
    exit: str | None = None  # how it ended, when it ended in the recording
    gone: bool = False  # not running now (a running process of its pid is another one)
    go_thread_limit: int | None = None  # the N of the Go runtime's "program exceeds N-thread limit"
    limit_source: str | None = None  # who set the RLIMIT_NOFILE it failed at, when a change of it was traced
    memcg_limit: int | None = None  # its memory cgroup's limit at its last sample, bytes
    memcg_peak: int | None = None  # that cgroup's highest usage in the recording, bytes
    oom_killed: bool = False
    memory_need: int | None = None  # what its connections need (analysis.memory), bytes
    memory_basis: str = ""  # why, in words
    memory_change: Change | None = None  # what to change (advice.memory.memory_change), when it does not fit


@dataclass(frozen=True)
class Check:
    """One line of the doctor's table."""

    scope: str
    name: str
    status: Status
    current: str
    recommended: str = ""
    change: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        data = asdict(self)
        data["status"] = self.status.name
        return data


def changed(scope: str, name: str, status: Status, current: str, change: Change | None,
            recommended: str = ">= {value}") -> Check:
    """A check that renders the advice layer's ``change`` (its value in ``recommended``, its
    command) when the status is not OK and there is one; else the check alone."""
    if not status or change is None:
        return Check(scope, name, status, current)
    return Check(scope, name, status, current, recommended.format(value=change.value), change.command)


def by_usage(used: float, limit: float | None) -> Status:
    """OK below 80 % of the limit, WARN from 80 %, FAIL from 95 %."""
    if not limit:
        return Status.OK
    share = used / limit
    return Status.FAIL if share >= USAGE_CRITICAL else Status.WARN if share >= USAGE_WARN else Status.OK


def _unit_soft(shown: str | None) -> int | None:
    """LimitNOFILESoft= of systemctl show's text, as a number (None: not there, or infinity)."""
    for item in (shown or "").split():
        name, _, value = item.partition("=")
        if name == "LimitNOFILESoft":
            return int(value) if value.isdigit() else None
    return None


class Doctor:
    """Reads limits and usage and says what to change.

    Args:
        procfs: the /proc tree.
        peaks: the highest open-FD count seen per pid (from a recording), when known.
        systemctl: the systemctl binary, None where systemd is not there to ask.
    """

    def __init__(self, procfs: str | Path = PROC_ROOT, peaks: dict[int, int] | None = None,
                 systemctl: str | None = SYSTEMCTL, cgroupfs: str | Path = "/sys/fs/cgroup") -> None:
        self.procfs = ProcFS(procfs)
        self.cgroupfs = Path(cgroupfs)
        self.sampler = ProcSampler(procfs, cgroupfs=self.cgroupfs)
        self.peaks = peaks or {}
        self.thread_growth: dict[int, float] = {}  # threads per second seen in a recording
        self.recorded: dict[int, RecordedProcess] = {}  # by pid, from a recording (doctor --from)
        self.accept_failures: list[str] = []  # "comm [pid]" whose accept() failed with EMFILE in the recording
        self.systemctl = systemctl

    # Reading: a process that is gone or unreadable reads as empty.

    def _number(self, relative: str) -> int | None:
        return self.procfs.system_number(relative)

    def _status_field(self, pid: int, field: str) -> str | None:
        try:
            value = self.procfs.status(pid).get(field)
            return value.strip() if value is not None else None
        except (ProcessGoneError, ProcessAccessDeniedError):
            return None

    def _cmdline(self, pid: int) -> list[str]:
        try:
            return self.procfs.cmdline(pid)
        except (ProcessGoneError, ProcessAccessDeniedError):
            return []

    def _systemd_unit(self, pid: int) -> str | None:
        try:
            lines = self.procfs.cgroups(pid)
        except (ProcessGoneError, ProcessAccessDeniedError):
            return None
        for _, _, path in lines:
            for part in path.split("/"):
                if part.endswith(".service"):
                    return part
        return None

    def _unit_limit(self, unit: str) -> str | None:
        if not self.systemctl:
            return None
        try:
            result = subprocess.run([self.systemctl, "show", "-p", "LimitNOFILE", "-p", "LimitNOFILESoft", unit],
                                    capture_output=True, text=True, timeout=5, check=False,
                                    env=child_environment(), cwd=CHILD_CWD, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return " ".join(result.stdout.split()) if result.returncode == 0 and result.stdout.strip() else None

    # Process checks

    def process_checks(self, pid: int) -> list[Check]:
        """Every check for one process: from /proc when it runs, else from the recording
        (``recorded``); empty when neither knows it."""
        sample = self.sampler.sample(pid)
        recorded = self.recorded.get(pid)
        if recorded is not None and recorded.gone:
            return self._recorded_checks(pid, recorded)
        if sample is None:
            return []
        scope = f"pid {pid} ({sample.comm})"
        configs = self._haproxy_configs(pid, scope) if sample.comm.startswith("haproxy") else []
        config_need = max((need for c, _ in configs if c is not None
                           for need in [config_fds(c, self.procfs, pid)] if need is not None), default=None)
        fd_checks = self._fd_checks(pid, scope, sample.open_fds, sample.fd_soft_limit, sample.fd_hard_limit,
                                    config_need, configs)
        recommended = next((c.recommended for c in fd_checks if c.name == "RLIMIT_NOFILE soft" and c.recommended),
                           "")
        checks = [*fd_checks, *self._thread_checks(pid, scope, sample),
                  *self._memory_checks(scope, sample, self.recorded.get(pid))]
        for config, problems in configs:
            checks += problems
            if config is not None:
                checks += self._haproxy_checks(pid, scope, sample.fd_soft_limit, config, recommended)
        return checks

    def need_checks(self, pid: int, need: int, basis: str, failed: bool, connections: int | None = None,
                    measured: str = "needs") -> list[Check]:
        """The checks of a running process for a need computed elsewhere (``rehearse``'s): where
        its limit is set, the soft limit to set (the need with the margin, never below the limit
        in force) and the command, fs.nr_open when the limit would pass it; for HAProxy, the
        maxconn for ``connections`` at once (with the margin) and the FD limit HAProxy demands
        for that maxconn (its Maxsock), so the pair starts under ``strict-limits``, then its
        configuration's checks. ``failed``: the process failed under the load, so the limit check
        fails whatever its usage. Empty when the process is gone."""
        sample = self.sampler.sample(pid)
        if sample is None:
            return []
        scope = f"pid {pid} ({sample.comm})"
        soft, hard = sample.fd_soft_limit, sample.fd_hard_limit
        configs = self._haproxy_configs(pid, scope) if sample.comm.startswith("haproxy") else []
        nginx = read_nginx_config(self.procfs, pid) if sample.comm == "nginx" else None
        pairs, asked = [], need
        for config, _ in configs:
            pair = haproxy_pair(config, self.procfs, pid, connections) if config is not None else None
            if pair is not None:
                pairs.append((config, *pair))
                if pair[1] > need:
                    need, basis = pair[1], f"{pair[2]}; {measured} {need_text(need, basis)}"
        where, place = self.limit_place(pid, soft, configs)
        if isinstance(nginx, NginxConfig):  # its workers' limit is nginx's own to set, however it started
            place = LimitPlace("nginx", nginx.path)
            if nginx.worker_rlimit_nofile is not None and nginx.worker_rlimit_nofile == soft:
                where = f"worker_rlimit_nofile {soft} in {nginx.path}"
        checks = [Check(scope, "RLIMIT_NOFILE source", Status.OK, where)]
        if soft is None:
            checks.append(Check(scope, "RLIMIT_NOFILE soft", Status.OK, f"unlimited; {measured} {need}"))
        else:
            status = Status.FAIL if failed or need > soft else by_usage(need, soft)
            demands = f", HAProxy demands {need}" if need != asked else ""
            current = f"{soft} ({sample.open_fds} open now; {measured} {asked}{demands}, {need / soft:.0%})"
            checks += self._raise_fd_limit(scope, pid, soft, hard, need, basis, status, current, place)
        recommended = next((c.recommended for c in checks if c.name == "RLIMIT_NOFILE soft" and c.recommended), "")
        for config, problems in configs:
            checks += problems
            if config is None:
                continue
            for paired, maxconn, demanded, _ in pairs:
                if paired is config and connections is not None:
                    checks += _maxconn_checks(scope, config, connections, maxconn, recommended, demanded, soft)
            checks += self._haproxy_checks(pid, scope, soft, config, recommended)
        if nginx is not None:
            checks += _nginx_checks(scope, nginx, connections)
        return checks

    def _haproxy_configs(self, pid: int, scope: str) -> list[tuple[HaproxyConfig | None, list[Check]]]:
        """Each configuration file the process was started with, read only as the process could
        read it (``read_process_configs``), and what could not be read of it and why."""
        found: list[tuple[HaproxyConfig | None, list[Check]]] = []
        for read in read_process_configs(self.procfs, pid, self._cmdline(pid)):
            if read.config is None:
                found.append((None, [Check(scope, "haproxy config", Status.WARN,
                                           f"{read.path}: not read: {read.not_read}")]))
                continue
            problems = [Check(scope, "haproxy config", Status.WARN, problem) for problem in read.config.problems]
            found.append((read.config, problems))
        return found

    def limit_place(self, pid: int, soft: int | None,
                    configs: list[tuple[HaproxyConfig | None, list[Check]]] | None = None,
                    ) -> tuple[str, LimitPlace]:
        """(where the soft limit in force comes from, in words; the place to change it): the
        systemd unit when its LimitNOFILE gave it, HAProxy's own ulimit-n, else where the process
        is started (inherited from its parent, or set by itself or someone's prlimit)."""
        unit = self._systemd_unit(pid)
        current = self._unit_limit(unit) if unit else None
        if unit:
            unit_soft = _unit_soft(current)
            if current is None or unit_soft is None or unit_soft == soft:
                return f"systemd unit {unit}" + (f" ({current})" if current else ""), LimitPlace("unit", unit)
        for config, _ in configs or []:
            if config is not None and config.ulimit_n is not None and config.ulimit_n == soft:
                return (f"ulimit-n {soft} in {config.path} (HAProxy sets its own limit at start; one set before it "
                        "started, by prlimit or its unit, looks the same: fdtrace doctor --from a recording of its "
                        "start names which)"), LimitPlace("haproxy", str(config.path))
        ppid = self._status_field(pid, "PPid")
        parent = self.sampler.sample(int(ppid)) if ppid and ppid.isdigit() and ppid != "0" else None
        if parent is not None and parent.fd_soft_limit == soft:
            return f"inherited from its parent pid {ppid} ({parent.comm}), whose soft limit is the same", AT_START
        unit_text = f"; its unit {unit} says {current}" if unit and current else ""
        parent_text = (f"; its parent pid {ppid} ({parent.comm}) has {parent.fd_soft_limit or 'unlimited'}"
                       if parent is not None else "")
        return (f"set for this process: by its own setrlimit (or its start script's ulimit), or by a prlimit"
                f"{parent_text}{unit_text}", AT_START)

    def _fd_checks(self, pid: int, scope: str, open_fds: int, soft: int | None, hard: int | None,
                   config_need: int | None = None,
                   configs: list[tuple[HaproxyConfig | None, list[Check]]] | None = None) -> list[Check]:
        recorded = self.recorded.get(pid)
        peak = max(open_fds, self.peaks.get(pid, 0), (recorded.peak_fds or 0) if recorded else 0)
        emfile = recorded.emfile if recorded else 0
        seen = f"{open_fds} open" + (f", peak {peak} in the recording" if peak > open_fds else "")
        if emfile:
            seen += f", {emfile} EMFILE failures"
        where, place = self.limit_place(pid, soft, configs)
        if recorded is not None and recorded.limit_source and recorded.fd_soft_limit == soft:
            # the limit it has now was set by a setrlimit/prlimit the recording traced: no guess
            where = f"{recorded.limit_source} (traced by the recording)"
        checks = [Check(scope, "RLIMIT_NOFILE source", Status.OK, where)]
        if soft is None:
            return [*checks, Check(scope, "RLIMIT_NOFILE soft", Status.OK, f"unlimited; {seen}")]
        need, basis = need_of(soft, peak, emfile, recorded.emfile_worst_second if recorded else 0,
                              recorded.maxsock if recorded else None, config_need)
        status = max(by_usage(peak, soft), Status.WARN if near_limit(need, soft) else Status.OK)
        if emfile or need > soft:
            status = Status.FAIL
        return checks + self._raise_fd_limit(scope, pid, soft, hard, need, basis, status, f"{soft} ({seen}, "
                                             f"{peak / soft:.0%})", place)

    def _raise_fd_limit(self, scope: str, pid: int | None, soft: int, hard: int | None, need: int, basis: str,
                        status: Status, current: str, place: LimitPlace, who: str = "the process") -> list[Check]:
        """The one RLIMIT_NOFILE recommendation, rendered from the advice layer's change
        (``advice.change.fd_limit_change``): the need with the margin, set where the limit in force
        was set (``place``), never below it (when that already holds the need, no number)."""
        found = fd_limit_change(need, basis, soft, hard, place, who)
        change = ""
        if found is None:
            held = "" if status == Status.OK else f"; it holds the {need} needed ({basis}): no higher limit to set"
            return [Check(scope, "RLIMIT_NOFILE soft", status, current + held)]
        target = found.value
        if status != Status.OK:
            if pid is not None and (hard is None or target <= hard):
                hard_text = hard if hard is not None else "unlimited"
                change = f"prlimit --pid {pid} --nofile={target}:{hard_text} now; for good: {found.command}"
            elif hard is None or target <= hard:
                change = found.command
            else:
                change = f"raise the soft and hard limits to {target}: {found.command}"
            if not basis.startswith("peak "):  # the need is more than the process could show
                change += f" ({found.reason})"
        checks = [Check(scope, "RLIMIT_NOFILE soft", status, current, f">= {target}" if status != Status.OK else "",
                        change)]
        nr_open = self._number("sys/fs/nr_open")
        if hard is not None and nr_open is not None and target > nr_open:
            checks.append(Check(scope, "RLIMIT_NOFILE vs fs.nr_open", Status.FAIL, f"fs.nr_open {nr_open}",
                                f">= {target}", f"sysctl -w fs.nr_open={target} (and in /etc/sysctl.d/)"))
        return checks

    def _recorded_checks(self, pid: int, gone: RecordedProcess) -> list[Check]:
        """The checks of a process that is gone, from what the recording holds of it."""
        scope = f"pid {pid} ({gone.comm}, gone: from the recording)"
        ended = f"; it ended: {gone.exit}" if gone.exit else ""
        origin = gone.limit_source or "not known: the process is gone and no change of its limit was traced"
        checks = [Check(scope, "RLIMIT_NOFILE source", Status.OK, f"{origin}{ended}")]
        soft, peak = gone.fd_soft_limit, gone.peak_fds or 0
        seen = f"peak {peak} open" + (f", {gone.emfile} EMFILE failures" if gone.emfile else "")
        if soft is None:
            checks.append(Check(scope, "RLIMIT_NOFILE soft", Status.OK, f"unlimited; {seen}"))
        else:
            need, basis = need_of(soft, peak, gone.emfile, gone.emfile_worst_second, gone.maxsock,
                                  source=gone.limit_source)
            status = Status.FAIL if gone.emfile or need > soft else max(
                by_usage(peak, soft), Status.WARN if near_limit(need, soft) else Status.OK)
            checks += self._raise_fd_limit(scope, None, soft, gone.fd_hard_limit, need, basis, status,
                                           f"{soft} ({seen}, {peak / soft:.0%})", AT_START, gone.comm)
        if gone.go_thread_limit is not None:
            checks.append(changed(scope, "Go thread limit", Status.FAIL,
                                  f"exceeded: the runtime said {go_said(gone.go_thread_limit)} and exited 2",
                                  go_exceeded_change(gone.go_thread_limit), "SetMaxThreads >= {value}"))
        elif gone.thread_limit_kind and gone.thread_limit:
            used = gone.thread_count or 0
            status = by_usage(used, gone.thread_limit)
            counted = THREADS_COUNTED.get(gone.thread_limit_kind, "threads")
            current = f"peak {used} of {gone.thread_limit} ({used / gone.thread_limit:.0%})"
            if counted != "threads":  # a limit shared with others: its count is theirs too, not its peak
                own = gone.threads if gone.threads is not None else "an unknown number of"
                current = (f"{used} {counted} of {gone.thread_limit} ({used / gone.thread_limit:.0%}) at most, "
                           f"not its own: it ran {own} threads")
            checks.append(changed(scope, f"{gone.thread_limit_kind} (threads)", status, current,
                                  thread_change(gone.thread_limit_kind, used, gone.thread_limit)))
        return checks + self._memory_checks(scope, None, gone)

    @staticmethod
    def _memory_checks(scope: str, sample: ProcessSample | None, recorded: RecordedProcess | None) -> list[Check]:
        """Its memory cgroup's usage against its limit (now, else its peak in the recording), an
        OOM kill, and the advice layer's memory change (``advice.memory.memory_change``: the
        recording's, from what its connections need, else one for its usage now)."""
        limit: int | None
        usage: int | None
        if sample is not None and sample.memcg_limit_bytes is not None and sample.memcg_usage_bytes is not None:
            limit, usage, when = sample.memcg_limit_bytes, sample.memcg_usage_bytes, ""
        elif recorded is not None and recorded.memcg_limit is not None and recorded.memcg_peak is not None:
            limit, usage, when = recorded.memcg_limit, recorded.memcg_peak, " at its peak in the recording"
        else:
            limit = usage = None
            when = ""
        if limit is None and (recorded is None or not (recorded.oom_killed or recorded.memory_change)):
            return []
        status = by_usage(usage or 0, limit)
        current = f"{kib(usage or 0)} of {kib(limit)} ({(usage or 0) / limit:.0%}){when}" if limit else "no limit"
        change = recorded.memory_change if recorded is not None else None
        if recorded is not None:
            if recorded.oom_killed:
                status = Status.FAIL
                current += ", OOM-killed in the recording"
            if recorded.memory_basis:
                current += f"; {recorded.memory_basis}"
            if change is not None:
                status = max(status, Status.WARN)
        if change is None and status:
            comm = recorded.comm if recorded is not None else sample.comm if sample is not None else ""
            unit = sample.unit if sample is not None else None
            change = memory_change(comm, limit, usage, unit=unit).change
        if change is None:
            return [Check(scope, "memory cgroup", status, current)]
        return [Check(scope, "memory cgroup", status, current, f"MemoryMax >= {memory_max(change.value)}",
                      change.command)]

    def _thread_checks(self, pid: int, scope: str, sample: ProcessSample) -> list[Check]:
        checks = []
        threads, uid = sample.threads, sample.uid
        if sample.nproc_soft_limit is not None and uid is not None:
            user_threads = threads_by_uid(self.procfs, self.sampler.pids(), {uid})[uid]
            status = by_usage(user_threads, sample.nproc_soft_limit)
            checks.append(changed(scope, f"RLIMIT_NPROC (threads of uid {uid})", status,
                                  f"{user_threads} of {sample.nproc_soft_limit}",
                                  thread_change("RLIMIT_NPROC", user_threads, sample.nproc_soft_limit)))
        if sample.pids_max is not None and sample.pids_current is not None:
            status = by_usage(sample.pids_current, sample.pids_max)
            checks.append(changed(scope, "cgroup pids.max", status, f"{sample.pids_current} tasks of {sample.pids_max}",
                                  thread_change("cgroup pids.max", sample.pids_current, sample.pids_max, sample.unit)))
        if sample.go_max_threads is not None:
            limit = sample.go_max_threads
            status = by_usage(threads, limit)
            growth = self.thread_growth.get(pid, 0.0)
            if sample.go_limit_unread is None and limit != GO_DEFAULT_MAX_THREADS:
                current = f"{threads} threads of its limit {limit} (debug.SetMaxThreads, read from its memory)"
            elif sample.go_limit_unread is None:
                current = f"{threads} threads of Go's default {limit} (read from its memory)"
            else:
                current = (f"{threads} threads of Go's default {limit} (a Go binary whose own limit could not be read: "
                           f"{sample.go_limit_unread}; the runtime prints it only once it is exceeded)")
            said = self.recorded.get(pid)
            if said is not None and said.go_thread_limit is not None:
                current = (f"{threads} threads; in the recording, {said.comm} exceeded its {said.go_thread_limit}-"
                           "thread limit (the runtime's message) and exited 2")
                status = max(status, by_usage(threads, said.go_thread_limit), Status.WARN)
            if growth > 0:
                eta = (limit - threads) / growth
                current += f", growing {growth:.0f}/s in the recording: the limit in {eta:.0f} s"
                if eta < 600:
                    status = max(status, Status.WARN)
            kind = "Go SetMaxThreads" if sample.go_limit_unread is None and limit != GO_DEFAULT_MAX_THREADS \
                else "Go default"
            # the advice layer's change, as the report and the live view render it: above the limit it
            # exceeded, else its peak with the margin when near the limit
            exceeded = said.go_thread_limit if said is not None else None
            change = go_exceeded_change(exceeded) if exceeded is not None else \
                thread_change(kind, threads, limit) if near_limit(threads, limit) else None
            if change is not None:
                checks.append(changed(scope, "Go thread limit", max(status, Status.WARN), current, change,
                                      "SetMaxThreads >= {value}"))
                return checks
            # No number: a limit nearing by its growth is not one to set at its peak.
            checks.append(Check(scope, "Go thread limit", status, current,
                                "fewer threads blocked in syscalls" if status else "",
                                GO_THREADS_ADVICE if status else ""))
        return checks

    def _haproxy_checks(self, pid: int, scope: str, soft: int | None, config: HaproxyConfig,
                        recommended: str) -> list[Check]:
        """One configuration's checks; the FD limit to set is the RLIMIT_NOFILE check's
        (``recommended``), so that the two never disagree."""
        checks = []
        maxconn, shape = config_maxconn(config), config_shape(config, self.procfs, pid)
        if maxconn is not None and shape is not None:
            need = shape.maxsock(maxconn)
            limit = soft if soft is not None else config.ulimit_n
            status = Status.FAIL if limit is not None and need > limit else Status.OK
            fits = shape.maxconn_for(limit) if limit is not None else None
            raise_to = recommended.removeprefix(">= ") or str(with_margin(need))
            smaller = f"or keep the limit and set maxconn {fits} in {config.path}" if fits is not None and \
                fits > 0 else f"no maxconn fits in {limit}: its threads and listeners alone need more"
            checks.append(Check(
                scope, "haproxy maxconn vs FD limit", status,
                f"maxconn {maxconn} needs {need} FDs as HAProxy counts them (Maxsock: {shape.maxsock_sum(maxconn)}; "
                f"the listeners: {config.listeners} bound, {len(config.stats_sockets)} stats socket"
                f"{'s' if len(config.stats_sockets) != 1 else ''}); "
                f"the process may open {limit if limit is not None else 'unlimited'}",
                f"FD limit >= {raise_to} (RLIMIT_NOFILE soft, above)" + (f", or maxconn <= {fits}" if fits is not None
                                                                        and fits > 0 else "") if status else "",
                smaller if status else ""))
        if config.ulimit_n is not None and soft is not None and config.ulimit_n != soft:
            checks.append(Check(scope, "haproxy ulimit-n", Status.WARN,
                                f"config says {config.ulimit_n}, the process has {soft}",
                                str(soft), "make ulimit-n and the service's LimitNOFILE agree"))
        if config.strict_limits is False:
            checks.append(Check(scope, "haproxy strict-limits", Status.WARN, "no strict-limits",
                                "strict-limits", "remove 'no strict-limits' so HAProxy refuses to start "
                                "without the FDs its maxconn needs"))
        checks += self._haproxy_runtime(scope, config, shape, self._uid(pid), pid)
        return checks

    def _uid(self, pid: int) -> int | None:
        uid = self._status_field(pid, "Uid")
        return int(uid.split()[0]) if uid and uid.split()[0].isdigit() else None

    def _haproxy_runtime(self, scope: str, config: HaproxyConfig, shape: HaproxyShape | None,
                         uid: int | None, pid: int) -> list[Check]:
        """`show info` of the stats sockets the configuration names: only sockets that belong to
        the process's own user, since anyone can start a process named haproxy and name any
        socket of root's in its configuration; and only while haproxy has room for the
        connection, counted just before it is made (``procfs.room``)."""
        checks = []
        for path in config.stats_sockets:
            try:
                owner = os.lstat(path).st_uid
                if owner != uid:
                    checks.append(Check(scope, "haproxy stats socket", Status.WARN,
                                        f"{path} belongs to uid {owner}, not to the process's user: not asked"))
                    continue
                info = show_info(path, room=lambda: refusal(self.procfs, pid, f"haproxy [{pid}]"))
            except HeldBackError as reason:
                checks.append(Check(scope, "haproxy stats socket", Status.WARN, f"{path} not asked: {reason}"))
                continue
            except OSError as exc:
                checks.append(Check(scope, "haproxy stats socket", Status.WARN, f"{path} did not answer ({exc})"))
                continue
            current = info_number(info, "CurrConns") or 0
            maxconn = info_number(info, "Maxconn") or None
            status = by_usage(current, maxconn)
            # the pair HAProxy accepts, never below the maxconn or the FD limit in force (advice.haproxy)
            found = maxconn_change(current, maxconn, shape, info_number(info, "Ulimit-n") or None, str(config.path)) \
                if shape is not None and current >= 1 else None
            said = f"{current} of {maxconn} (Ulimit-n {info.get('Ulimit-n')}, Maxsock {info.get('Maxsock')})"
            if shape is None and status:  # no shape the model takes: no number
                checks.append(Check(scope, "haproxy CurrConns vs Maxconn", status, said, "",
                                    "raise maxconn and the FD limits with it"))
                continue
            checks.append(changed(scope, "haproxy CurrConns vs Maxconn", status, said, found, "maxconn >= {value}"))
        return checks

    # System checks

    def system_checks(self, listen_moved: dict[str, int] | None = None,
                      consumers: list[int] | None = None) -> list[Check]:
        """File table, listen queues, thread and pid limits of the whole machine."""
        system = self.sampler.system()
        checks = []
        file_nr, file_max = system["file_nr"], system["file_max"]
        checks.append(changed("system", "fs.file-max vs file-nr", by_usage(file_nr, file_max),
                              f"{file_nr} of {file_max}", file_max_change(file_nr, file_max)))
        limits = [s.fd_soft_limit for pid in (consumers or []) if (s := self.sampler.sample(pid)) and s.fd_soft_limit]
        if limits:
            total = sum(limits)
            status = Status.WARN if total > file_max else Status.OK
            change = file_max_change(total, file_max, f"the {len(limits)} biggest consumers' FD limits add up to "
                                     f"{total:,}: ENFILE comes before any of them reaches its own limit")
            checks.append(Check("system", "sum of the big consumers' FD limits vs fs.file-max", status,
                                f"{total} ({len(limits)} processes) against {file_max}",
                                f"fs.file-max >= {change.value}" if status and change else "",
                                change.text() if status and change else ""))
        checks.append(Check("system", "fs.nr_open (ceiling of any RLIMIT_NOFILE)", Status.OK, str(system["nr_open"])))
        somaxconn = system["somaxconn"]
        if somaxconn is not None:
            low = somaxconn_change(somaxconn)
            checks.append(changed("system", "net.core.somaxconn", Status.WARN if low else Status.OK, str(somaxconn),
                                  low, f">= {SOMAXCONN_LOW}"))
        backlog = self._number("sys/net/ipv4/tcp_max_syn_backlog")
        if backlog is not None:
            status = Status.WARN if backlog < 4096 else Status.OK
            checks.append(Check("system", "net.ipv4.tcp_max_syn_backlog", status, str(backlog),
                                ">= 4096" if status else "",
                                "sysctl -w net.ipv4.tcp_max_syn_backlog=4096" if status else ""))
        reuse = self._number("sys/net/ipv4/tcp_tw_reuse")
        if reuse is not None:
            status = Status.WARN if reuse == 0 else Status.OK
            checks.append(Check("system", "net.ipv4.tcp_tw_reuse", status, str(reuse), "1" if status else "",
                                "sysctl -w net.ipv4.tcp_tw_reuse=1" if status else ""))
        moved = listen_moved if listen_moved is not None else {
            "ListenOverflows": system["listen_overflows"] or 0, "ListenDrops": system["listen_drops"] or 0}
        when = "during the recording" if listen_moved is not None else "since boot"
        status = Status.WARN if any(moved.values()) else Status.OK
        checks.append(Check("system", f"TcpExt {' / '.join(moved)} {when}", status,
                            ", ".join(f"{count} {name}" for name, count in moved.items()), "0" if status else "",
                            listen_fix(", ".join(self.accept_failures) or None, somaxconn) if status else ""))
        threads = sum(int(self._status_field(p, "Threads") or 0) for p in self.sampler.pids())
        for kind, limit in (("threads-max", system["threads_max"]), ("pid_max", system["pid_max"])):
            checks.append(changed("system", f"kernel.{kind} vs threads", by_usage(threads, limit),
                                  f"{threads} of {limit}", thread_change(kind, threads, limit)))
        return checks


def need_text(need: int, basis: str) -> str:
    """"1613 (800 connections at ...)"."""
    return f"{need} ({basis})"


def haproxy_pair(config: HaproxyConfig, procfs: ProcFS, pid: int,
                 connections: int | None) -> tuple[int, int, str] | None:
    """(maxconn, what HAProxy demands for it, why) for a configuration that must hold
    ``connections`` at once: its maxconn when that holds them with the margin, else that many
    with the margin; the demand is its Maxsock (``advice.haproxy``). None without a maxconn or
    shape the model takes."""
    maxconn, shape = config_maxconn(config), config_shape(config, procfs, pid)
    if maxconn is None or shape is None:
        return None
    if connections is not None and connections >= 1:
        maxconn = max(maxconn, with_margin(connections))
    demanded = shape.maxsock(maxconn)
    return maxconn, demanded, f"HAProxy's Maxsock {demanded} for maxconn {maxconn} ({shape.maxsock_sum(maxconn)})"


def _maxconn_checks(scope: str, config: HaproxyConfig, connections: int, maxconn: int,
                    recommended: str, demanded: int, soft: int | None) -> list[Check]:
    """HAProxy's maxconn against the connections held at once: the maxconn to set (with the
    margin) named with the FD limit HAProxy demands for it (``recommended``, the RLIMIT_NOFILE
    check's), the pair that starts under ``strict-limits``."""
    current = config_maxconn(config)
    if current is None:
        return []
    status = Status.FAIL if current < connections else Status.WARN if current < maxconn else Status.OK
    limit = recommended.removeprefix(">= ")
    with_limit = (f", and ulimit-n {limit} with it (what HAProxy demands for that maxconn, with the margin)"
                  if limit else f", within its FD limit {soft if soft is not None else 'unlimited'} (HAProxy demands "
                  f"{demanded} for it)")
    return [Check(scope, "haproxy maxconn vs the rehearsed shape", status,
                  f"maxconn {current} for {connections} connections at once",
                  f"maxconn >= {maxconn}" if status else "",
                  f"set maxconn {maxconn} in the global section of {config.path}{with_limit}" if status else "")]


def _nginx_checks(scope: str, nginx: NginxConfig | str, connections: int | None) -> list[Check]:
    """An nginx worker's connection slots against the connections held at once
    (``advice.nginx``): worker_connections named with the value the shape needs."""
    if isinstance(nginx, str):
        return [Check(scope, "nginx config", Status.WARN, nginx)]
    shape = nginx.shape()
    checks = [Check(scope, "nginx config", Status.WARN, problem) for problem in nginx.problems]
    if shape is None or connections is None or connections < 1:
        return checks
    held = shape.proxied_per_worker()
    change = shape.connections_change(connections)
    status = Status.OK if change is None else Status.FAIL if held < connections else Status.WARN
    current = (f"worker_connections {shape.worker_connections} hold {held} proxied connections per worker (2 slots "
               f"each, {shape.listeners} listener{'s' * (shape.listeners != 1)}); {connections} at once")
    checks.append(Check(scope, "nginx worker_connections vs the rehearsed shape", status, current,
                        f"worker_connections >= {change.value}" if change is not None else "",
                        change.text() if change is not None else ""))
    return checks
