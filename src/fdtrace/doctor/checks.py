"""The checks, read from a procfs and a sysfs tree (tests pass fake ones)."""

from __future__ import annotations

import enum
import math
import os
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fdtrace.analysis.needs import need_of
from fdtrace.analysis.report.advice import (
    fd_limit_fix,
    file_max_fix,
    file_max_needed,
    go_said,
    listen_fix,
    soft_hard,
    thread_fix,
)
from fdtrace.children import CHILD_CWD, child_environment, program
from fdtrace.integrations.haproxy import (
    HaproxyConfig,
    config_fds,
    fds_needed,
    fds_needed_sum,
    info_number,
    read_process_configs,
    show_info,
    threads_of,
)
from fdtrace.policy import MIB, THREADS_COUNTED, USAGE_CRITICAL, USAGE_WARN, kib, with_margin
from fdtrace.procfs.golang import GO_DEFAULT_MAX_THREADS
from fdtrace.procfs.reader import ProcessAccessDeniedError, ProcessGoneError, ProcFS
from fdtrace.procfs.sampler import ProcSampler
from fdtrace.procfs.thread_limits import threads_by_uid
from fdtrace.schema.records import ProcessSample

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
    memory_change: str = ""  # what to change, when it does not fit


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

    def __init__(self, procfs: str | Path = "/proc", peaks: dict[int, int] | None = None,
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

    def _limit_source(self, pid: int, soft: int | None,
                      configs: list[tuple[HaproxyConfig | None, list[Check]]] | None = None,
                      ) -> tuple[str, Callable[[int, int | None], str]]:
        """(where the soft limit comes from, how to set soft (and hard) limits for good): the
        systemd unit when its LimitNOFILE gave it, HAProxy's own ulimit-n, the parent it was
        inherited from, or else the process itself (setrlimit) or someone's prlimit."""
        unit = self._systemd_unit(pid)
        current = self._unit_limit(unit) if unit else None
        if unit:
            def by_unit(new_soft: int, hard: int | None) -> str:
                return (f"set LimitNOFILE={soft_hard(new_soft, hard)} in [Service] of {unit}, "
                        f"then systemctl daemon-reload && systemctl restart {unit}")
            unit_soft = _unit_soft(current)
            if current is None or unit_soft is None or unit_soft == soft:
                return f"systemd unit {unit}" + (f" ({current})" if current else ""), by_unit
        for config, _ in configs or []:
            if config is not None and config.ulimit_n is not None and config.ulimit_n == soft:
                path = config.path

                def by_config(new_soft: int, hard: int | None, path: Path = path) -> str:
                    return (f"set ulimit-n {new_soft} in the global section of {path}, and let the service's "
                            "LimitNOFILE allow it")
                return (f"ulimit-n {soft} in {path} (HAProxy sets its own limit at start; one set before it "
                        "started, by prlimit or its unit, looks the same: fdtrace doctor --from a recording of its "
                        "start names which)"), by_config
        ppid = self._status_field(pid, "PPid")
        parent = self.sampler.sample(int(ppid)) if ppid and ppid.isdigit() and ppid != "0" else None
        def by_start(new_soft: int, hard: int | None) -> str:
            return fd_limit_fix(new_soft, hard)
        if parent is not None and parent.fd_soft_limit == soft:
            return f"inherited from its parent pid {ppid} ({parent.comm}), whose soft limit is the same", by_start
        unit_text = f"; its unit {unit} says {current}" if unit and current else ""
        parent_text = (f"; its parent pid {ppid} ({parent.comm}) has {parent.fd_soft_limit or 'unlimited'}"
                       if parent is not None else "")
        return (f"set for this process: by its own setrlimit (or its start script's ulimit), or by a prlimit"
                f"{parent_text}{unit_text}", by_start)

    def _fd_checks(self, pid: int, scope: str, open_fds: int, soft: int | None, hard: int | None,
                   config_need: int | None = None,
                   configs: list[tuple[HaproxyConfig | None, list[Check]]] | None = None) -> list[Check]:
        recorded = self.recorded.get(pid)
        peak = max(open_fds, self.peaks.get(pid, 0), (recorded.peak_fds or 0) if recorded else 0)
        emfile = recorded.emfile if recorded else 0
        seen = f"{open_fds} open" + (f", peak {peak} in the recording" if peak > open_fds else "")
        if emfile:
            seen += f", {emfile} EMFILE failures"
        where, how = self._limit_source(pid, soft, configs)
        if recorded is not None and recorded.limit_source and recorded.fd_soft_limit == soft:
            # the limit it has now was set by a setrlimit/prlimit the recording traced: no guess
            where = f"{recorded.limit_source} (traced by the recording)"
        checks = [Check(scope, "RLIMIT_NOFILE source", Status.OK, where)]
        if soft is None:
            return [*checks, Check(scope, "RLIMIT_NOFILE soft", Status.OK, f"unlimited; {seen}")]
        need, basis = need_of(soft, peak, emfile, recorded.emfile_worst_second if recorded else 0,
                              recorded.maxsock if recorded else None, config_need)
        status = by_usage(peak, soft)
        if emfile or need > soft:
            status = Status.FAIL
        return checks + self._raise_fd_limit(scope, pid, soft, hard, need, basis, status, f"{soft} ({seen}, "
                                             f"{peak / soft:.0%})", how)

    def _raise_fd_limit(self, scope: str, pid: int | None, soft: int, hard: int | None, need: int, basis: str,
                        status: Status, current: str, how: Callable[[int, int | None], str]) -> list[Check]:
        """The one RLIMIT_NOFILE recommendation: the need with the margin."""
        target = with_margin(need)
        change = ""
        if status != Status.OK:
            if pid is not None and (hard is None or target <= hard):
                hard_text = hard if hard is not None else "unlimited"
                change = f"prlimit --pid {pid} --nofile={target}:{hard_text} now; for good: {how(target, hard)}"
            elif hard is None or target <= hard:
                change = how(target, hard)
            else:
                change = f"raise the soft and hard limits to {target}: {how(target, target)}"
            if not basis.startswith("peak "):  # the need is more than the process could show
                change += f" (needed: {need}, {basis})"
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
            status = Status.FAIL if gone.emfile or need > soft else by_usage(peak, soft)

            def how(new_soft: int, hard: int | None) -> str:
                return fd_limit_fix(new_soft, hard, gone.comm)
            checks += self._raise_fd_limit(scope, None, soft, gone.fd_hard_limit, need, basis, status,
                                           f"{soft} ({seen}, {peak / soft:.0%})", how)
        if gone.go_thread_limit is not None:
            checks.append(Check(scope, "Go thread limit", Status.FAIL,
                                f"exceeded: the runtime said {go_said(gone.go_thread_limit)} and exited 2",
                                "fewer threads blocked in syscalls", thread_fix("Go default")))
        elif gone.thread_limit_kind and gone.thread_limit:
            used = gone.thread_count or 0
            status = by_usage(used, gone.thread_limit)
            counted = THREADS_COUNTED.get(gone.thread_limit_kind, "threads")
            current = f"peak {used} of {gone.thread_limit} ({used / gone.thread_limit:.0%})"
            if counted != "threads":  # a limit shared with others: its count is theirs too, not its peak
                own = gone.threads if gone.threads is not None else "an unknown number of"
                current = (f"{used} {counted} of {gone.thread_limit} ({used / gone.thread_limit:.0%}) at most, "
                           f"not its own: it ran {own} threads")
            checks.append(Check(scope, f"{gone.thread_limit_kind} (threads)", status, current,
                                f">= {with_margin(used)}" if status else "",
                                thread_fix(gone.thread_limit_kind, with_margin(used)) if status else ""))
        return checks + self._memory_checks(scope, None, gone)

    @staticmethod
    def _memory_checks(scope: str, sample: ProcessSample | None, recorded: RecordedProcess | None) -> list[Check]:
        """Its memory cgroup's usage against its limit (now, else its peak in the recording), an
        OOM kill, and what its connections need (the recording's fit, ``analysis.memory``)."""
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
        recommended = change = ""
        if recorded is not None:
            if recorded.oom_killed:
                status = Status.FAIL
                current += ", OOM-killed in the recording"
            if recorded.memory_basis:
                current += f"; {recorded.memory_basis}"
            if recorded.memory_change:
                status = max(status, Status.WARN)
                change = recorded.memory_change
                if recorded.memory_need is not None:
                    recommended = f"MemoryMax >= {math.ceil(with_margin(recorded.memory_need) / MIB)}M"
        if status and not change and limit and usage:
            recommended = f"MemoryMax >= {math.ceil(with_margin(usage) / MIB)}M"
            change = "raise MemoryMax= of its unit (memory.max, memory.limit_in_bytes), or find what holds the memory"
        return [Check(scope, "memory cgroup", status, current, recommended, change)]

    def _thread_checks(self, pid: int, scope: str, sample: ProcessSample) -> list[Check]:
        checks = []
        threads, uid = sample.threads, sample.uid
        if sample.nproc_soft_limit is not None and uid is not None:
            user_threads = threads_by_uid(self.procfs, self.sampler.pids(), {uid})[uid]
            status = by_usage(user_threads, sample.nproc_soft_limit)
            checks.append(Check(scope, f"RLIMIT_NPROC (threads of uid {uid})", status,
                                f"{user_threads} of {sample.nproc_soft_limit}",
                                f">= {with_margin(user_threads)}" if status else "",
                                thread_fix("RLIMIT_NPROC", with_margin(user_threads)) if status else ""))
        if sample.pids_max is not None and sample.pids_current is not None:
            status = by_usage(sample.pids_current, sample.pids_max)
            checks.append(Check(scope, "cgroup pids.max", status, f"{sample.pids_current} tasks of {sample.pids_max}",
                                f">= {with_margin(sample.pids_current)}" if status else "",
                                thread_fix("cgroup pids.max", with_margin(sample.pids_current)) if status else ""))
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
            # No number: a limit nearing by its growth (or one said exceeded) is not one to set at its peak.
            checks.append(Check(scope, "Go thread limit", status, current,
                                "fewer threads blocked in syscalls" if status else "",
                                thread_fix("Go default") if status else ""))
        return checks

    def _haproxy_checks(self, pid: int, scope: str, soft: int | None, config: HaproxyConfig,
                        recommended: str) -> list[Check]:
        """One configuration's checks; the FD limit to set is the RLIMIT_NOFILE check's
        (``recommended``), so that the two never disagree."""
        checks = []
        if config.maxconn is not None:
            threads, listeners = threads_of(config, self.procfs, pid), config.listeners + len(config.stats_sockets)
            need = fds_needed(config.maxconn, listeners, threads)
            limit = soft if soft is not None else config.ulimit_n
            status = Status.FAIL if limit is not None and need > limit else Status.OK
            fits = (limit - (need - 2 * config.maxconn)) // 2 if limit is not None else None
            raise_to = recommended.removeprefix(">= ") or str(with_margin(need))
            smaller = f"or keep the limit and set maxconn {fits} in {config.path}" if fits is not None and \
                fits > 0 else f"no maxconn fits in {limit}: its threads and listeners alone need more"
            checks.append(Check(
                scope, "haproxy maxconn vs FD limit", status,
                f"maxconn {config.maxconn} needs ~{need} FDs as HAProxy counts them "
                f"({fds_needed_sum(config.maxconn, listeners, threads)}; the listeners: "
                f"{config.listeners} bound, {len(config.stats_sockets)} stats socket"
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
        checks += self._haproxy_runtime(scope, config.stats_sockets, self._uid(pid))
        return checks

    def _uid(self, pid: int) -> int | None:
        uid = self._status_field(pid, "Uid")
        return int(uid.split()[0]) if uid and uid.split()[0].isdigit() else None

    def _haproxy_runtime(self, scope: str, sockets: list[str], uid: int | None) -> list[Check]:
        """`show info` of the stats sockets the configuration names: only sockets that belong to
        the process's own user, since anyone can start a process named haproxy and name any
        socket of root's in its configuration."""
        checks = []
        for path in sockets:
            try:
                owner = os.lstat(path).st_uid
                if owner != uid:
                    checks.append(Check(scope, "haproxy stats socket", Status.WARN,
                                        f"{path} belongs to uid {owner}, not to the process's user: not asked"))
                    continue
                info = show_info(path)
            except OSError as exc:
                checks.append(Check(scope, "haproxy stats socket", Status.WARN, f"{path} did not answer ({exc})"))
                continue
            current = info_number(info, "CurrConns") or 0
            maxconn = info_number(info, "Maxconn") or None
            status = by_usage(current, maxconn)
            checks.append(Check(scope, "haproxy CurrConns vs Maxconn", status,
                                f"{current} of {maxconn} "
                                f"(Ulimit-n {info.get('Ulimit-n')}, Maxsock {info.get('Maxsock')})",
                                f"maxconn >= {with_margin(current)}" if status else "",
                                "raise maxconn and the FD limits with it" if status else ""))
        return checks

    # System checks

    def system_checks(self, listen_moved: dict[str, int] | None = None,
                      consumers: list[int] | None = None) -> list[Check]:
        """File table, listen queues, thread and pid limits of the whole machine."""
        system = self.sampler.system()
        checks = []
        file_nr, file_max = system["file_nr"], system["file_max"]
        needed = file_max_needed(file_nr, file_max)
        checks.append(Check("system", "fs.file-max vs file-nr", by_usage(file_nr, file_max), f"{file_nr} of {file_max}",
                            f">= {needed}" if needed else "", file_max_fix(needed) if needed else ""))
        limits = [s.fd_soft_limit for pid in (consumers or []) if (s := self.sampler.sample(pid)) and s.fd_soft_limit]
        if limits:
            total = sum(limits)
            status = Status.WARN if total > file_max else Status.OK
            checks.append(Check("system", "sum of the big consumers' FD limits vs fs.file-max", status,
                                f"{total} ({len(limits)} processes) against {file_max}",
                                f"fs.file-max >= {total * 2}" if status else "",
                                f"sysctl -w fs.file-max={total * 2} (and in /etc/sysctl.d/), or ENFILE comes "
                                "before any process reaches its own limit" if status else ""))
        checks.append(Check("system", "fs.nr_open (ceiling of any RLIMIT_NOFILE)", Status.OK, str(system["nr_open"])))
        somaxconn = system["somaxconn"]
        if somaxconn is not None:
            status = Status.WARN if somaxconn < 4096 else Status.OK
            checks.append(Check("system", "net.core.somaxconn", status, str(somaxconn), ">= 4096" if status else "",
                                "sysctl -w net.core.somaxconn=65535 (and in /etc/sysctl.d/)" if status else ""))
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
        change = listen_fix(", ".join(self.accept_failures) or None) if status else ""
        checks.append(Check("system", f"TcpExt {' / '.join(moved)} {when}", status,
                            ", ".join(f"{count} {name}" for name, count in moved.items()), "0" if status else "",
                            change))
        threads = sum(int(self._status_field(p, "Threads") or 0) for p in self.sampler.pids())
        for name, limit in (("kernel.threads-max", system["threads_max"]), ("kernel.pid_max", system["pid_max"])):
            status = by_usage(threads, limit)
            checks.append(Check("system", f"{name} vs threads", status, f"{threads} of {limit}",
                                f">= {with_margin(threads) * 2}" if status else "",
                                (thread_fix("threads-max", with_margin(threads) * 2) if name == "kernel.threads-max"
                                 else f"sysctl -w {name}={with_margin(threads) * 2}") if status else ""))
        return checks
