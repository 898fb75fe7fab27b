"""``cluster.map``'s bad input is named before any rank starts: no pool job is made."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import clusterbook as cb
from clusterbook.errors import ConfigError
from clusterbook.testing import FakeProvider


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"np": 0}, "np must be a whole number of ranks of at least 1, got 0"),
        ({"np": "2"}, "got '2'"),
        ({"max_running": 0}, "max_running must be a whole number of at least 1"),
        ({"max_running": True}, "got True"),
        ({"retries": -1}, "retries must be a whole number of at least 0"),
        ({"ordered": "yes"}, "ordered must be True or False, got 'yes'"),
        ({"progress": "loud"}, "progress"),
    ],
)
def test_bad_options_are_named(kw: dict[str, Any], named: str) -> None:
    cluster = cb.Cluster(FakeProvider(nodes=1))
    with pytest.raises(ConfigError, match=None) as raised:
        cluster.map(abs, [1], **kw)
    assert named in str(raised.value)
    assert cluster.jobs == []


def test_a_function_that_cannot_be_pickled_is_named() -> None:
    lock = threading.Lock()

    def holds_a_lock(x: int) -> int:
        with lock:
            return x

    cluster = cb.Cluster(FakeProvider(nodes=1))
    with pytest.raises(ConfigError) as raised:
        cluster.map(holds_a_lock, [1])
    assert "holds_a_lock" in str(raised.value)
    assert "cannot be pickled" in str(raised.value)
    assert cluster.jobs == []


def test_a_function_is_required() -> None:
    with pytest.raises(ConfigError, match="takes a function first, got 3"):
        cb.Cluster(FakeProvider(nodes=1)).map(3, [1])  # type: ignore[arg-type]


def test_an_empty_sweep_starts_nothing() -> None:
    cluster = cb.Cluster(FakeProvider(nodes=1))  # not even started: no pool is needed
    result = cluster.map(abs, [], progress=False)
    assert len(result) == 0
    assert result.ok
    assert cluster.jobs == []


def test_more_at_once_than_slots_is_named() -> None:
    with cb.Cluster(FakeProvider(nodes=1)) as cluster:
        slots = sum(n.slots for n in cluster.nodes)
        with pytest.raises(ConfigError, match=f"max_running={slots + 1} is more than the clu"):
            cluster.map(abs, [1], max_running=slots + 1)
        assert cluster.jobs == []


def test_a_node_this_machine_has_no_route_to_is_named() -> None:
    from clusterbook.errors import PoolError
    from clusterbook.functions.pool import head_addresses
    from clusterbook.spec import NodeSpec

    assert head_addresses([NodeSpec("a", "localhost", 1)]) == ["127.0.0.1"]
    with pytest.raises(PoolError, match=r"node far at 'no-such-host\.invalid'"):
        head_addresses([NodeSpec("far", "no-such-host.invalid", 1)])


def test_a_ranks_connection_is_probed_so_a_silent_node_ends_the_wait() -> None:
    import socket

    from clusterbook.functions.pool import keep_alive

    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as sock,
    ):
        keep_alive(sock, 7, 2, 4)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        names = ("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT")
        assert [sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, n)) for n in names] == [7, 2, 4]
