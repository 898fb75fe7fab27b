"""The head's follower: how long it may watch the store before it must look at the nodes'
heartbeats itself (a pure function of the state it holds and the time), and a state larger
than one frame of the store, read in parts."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Callable

import pytest

from clusterbook.rendezvous.api import RendezvousSettings
from clusterbook.rendezvous.backends.tcp import TcpBackend
from clusterbook.rendezvous.head import RendezvousHead, watch_wait
from clusterbook.rendezvous.registry import parse_join_url
from clusterbook.rendezvous.state import RendezvousState
from clusterbook.rendezvous.step import WAKE_SLACK, Operation, Step

NOW = 1_700_000_000.0
S = RendezvousSettings("run", 1, 3, keep_alive_interval=1.0, keep_alive_max_attempt=3)


def beats(**ages: float) -> RendezvousState:
    return RendezvousState(last_heartbeats={node: NOW - age for node, age in ages.items()})


def test_the_follower_wakes_when_the_oldest_heartbeat_expires() -> None:
    # Node b stopped 2.6 s ago: dead 0.4 s from now, whether or not anything else is written.
    assert watch_wait(beats(a=0.1, b=2.6), S, NOW) == pytest.approx(0.4 + WAKE_SLACK)


def test_the_follower_watches_a_second_at_most() -> None:
    assert watch_wait(beats(a=0.1), S, NOW) == 1.0
    assert watch_wait(RendezvousState(), S, NOW) == 1.0  # no node yet


def test_an_overdue_node_the_head_cannot_drop_costs_no_spin() -> None:
    # (a corrupt state in the store: the follower keeps the last good one, already overdue)
    assert watch_wait(beats(a=10.0), S, NOW) == 0.05


def test_the_head_follows_a_state_larger_than_a_frame() -> None:
    """Nodes whose reports make the state larger than one frame of the store: the head reads it
    in parts, and sees every node and its report."""
    settings = RendezvousSettings("big", 3, 3, keep_alive_interval=60.0)
    head = RendezvousHead(settings)
    seen = threading.Event()
    head.start(f"big-{os.getpid()}", seen.set)
    nodes: list[TcpBackend] = []
    try:
        assert head.join_url is not None
        assert head.secret is not None
        store_url, joined = parse_join_url(head.join_url)
        pad = "u" * (7 << 20)  # three of these: a state of 21 MB
        for name in ("n1", "n2", "n3"):
            node = TcpBackend(store_url, head.secret, node=name, timeout=30.0)
            nodes.append(node)
            now = time.time()
            step = Step((Operation.JOIN,), name, joined, now, now + 60.0, {"user": pad}, 0.0)
            node.update(step)
        deadline = time.monotonic() + 30.0
        while len(head.participants()) < 3 and time.monotonic() < deadline:
            seen.wait(0.5)
            seen.clear()
        assert sorted(name for name, _ in head.participants()) == ["n1", "n2", "n3"]
        assert all(report.user == pad for _, report in head.participants())
        assert head.problem() is None
    finally:
        for node in nodes:
            node.close()
        head.close()


def started(
    settings: RendezvousSettings,
) -> tuple[RendezvousHead, Callable[[Callable[[], bool]], None]]:
    """A started head of ``settings``, and a wait (30 s at most) until a check holds, checked
    again at each change the head sees."""
    head = RendezvousHead(settings)
    seen = threading.Event()
    head.start(f"{settings.run_id}-{os.getpid()}", seen.set)

    def until(check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 30.0
        while not check() and time.monotonic() < deadline:
            seen.wait(0.5)
            seen.clear()
        assert check()

    return head, until


def test_the_head_follows_each_nodes_report_as_it_changes() -> None:
    """The head reads the reports written since the state it read last, and keeps the others."""
    head, until = started(RendezvousSettings("reports", 2, 2, keep_alive_interval=0.2))
    nodes: list[TcpBackend] = []
    try:
        assert head.join_url is not None
        assert head.secret is not None
        store_url, joined = parse_join_url(head.join_url)
        for name in ("n1", "n2"):
            node = TcpBackend(store_url, head.secret, node=name, timeout=30.0)
            nodes.append(node)
            now = time.time()
            node.update(Step((Operation.JOIN,), name, joined, now, now + 60.0, {"user": name}))
        until(lambda: len(head.participants()) == 2)
        time.sleep(0.3)  # n1's heartbeat falls due
        now = time.time()
        beat = Step((Operation.KEEP_ALIVE,), "n1", joined, now, now + 5.0, {"user": "again"})
        nodes[0].update(beat)
        until(lambda: head.reports()["n1"].user == "again")
        assert head.reports()["n2"].user == "n2"
    finally:
        for node in nodes:
            node.close()
        head.close()


def test_the_head_counts_every_loss_of_a_node_also_once_it_is_back() -> None:
    """A node whose connection breaks is lost, each time: a look at the count that comes only
    after it joined again (a loaded machine's) still sees every drop."""
    head, until = started(RendezvousSettings("losses", 1, 2, keep_alive_interval=60.0))
    nodes: list[TcpBackend] = []

    def present() -> bool:
        return any(s.name == "n1" and s.state not in ("lost", "left") for s in head.node_statuses())

    try:
        assert head.join_url is not None
        assert head.secret is not None
        store_url, joined = parse_join_url(head.join_url)
        for times in (1, 2, 3):
            node = TcpBackend(store_url, head.secret, node="n1", timeout=30.0)
            nodes.append(node)
            now = time.time()
            node.update(Step((Operation.JOIN,), "n1", joined, now, now + 60.0, {"user": "n1"}))
            until(present)
            assert head.losses() == ({"n1": times - 1} if times > 1 else {})
            if times < 3:
                node._chan.sock.shutdown(socket.SHUT_RDWR)  # no goodbye: a dying agent
                until(lambda: not present())
        assert head.losses() == {"n1": 2}  # back, and both drops counted
    finally:
        for node in nodes:
            node.close()
        head.close()


def test_a_wait_for_the_heads_next_state_ends_when_a_node_joins() -> None:
    """What a Slurm cluster's wait_ready() waits on while the nodes of an allocation it
    added are still to join: the head's next observed state, not a poll's next turn."""
    head, _ = started(RendezvousSettings("observed", 1, 2, keep_alive_interval=60.0))
    node = None
    try:
        assert head.join_url is not None
        assert head.secret is not None
        seen = head.wait_observed(-1, 0.0)  # at once: what was seen so far
        assert head.wait_observed(seen, 0.2) == seen  # nothing changed: after the timeout
        ended: list[int] = []
        waiting = threading.Thread(target=lambda: ended.append(head.wait_observed(seen, 30.0)))
        waiting.start()
        store_url, joined = parse_join_url(head.join_url)
        node = TcpBackend(store_url, head.secret, node="n1", timeout=30.0)
        now = time.time()
        node.update(Step((Operation.JOIN,), "n1", joined, now, now + 60.0, {"user": "n1"}))
        waiting.join(30.0)
        assert len(ended) == 1
        assert ended[0] > seen
        assert "n1" in head.reports()
    finally:
        if node is not None:
            node.close()
        head.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("given", ["pinned", 0, None])
def test_the_agents_channel_is_on_the_port_given_any_free_one_or_none(given) -> None:
    from clusterbook.rendezvous.registry import channel_port

    wanted = _free_port() if given == "pinned" else given
    head = RendezvousHead(RendezvousSettings("ch", 1, 1), channel_port=wanted)
    head.start(f"ch-{os.getpid()}", lambda: None)
    try:
        assert head.join_url is not None
        said = channel_port(head.join_url)
        if wanted is None:  # no channel: the URL names none, so agents dial none
            assert head.channels is None
            assert said is None
            return
        assert head.channels is not None
        assert said == head.channels.port != 0
        if wanted:
            assert said == wanted
        with socket.create_connection(("127.0.0.1", said), timeout=5):
            pass  # it listens there
    finally:
        head.close()


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("29401", "channel_port must be a whole number: a port must be 0-65535"),
        (-1, "channel_port must be >= 0"),
        (70000, "channel_port must be at most 65535"),
        (29400, "channel_port=29400 is the rendezvous store's port too"),
    ],
)
def test_a_bad_channel_port_is_refused_before_anything_starts(given, said) -> None:
    import clusterbook as cb

    with pytest.raises(cb.ConfigError, match=said):
        cb.Cluster.elastic(1, 1, port=29400, channel_port=given)
    with pytest.raises(cb.ConfigError, match=said):
        cb.Cluster.slurm(1, port=29400, channel_port=given)


def test_a_closed_head_takes_its_directory_along_unless_something_else_is_in_it() -> None:
    settings = RendezvousSettings("gone", 1, 1)
    for kept in (None, "slurm-job.sh"):
        head = RendezvousHead(settings)
        head.start(f"gone-{os.getpid()}-{kept is None}", lambda: None)
        assert head.token_file is not None
        directory = head.token_file.parent
        try:
            if kept is not None:
                (directory / kept).write_text("#!/bin/sh\n")
            head.close()
            assert not head.token_file.exists()
            assert [p.name for p in directory.glob("*")] == ([kept] if kept else [])
            assert directory.exists() == (kept is not None)
        finally:
            head.close()
            shutil.rmtree(directory, ignore_errors=True)
