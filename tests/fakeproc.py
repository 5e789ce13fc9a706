"""Fake procfs and sysfs trees for the unit tests of the sampler and the doctor (psutil's way:
the code under test reads a root it is given)."""

from __future__ import annotations

import os
from pathlib import Path

LIMITS = ("Limit                     Soft Limit           Hard Limit           Units     \n"
          "Max processes             {nproc:<21}{nproc:<21}processes \n"
          "Max open files            {soft:<21}{hard:<21}files     \n"
          "Max nice priority         0                    0                    \n")


def fake_process(root: Path, pid: int, comm: str, fds: int | dict[int, str], soft: str = "64", hard: str = "4096",
                 *, threads: int = 1, uid: int = 1000, nproc: str = "4096", cmdline: str = "", cgroup: str = "0::/",
                 exe: bytes | None = None, fd_table: int = 64, start_ticks: int = 100, ppid: int = 1) -> None:
    """/proc/PID of a process: ``fds`` is a count of /dev/null descriptors or {fd: link target};
    ``cmdline`` is split on spaces; ``exe`` the bytes its executable link points to, if any."""
    base = root / str(pid)
    (base / "fd").mkdir(parents=True)
    targets = dict.fromkeys(range(fds), "/dev/null") if isinstance(fds, int) else fds
    for fd, target in targets.items():
        os.symlink(target, base / "fd" / str(fd))
    stat = ["S"] + ["0"] * 18 + [str(start_ticks)] + ["0"] * 10
    (base / "stat").write_text(f"{pid} ({comm}) " + " ".join(stat) + "\n")
    (base / "limits").write_text(LIMITS.format(soft=soft, hard=hard, nproc=nproc))
    (base / "status").write_text(f"Name:\t{comm}\nPPid:\t{ppid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                                 f"FDSize:\t{fd_table}\nThreads:\t{threads}\nCpus_allowed_list:\t0-1\n")
    (base / "cmdline").write_text(cmdline.replace(" ", "\0"))
    (base / "cgroup").write_text(cgroup.rstrip("\n") + "\n")
    if exe is not None:
        (base / "exe.bin").write_bytes(exe)
        (base / "exe").symlink_to(base / "exe.bin")


def write_files(root: Path, files: dict[str, str]) -> None:
    """Files under ``root`` by relative path, with their folders."""
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
