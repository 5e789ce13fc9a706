"""Where a process runs: its cgroup, systemd unit, container and Kubernetes pod, from the paths
of /proc/PID/cgroup (cgroup v2's one line, or v1's one line per hierarchy), and the processes of
the cgroups that match a name (`--cgroup`, `--unit`, `--container`).

Container runtimes name their cgroups by the container's id: with systemd's cgroup driver
``docker-ID.scope``, ``cri-containerd-ID.scope``, ``crio-ID.scope`` and ``libpod-ID.scope``; with
the cgroupfs driver a directory named by the bare id (``/docker/ID``, ``/kubepods/burstable/
podUID/ID``). A pod is ``kubepods-...-podUID.slice`` (the UID's dashes written as underscores)
or ``/kubepods/.../podUID``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_RUNTIME_SCOPE = re.compile(r"^(docker|cri-containerd|crio|libpod)-([0-9a-f]{64})\.scope$")
_BARE_ID = re.compile(r"^[0-9a-f]{64}$")
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$")
RUNTIMES = {"docker": "docker", "cri-containerd": "containerd", "crio": "cri-o", "libpod": "podman"}
#: The cgroup trees walked to find the cgroups of a name, at most this deep and this many folders.
MAX_DEPTH, MAX_FOLDERS = 12, 100_000


@dataclass(frozen=True)
class Placement:
    """A process's cgroup (v2's path, else v1's systemd or pids hierarchy's), its systemd unit
    (the innermost ``.service`` or ``.scope``), its container's id and runtime, its pod's UID."""

    cgroup: str | None = None
    unit: str | None = None
    container_id: str | None = None
    runtime: str | None = None
    pod_uid: str | None = None


def placement(lines: list[tuple[str, str, str]]) -> Placement:
    """A process's placement from its /proc/PID/cgroup lines (hierarchy, controllers, path)."""
    by_controller = {controllers: path for _, controllers, path in lines}
    chosen = None
    for key in ("", "name=systemd", "pids", "memory"):  # v2, then v1's most telling hierarchies
        path = by_controller.get(key)
        if path and path != "/":
            chosen = path
            break
    if chosen is None:
        chosen = next((path for _, _, path in lines if path and path != "/"), None)
    if chosen is None:
        return Placement(cgroup="/" if lines else None)
    container_id = runtime = pod_uid = unit = None
    for _, _, path in lines:
        for part in path.split("/"):
            scope = _RUNTIME_SCOPE.match(part)
            if scope:
                container_id, runtime = scope[2], RUNTIMES[scope[1]]
            elif container_id is None and _BARE_ID.match(part):
                container_id = part
                runtime = next((name for marker, name in (("docker", "docker"), ("libpod", "podman"),
                                                          ("crio", "cri-o"), ("containerd", "containerd"))
                                if marker in path), None)
            pod = _POD.search(part)
            if pod:
                pod_uid = pod[1].replace("_", "-")
    for part in reversed(chosen.split("/")):
        if part.endswith((".service", ".scope")):
            unit = part
            break
    return Placement(cgroup=chosen, unit=unit, container_id=container_id, runtime=runtime, pod_uid=pod_uid)


def _mounts(cgroupfs: Path) -> list[Path]:
    """The cgroup trees under ``cgroupfs``: the v2 tree itself, its ``unified`` part of a hybrid
    set-up, and each v1 hierarchy."""
    if (cgroupfs / "cgroup.procs").exists():
        return [cgroupfs]
    try:
        return [cgroupfs / name for name in sorted(os.listdir(cgroupfs))
                if (cgroupfs / name / "cgroup.procs").exists() and not (cgroupfs / name).is_symlink()]
    except OSError:
        return []


def matching_pids(cgroupfs: Path, cgroup: str | None = None, unit: str | None = None,
                  container: str | None = None) -> tuple[set[int], list[str]]:
    """The processes now in the cgroups that match (and in the cgroups below them), and those
    cgroups' paths: ``cgroup`` a path from the root of a tree (``/system.slice/nginx.service``),
    ``unit`` a systemd unit's name (``nginx`` or ``nginx.service``), ``container`` a container's
    id or its first 12 characters or more. Walks each tree without following links, at most
    MAX_DEPTH deep and MAX_FOLDERS folders."""
    wanted_unit = None if unit is None else (unit if unit.endswith((".service", ".scope")) else f"{unit}.service")
    prefix = None if container is None else container.lower()
    pids: set[int] = set()
    found: list[str] = []
    folders = 0
    for tree in _mounts(cgroupfs):
        stack = [(tree, 0)]
        while stack and folders < MAX_FOLDERS:
            folder, depth = stack.pop()
            folders += 1
            relative = "/" + str(folder.relative_to(tree)).lstrip(".")
            relative = "/" if relative in ("/", "/.") else relative.rstrip("/")
            name = folder.name
            scope = _RUNTIME_SCOPE.match(name)
            ident = scope[2] if scope else name if _BARE_ID.match(name) else None
            hit = ((cgroup is not None and relative == "/" + cgroup.strip("/"))
                   or (wanted_unit is not None and name == wanted_unit)
                   or (prefix is not None and ident is not None and len(prefix) >= 12 and ident.startswith(prefix)))
            if hit:
                found.append(f"{tree.name or tree}:{relative}")
                pids |= _procs_below(folder, depth)
                continue
            stack += _subfolders(folder, depth)
    return pids, found


def _procs_below(folder: Path, depth: int) -> set[int]:
    """The pids in ``folder``'s cgroup and every cgroup below it."""
    pids: set[int] = set()
    stack = [(folder, depth)]
    while stack:
        current, level = stack.pop()
        try:
            text = (current / "cgroup.procs").read_text()
        except OSError:
            continue
        pids |= {int(line) for line in text.split() if line.isdigit()}
        stack += _subfolders(current, level)
    return pids


def _subfolders(folder: Path, depth: int) -> list[tuple[Path, int]]:
    """The folders in ``folder`` (links not followed), one level deeper; none past MAX_DEPTH."""
    if depth >= MAX_DEPTH:
        return []
    try:
        with os.scandir(folder) as entries:
            return [(Path(e.path), depth + 1) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
