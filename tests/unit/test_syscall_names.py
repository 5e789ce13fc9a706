"""Syscall names from the kernel's user-space headers (``kernel.syscalls``): bcc's names where bcc
knows them, the newer ones too, without importing bcc; a header another user could have planted
or changed is not read."""

from __future__ import annotations

import os
import platform
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdtrace.kernel import syscalls


@pytest.fixture(autouse=True)
def _fresh_tables() -> Iterator[None]:
    syscalls.syscall_numbers.cache_clear()
    syscalls.syscall_name.cache_clear()
    yield
    syscalls.syscall_numbers.cache_clear()
    syscalls.syscall_name.cache_clear()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the numbers asserted are x86-64's")
def test_the_names_are_bccs_and_newer_ones_too() -> None:
    bcc_syscall = pytest.importorskip("bcc.syscall")
    known = {n: bcc_syscall.syscall_name(n).decode() for n in range(512)}
    known = {n: name for n, name in known.items() if not name.startswith("[unknown")}
    assert len(known) > 300
    assert {n: syscalls.syscall_name(n) for n in known} == known
    assert (syscalls.syscall_name(202), syscalls.syscall_name(441), syscalls.syscall_name(9999)) == (
        "futex", "epoll_pwait2", "syscall_9999")


@pytest.mark.skipif(os.geteuid() != 0, reason="makes files owned by another user")
def test_a_header_another_user_could_write_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planted, writable, good = tmp_path / "planted.h", tmp_path / "writable.h", tmp_path / "good.h"
    for header in (planted, writable, good):
        header.write_text("#define __NR_read 0\n#define __NR_futex 202\n")
        header.chmod(0o644)
    os.chown(planted, pwd.getpwnam("nobody").pw_uid, -1)
    writable.chmod(0o666)
    monkeypatch.setitem(syscalls._HEADERS, platform.machine(), (str(planted), str(writable), str(tmp_path / "none.h")))
    assert syscalls.syscall_name(202) == "syscall_202"
    syscalls.syscall_numbers.cache_clear()
    syscalls.syscall_name.cache_clear()
    monkeypatch.setitem(syscalls._HEADERS, platform.machine(), (str(planted), str(good)))
    assert syscalls.syscall_name(202) == "futex" and syscalls.syscall_numbers() == {0: "read", 202: "futex"}
