"""The head's follower: how long it may watch the store before it must look at the nodes'
heartbeats itself (a pure function of the state it holds and the time)."""

from __future__ import annotations

import pytest

from clusterbook.rendezvous.api import RendezvousSettings
from clusterbook.rendezvous.head import watch_wait
from clusterbook.rendezvous.state import RendezvousState
from clusterbook.rendezvous.step import WAKE_SLACK

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
