"""The advice layer's models against the programs' own arithmetic: HAProxy 2.6's Maxsock as the
Debian haproxy 2.6.12 reported it (`show info`'s Maxsock, or "Cannot raise FD limit to N" under
strict-limits) for several maxconn, nbthread, listener, stats socket, checked server counts and
splicing; nginx's connection slots as nginx 1.22.1 failed at them; and the rules that a limit is
never advised lower and a pair is one HAProxy accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from fdtrace.advice.change import AT_START, LimitPlace, fd_limit_change, near_limit, raised
from fdtrace.advice.haproxy import HaproxyShape, ModelError, accepts
from fdtrace.advice.nginx import NginxShape
from fdtrace.integrations.haproxy import parse_config_texts, shape_of

#: (maxconn, nbthread, binds, stats sockets, checked servers, splice) -> Maxsock, read from the
#: real haproxy 2.6.12 of this machine (2 CPUs: nbthread unset runs 2 threads).
MEASURED = [
    ((4096, 2, 1, 1, 0, False), 8220),   # the incident's haproxy (and with nbthread unset)
    ((1000, 1, 1, 0, 0, False), 2014),   # no stats socket: no CLI frontend
    ((1000, 4, 3, 1, 0, False), 2036),
    ((1000, 1, 1, 2, 0, False), 2026),   # two stats sockets: two listeners, one CLI frontend
    ((1000, 1, 1, 1, 3, False), 2028),   # three checked servers
    ((100, 1, 1, 0, 2, False), 216),
    ((7680, 2, 1, 1, 0, False), 15388),  # the pair rehearse used to advise with 15376
    ((5, 1, 1, 1, 0, False), 35),
    ((1000, 3, 2, 1, 2, False), 2034),   # show info: Maxsock 2034
    ((300, 1, 4, 2, 0, False), 629),     # show info: Maxsock 629
    ((1000, 1, 1, 0, 0, True), 2514),    # option splice-auto: 250 pipes
]


@pytest.mark.parametrize(("figures", "maxsock"), MEASURED)
def test_maxsock_is_haproxy_s_own(figures: tuple[int, int, int, int, int, bool], maxsock: int) -> None:
    maxconn, nbthread, binds, stats, checks, splice = figures
    shape = HaproxyShape(nbthread=nbthread, binds=binds, stats_sockets=stats, checks=checks, splice=splice)
    assert shape.maxsock(maxconn) == maxsock
    assert shape.maxsock_sum(maxconn).endswith(f"= {maxsock}")
    # the largest maxconn that fits a limit of exactly that Maxsock is that maxconn
    assert shape.maxconn_for(maxsock) == maxconn and shape.maxconn_for(maxsock - 1) == maxconn - 1


def test_a_configuration_gives_the_shape(tmp_path: Path) -> None:
    text = ("global\n    maxconn 1000\n    nbthread 3\n    stats socket /run/a.sock\n    stats maxconn 4\n"
            "defaults\n    mode tcp\n    option splice-auto\n"
            "frontend fe\n    bind 127.0.0.1:80,127.0.0.1:81\n    default_backend be\n"
            "backend be\n    server a 127.0.0.1:1 check inter 60s\n    server b 127.0.0.1:2 check\n"
            "    server c 127.0.0.1:3\n")
    config = parse_config_texts(tmp_path / "h.cfg", [(tmp_path / "h.cfg", text)])
    assert (config.checks, config.stats_maxconn, config.splice, config.listeners) == (2, 4, True, 2)
    shape = shape_of(config, 3)
    assert shape.maxsock(1000) == 10 + 3 + 4 + 2 + 2000 + 2 * 250 + 9


def test_the_pair_starts_under_strict_limits() -> None:
    shape = HaproxyShape(nbthread=2, binds=1, stats_sockets=1)
    maxconn, limit = shape.pair(6400, fd_need=13 + 12800)
    assert maxconn == 7680 and accepts(maxconn, limit, shape)
    assert limit == 18466  # Maxsock 15388 with the margin: the measured 12813 is below it
    assert not accepts(7680, 15376, shape)  # what rehearse used to advise: HAProxy refused it


@pytest.mark.parametrize("bad", [0, -1, 1 << 40, True])
def test_absurd_values_are_refused_not_used(bad: int) -> None:
    with pytest.raises(ModelError):
        HaproxyShape().maxsock(bad)
    with pytest.raises(ModelError):
        HaproxyShape(nbthread=bad)
    with pytest.raises(ModelError):
        NginxShape("/etc/nginx/nginx.conf", worker_connections=bad)


def test_nginx_worker_connections() -> None:
    shape = NginxShape("/etc/nginx/nginx.conf", worker_connections=64, listeners=1)
    assert shape.proxied_per_worker() == 31  # nginx 1.22.1 reset the 32nd
    change = shape.connections_change(100)
    assert change is not None and change.value == 242 and change.resource == "worker_connections"
    assert change.command == "set worker_connections 242; in the events block of /etc/nginx/nginx.conf"
    assert NginxShape("/n.conf", worker_connections=4096).connections_change(100) is None  # never lower
    fd = NginxShape("/n.conf", worker_connections=4096).fd_change(1613, "measured", 256, 256)
    assert fd is not None and fd.value == 1936 and "worker_rlimit_nofile 1936;" in fd.command
    assert "hard limit" in fd.command


def test_a_limit_is_never_advised_lower() -> None:
    assert raised(11, 256) is None and raised(0, 256) is None
    assert raised(214, 256) == 257 and raised(300, None) == 360
    assert fd_limit_change(3210, "x", 20000, 20000) is None  # nginx's master: 0 per connection
    change = fd_limit_change(8220, "Maxsock", 256, 256, LimitPlace("haproxy", "/h.cfg"))
    assert change is not None and change.value == 9864 and change.where == "ulimit-n in the global section of /h.cfg"
    assert AT_START.command(9864, 9864).startswith("raise it where the process is started (ulimit -n 9864")


def test_one_near_the_limit_rule() -> None:
    assert near_limit(80, 100) and not near_limit(79, 100) and not near_limit(5, None) and not near_limit(5, 0)
