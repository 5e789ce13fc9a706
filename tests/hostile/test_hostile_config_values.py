"""Values from a program's own configuration, range-checked before any arithmetic (issue 37, M):
a haproxy of nobody's whose configuration says maxconn -150130569, ulimit-n of 22 digits,
nbthread 100000 or bind lines naming millions of ports. Before, doctor computed advice from them
("sysctl -w fs.nr_open=2399...552", "set maxconn -150130569"); now each is named as outside what
HAProxy runs with and not used, and no advice holds a number made from it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from fdtrace.integrations.haproxy import info_number
from tests.hostile.test_hostile_haproxy_files import NOBODY, config_findings, doctor_of_nobodys_haproxy, folder

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts processes as another user: needs root")

__all__ = ["folder"]  # the fixture, shared

HUGE = "2399999999999999999552"


def nobodys_config(folder: Path, text: str) -> tuple[Path, list[str], str]:
    """doctor's haproxy-config findings and its whole JSON for nobody's haproxy with this configuration."""
    own = folder / "own.cfg"
    own.write_text(text)
    os.chown(own, NOBODY.pw_uid, NOBODY.pw_gid)
    as_json, table = doctor_of_nobodys_haproxy(folder, "-f", str(own))
    return own, config_findings(as_json), as_json + table


def no_absurd_advice(said: str) -> None:
    assert "fs.nr_open=" not in said
    assert not re.search(r"maxconn (<= )?-\d", said), said
    assert "150130569" not in said and HUGE not in said and HUGE[:12] not in said
    for check in json.loads(said[: said.rindex("}") + 1])["checks"]:
        for number in re.findall(r"\d[\d,]*", check["recommended"] + " " + check["change"]):
            assert int(number.replace(",", "")) < 1 << 31, check


def test_a_negative_maxconn_is_named_and_not_used(folder: Path) -> None:
    own, found, said = nobodys_config(folder, "global\n    maxconn -150130569\n")
    assert found == [f"{own}: maxconn is outside 1 to 536,870,896, no value HAProxy runs with: not used"]
    no_absurd_advice(said)


def test_huge_limits_are_named_and_not_used(folder: Path) -> None:
    own, found, said = nobodys_config(folder, f"global\n    maxconn {1 << 40}\n    ulimit-n {HUGE}\n"
                                              "    nbthread 100000\n")
    assert found == [f"{own}: maxconn is outside 1 to 536,870,896, no value HAProxy runs with: not used",
                     f"{own}: ulimit-n is outside 1 to 2,147,483,584, no value HAProxy runs with: not used",
                     f"{own}: nbthread is outside 1 to 4,096, no value HAProxy runs with: not used"]
    no_absurd_advice(said)


def test_millions_of_listeners_are_named_and_give_no_negative_maxconn(folder: Path) -> None:
    binds = "".join(f"    bind 127.0.0.{i}:1-65535\n" for i in range(1, 21))  # 1,310,700 ports
    own, found, said = nobodys_config(folder, f"global\n    maxconn 100\nfrontend f\n{binds}")
    assert found[-1] == (f"{own}: its bind lines name more than 1,048,576 listening sockets, no configuration HAProxy "
                         "runs with: not counted")
    no_absurd_advice(said)


def test_show_info_numbers_outside_what_haproxy_says_are_not_used() -> None:
    info = {"Maxconn": "4096", "Ulimit-n": HUGE, "Maxsock": "0", "CurrConns": "12"}
    assert [info_number(info, name) for name in ("Maxconn", "Ulimit-n", "Maxsock", "CurrConns")] == [4096, None,
                                                                                                     None, 12]
