"""Where a process runs, from /proc/PID/cgroup paths as the container runtimes and systemd name
them, on cgroup v2 (one line) and v1 (a line per hierarchy)."""

from __future__ import annotations

import pytest

from fdtrace.procfs.containers import Placement, placement

ID = "4f1c2e3d" * 8
UID = "8d3a1f6e-2b4c-4e5f-9a0b-1c2d3e4f5a6b"


def v2(path: str) -> list[tuple[str, str, str]]:
    return [("0", "", path)]


def v1(path: str, systemd: str | None = None) -> list[tuple[str, str, str]]:
    return [("12", "pids", path), ("4", "memory", path), ("1", "name=systemd", systemd or path)]


@pytest.mark.parametrize(("lines", "expected"), [
    (v2(f"/system.slice/docker-{ID}.scope"),
     Placement(f"/system.slice/docker-{ID}.scope", f"docker-{ID}.scope", ID, "docker")),
    (v1(f"/docker/{ID}"), Placement(f"/docker/{ID}", None, ID, "docker")),
    (v2(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
        f"cri-containerd-{ID}.scope"),
     Placement(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
               f"cri-containerd-{ID}.scope", f"cri-containerd-{ID}.scope", ID, "containerd", UID)),
    (v1(f"/kubepods/besteffort/pod{UID}/{ID}"),
     Placement(f"/kubepods/besteffort/pod{UID}/{ID}", None, ID, None, UID)),
    (v2(f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{ID}.scope"),
     Placement(f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{ID}.scope", f"crio-{ID}.scope",
               ID, "cri-o", UID)),
    (v2(f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"),
     Placement(f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope", f"libpod-{ID}.scope",
               ID, "podman")),
    (v1(f"/machine.slice/libpod-{ID}.scope/container", systemd=f"/machine.slice/libpod-{ID}.scope/container"),
     Placement(f"/machine.slice/libpod-{ID}.scope/container", f"libpod-{ID}.scope", ID, "podman")),
    (v2("/system.slice/haproxy.service"), Placement("/system.slice/haproxy.service", "haproxy.service")),
    (v1("/", systemd="/system.slice/nginx.service"), Placement("/system.slice/nginx.service", "nginx.service")),
    (v2("/"), Placement("/")),
    ([], Placement()),
])
def test_placement_from_cgroup_paths(lines: list[tuple[str, str, str]], expected: Placement) -> None:
    assert placement(lines) == expected


def test_a_conmon_or_a_short_hex_name_is_no_container() -> None:
    assert placement(v2(f"/machine.slice/libpod-conmon-{ID}.scope")).container_id is None
    assert placement(v2("/system.slice/deadbeef.service")).container_id is None
