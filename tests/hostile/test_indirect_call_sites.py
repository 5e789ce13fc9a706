"""Call sites that differ only in the syscall wrapper's caller stay apart in `leaks`: two functions
reached through one indirect call, and the same function in many libraries called through one
function pointer. A libc wrapper makes no frame, so a frame-pointer walk never names its caller;
the site's identity in the kernel must hold it anyway, or every descriptor is charged to the
first caller seen."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.bpf.test_call_sites import Program, build_sites, leaks_json

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")]

#: Descriptors each function makes.
EACH = 40
#: Copies of one library, each loaded and called through the same function pointer.
LIBRARIES = 24

LIBRARY = """
#include <sys/socket.h>
void make_sockets(int n)
{
    for (int i = 0; i < n; i++)
        socket(AF_INET, SOCK_STREAM, 0);
}
"""


@pytest.fixture(scope="module")
def sites_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sites(tmp_path_factory.mktemp("indirect"))


def made_sites(data: dict) -> dict[str, int]:
    return {site["site"]: site["open"] for site in data["sites"] if site["site"] != "(from before tracing)"}


@pytest.mark.parametrize("call", ["socket", "open"])
@pytest.mark.parametrize("threads", ["single", "threaded"])
def test_two_functions_reached_through_one_indirect_call_are_two_sites(sites_binary: Path, call: str,
                                                                        threads: str) -> None:
    # open is cancellable: in a threaded process libc's wrapper saves registers and keeps locals
    # before the syscall, so its caller's return address lies words above the stack pointer
    program = Program([str(sites_binary), "indirect", str(EACH), call, threads])
    try:
        data = leaks_json(program, 2, ["done"])
    finally:
        program.finish()
    sites = made_sites(data)
    assert sorted(sites.values()) == [EACH, EACH], data["sites"]
    assert sorted(name.split("+")[0] for name in sites) == ["first_maker", "second_maker"], sites


def test_one_function_in_many_libraries_is_one_site_per_library(sites_binary: Path, tmp_path: Path) -> None:
    source = tmp_path / "maker.c"
    source.write_text(LIBRARY)
    built = tmp_path / "libmaker.so"
    subprocess.run(["gcc", "-O0", "-fno-omit-frame-pointer", "-shared", "-fPIC", "-o", str(built), str(source)],
                   check=True, capture_output=True, timeout=120)
    copies = []
    for index in range(LIBRARIES):
        copy = tmp_path / f"libmaker{index}.so"
        shutil.copy(built, copy)
        copies.append(str(copy))
    program = Program([str(sites_binary), "libraries", str(EACH), *copies])
    try:
        data = leaks_json(program, 2, ["done"])
    finally:
        program.finish()
    sites = made_sites(data)
    assert all(name.startswith("make_sockets+") for name in sites), sites
    assert sorted(name.rsplit("[", 1)[1].rstrip("]") for name in sites) == sorted(Path(c).name for c in copies)
    assert list(sites.values()) == [EACH] * LIBRARIES, data["sites"]
