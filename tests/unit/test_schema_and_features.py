"""The schema's numbering and the kernel feature probe, on fake format files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fdtrace.errors import FdtraceError
from fdtrace.kernel import features
from fdtrace.kernel.counters import CounterStore
from fdtrace.schema import COUNTERS, EVENT_FIELDS, SYSCALL_NAMES, bpf_cflags

EXIT_FORMAT = """name: sys_exit_{name}
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:long ret;\toffset:{offset};\tsize:8;\tsigned:1;
"""


def write_format(root: Path, category: str, event: str, text: str) -> None:
    (root / category / event).mkdir(parents=True)
    (root / category / event / "format").write_text(text)


def test_cflags_number_every_kind_syscall_and_counter() -> None:
    flags = bpf_cflags()
    assert "-DFDT_KIND_OOM_KILL=11" in flags
    assert f"-DFDT_SC_accept4={SYSCALL_NAMES.index('accept4')}" in flags
    assert f"-DFDT_N_COUNTERS={len(COUNTERS)}" in flags
    assert len(set(SYSCALL_NAMES)) == len(SYSCALL_NAMES)


def test_docs_describe_every_event_column() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "format.md").read_text()
    for field in EVENT_FIELDS:
        assert f"`{field.name}`" in doc, field.name


def test_probe_skips_missing_and_misaligned_tracepoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(features.FORMATS_ENV, str(tmp_path))
    for name in ("socket", "accept4", "close", "openat"):
        write_format(tmp_path, "syscalls", f"sys_exit_{name}", EXIT_FORMAT.format(name=name, offset=16))
    write_format(tmp_path, "syscalls", "sys_exit_pipe2", EXIT_FORMAT.format(name="pipe2", offset=24))
    write_format(tmp_path, "sched", "sched_process_exit",
                 "\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n")
    found = features.probe_kernel()
    assert found.syscall_exits == ["socket", "accept4", "close", "openat"]
    assert "syscalls:sys_exit_pipe2" in found.missing  # present with another layout: not attached
    assert "syscalls:sys_exit_connect" in found.missing
    assert "oom:mark_victim" in found.missing
    assert found.lifecycle == ["sched:sched_process_exit"] and not found.group_dead
    assert "-DFDT_HAVE_sched_process_exit" in found.cflags()


def test_kernel_without_syscall_tracepoints_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(features.FORMATS_ENV, str(tmp_path))
    with pytest.raises(FdtraceError, match="no syscall tracepoints"):
        features.probe_kernel()


def test_counter_store_keeps_exited_instances_apart_from_a_reused_pid() -> None:
    store = CounterStore()
    base = dict.fromkeys(COUNTERS, 0)
    first = {**base, "pid": 9, "first_ts": 1, "exit_ts": 5, "comm": "old", "sockets": 3}
    second = {**base, "pid": 9, "first_ts": 7, "exit_ts": None, "comm": "new", "sockets": 1}
    errors = [{"pid": 9, "first_ts": 1, "syscall": "socket", "errno": 24, "count": 2}]
    forget = store.update([second], [first], errors)
    assert forget == {(9, 1)}
    old, new = store.for_pid(9)
    assert (old.comm, old.counts["sockets"], old.errors) == ("old", 3, {("socket", "EMFILE"): 2})
    assert (new.comm, new.counts["sockets"], new.errors) == ("new", 1, {})


def test_headless_modules_import_neither_textual_nor_bcc_nor_matplotlib() -> None:
    code = ("import sys, fdtrace.cli, fdtrace.kernel.session, fdtrace.sinks.jsonl, fdtrace.recording.writer,"
            "fdtrace.sinks.parquet, fdtrace.sources.live, fdtrace.pipeline, fdtrace.tui.state, fdtrace.analysis,"
            "fdtrace.sources.replay,"
            "fdtrace.analysis.report, fdtrace.integrations.phases.files;"
            "print(','.join(m for m in ('textual', 'bcc', 'matplotlib') if m in sys.modules))")
    leaked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert leaked == ""


def test_missing_tracefs_without_mount_permission_is_explained(tmp_path: Path) -> None:
    with pytest.raises(FdtraceError, match=r"tracefs is not mounted at .* run 'mount -t tracefs"):
        features.ensure_tracefs(tmp_path / "tracing", mount=False)


def test_a_renamed_counter_reads_under_its_new_name_from_older_recordings() -> None:
    from pathlib import Path

    from fdtrace.analysis import load
    from fdtrace.analysis.engines.dataset import engine_for

    fixture = Path(__file__).parents[1] / "data" / "emfile"  # written by schema version 4: "fd_errors"
    for engine in ("pandas", "duckdb"):
        with engine_for(load(fixture, engine=engine)) as runner:
            counted = runner.query("SELECT max(other_fd_call_errors) AS n FROM counters WHERE comm = 'emfile-child'")
        assert int(counted["n"].iloc[0]) == 1  # its one failed pipe2()
    assert load(fixture, columns={"counters": ["comm", "other_fd_call_errors"]}).counters[
        "other_fd_call_errors"].max() == 1
