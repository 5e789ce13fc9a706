"""The shipped Prometheus rules and Grafana dashboard: valid for promtool, their alerts right on
synthetic series (promtool test rules), and every metric they name is one fdtrace exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from importlib import resources
from pathlib import Path

import pytest

from fdtrace.kernel.counters import CounterStore
from fdtrace.schema.records import ProcessSample
from fdtrace.sinks.prometheus import PrometheusSink

DATA = Path(str(resources.files("fdtrace") / "data"))
RULES = DATA / "fdtrace-alerts.yml"
DASHBOARD = DATA / "fdtrace-dashboard.json"
RULE_TESTS = Path(__file__).parents[1] / "data" / "prometheus" / "alerts_test.yml"
promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) is missing")


@promtool
def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


@promtool
def test_the_alerts_fire_when_and_only_when_they_should() -> None:
    result = subprocess.run(["promtool", "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def exported_names() -> set[str]:
    sink = PrometheusSink("127.0.0.1:0")
    try:
        sample = ProcessSample(pid=7, start_ns=1, comm="haproxy", open_fds=850, fd_soft_limit=1000, fd_hard_limit=4096,
                               threads=9000, sockets=800, go_max_threads=10000, rss_anon_kb=1, rss_file_kb=2,
                               rss_shmem_kb=3, memcg_limit_bytes=100, memcg_usage_bytes=95)
        store = CounterStore()
        store.update([{"pid": 7, "first_ts": 1, "exit_ts": None, "comm": "haproxy", "sockets": 1, "socket_errors": 1,
                       "accepts": 0, "accept_errors": 0, "connects": 0, "connect_errors": 0, "closes": 0,
                       "close_errors": 0, "other_fd_call_errors": 1, "threads_started": 0, "threads_exited": 0}], [],
                     [{"pid": 7, "first_ts": 1, "syscall": "socket", "errno": 24, "count": 1}])
        sink.update([sample], {"file_nr": 10, "file_max": 100}, store, {"ringbuf_full": 0},
                    [{"socket": "/run/haproxy.sock", "curr_conns": 950, "maxconn": 1000}])
        return {family.name for family in sink.collect()} | {family.name + "_total" for family in sink.collect()}
    finally:
        sink.close()


def named_metrics(expression: str) -> set[str]:
    return set(re.findall(r"\b((?:fdtrace|process|node)_[a-z_]+)\b", expression))


def test_rules_and_dashboard_name_only_exported_metrics() -> None:
    exported = exported_names()
    rule_expressions = re.findall(r"expr: \|?\s*\n?((?:.+\n?)+?)\s+(?:for|labels):", RULES.read_text())
    assert len(rule_expressions) == 7
    dashboard = json.loads(DASHBOARD.read_text())
    panel_expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for expression in rule_expressions + panel_expressions:
        unknown = named_metrics(expression) - exported
        assert not unknown, (expression, unknown)
    assert {"process_open_fds", "process_max_fds", "fdtrace_failed_calls_total", "fdtrace_process_thread_limit",
            "fdtrace_haproxy_maxconn", "fdtrace_events_lost_total",
            "fdtrace_process_memory_cgroup_limit_bytes"} <= set().union(*map(named_metrics,
                                                                                         rule_expressions))


def test_export_prints_the_shipped_files() -> None:
    import sys

    fdtrace = str(Path(sys.executable).with_name("fdtrace"))
    rules = subprocess.run([fdtrace, "export", "--rules"], capture_output=True, text=True, timeout=60, check=True)
    assert rules.stdout == RULES.read_text()
    board = subprocess.run([fdtrace, "export", "--dashboard"], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(board.stdout)["uid"] == "fdtrace"


def test_a_processs_unit_and_container_are_labels_of_its_gauges() -> None:
    sink = PrometheusSink("127.0.0.1:0")
    ident = "4f1c2e3d" * 8
    try:
        placed = ProcessSample(pid=7, start_ns=1, comm="haproxy", open_fds=850, fd_soft_limit=1000, fd_hard_limit=4096,
                               threads=9, sockets=800, unit=f"docker-{ident}.scope", container_id=ident,
                               container_runtime="docker", cgroup=f"/system.slice/docker-{ident}.scope")
        plain = ProcessSample(pid=8, start_ns=1, comm="quiet", open_fds=5, fd_soft_limit=1000, fd_hard_limit=4096,
                              threads=1, sockets=0)
        sink.update([placed, plain], {"file_nr": 10, "file_max": 100}, CounterStore(), {}, [])
        [family] = [f for f in sink.collect() if f.name == "process_open_fds"]
        labels = {s.labels["pid"]: s.labels for s in family.samples}
        assert labels["7"] == {"pid": "7", "comm": "haproxy", "unit": f"docker-{ident}.scope",
                               "container": ident[:12]}
        assert labels["8"] == {"pid": "8", "comm": "quiet", "unit": "", "container": ""}  # empty: absent
    finally:
        sink.close()


def test_the_limit_families_help_says_where_to_change_each_in_the_advice_layers_words() -> None:
    """A scrape's HELP of each limit family names where that limit is changed, as the advice
    layer's generic places say it (doctor, the report and the live view name the same places)."""
    from fdtrace.advice.change import AT_START
    from fdtrace.advice.fixes import THREAD_PLACES
    from fdtrace.advice.haproxy import MAXCONN_PLACE
    from fdtrace.advice.memory import MEMORY_PLACES

    sink = PrometheusSink("127.0.0.1:0")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/metrics", timeout=30) as answer:
            page = answer.read().decode()
    finally:
        sink.close()
    helps = dict(line.split(" ", 3)[2:] for line in page.splitlines() if line.startswith("# HELP "))
    assert AT_START.where() in helps["process_max_fds"]
    assert "ulimit-n in the global section of its configuration" in helps["process_max_fds"]
    assert "worker_rlimit_nofile in the main context of its configuration" in helps["process_max_fds"]
    for kind in ("Go default", "RLIMIT_NPROC", "cgroup pids.max"):
        assert f"{kind}: {THREAD_PLACES[kind]}" in helps["fdtrace_process_thread_limit"]
    assert MEMORY_PLACES in helps["fdtrace_process_memory_cgroup_limit_bytes"]
    assert MAXCONN_PLACE in helps["fdtrace_haproxy_maxconn"]
