"""What the head says of its nodes, from what it has seen (pure): their status rows and which
of them cannot be reached, with why."""

from __future__ import annotations

from clusterbook.rendezvous.api import RendezvousSettings
from clusterbook.rendezvous.node_status import node_statuses, unreachable
from clusterbook.rendezvous.report import NodeReport
from clusterbook.rendezvous.state import RendezvousState
from clusterbook.status import NodeStatus

NOW = 1_700_000_000.0
S = RendezvousSettings("run", 1, 4, keep_alive_interval=2.0, keep_alive_max_attempt=3)


def by_name(rows: list[NodeStatus]) -> dict[str, NodeStatus]:
    return {row.name: row for row in rows}


def test_each_node_seen_has_a_row_saying_where_it_stands() -> None:
    state = RendezvousState(
        round=3,
        complete=True,
        participants={"b": 1, "a": 0},
        wait_list=frozenset({"c"}),
        last_heartbeats={"a": NOW - 0.5, "b": NOW - 1.0, "c": NOW, "x": NOW + 1},
    )
    seen = {"a": NodeReport(hostname="host-a", slots=4, load=0.5, pid=7), "d": NodeReport()}
    rows = node_statuses(state, seen, {"d": "lost"}, NOW)
    assert [row.name for row in rows] == ["a", "b", "c", "d", "x"]  # seen, or in the state
    a, b, c, d, x = rows
    assert (a.state, a.round, a.host, a.slots, a.load, a.pid) == ("joined", 3, "host-a", 4, 0.5, 7)
    assert (a.heartbeat_age, b.heartbeat_age) == (0.5, 1.0)
    assert (b.state, b.host) == ("joined", "?")  # no report yet
    assert (c.state, c.round) == ("pending", None)  # on the wait list: in no round
    assert (d.state, d.heartbeat_age) == ("lost", None)  # gone, as the head recorded it
    assert (x.state, x.heartbeat_age) == ("left", 0.0)  # gone, nothing said: left; no clock skew


def test_the_members_of_a_round_still_filling_are_pending() -> None:
    state = RendezvousState(participants={"a": 0}, last_heartbeats={"a": NOW})
    assert by_name(node_statuses(state, {}, {}, NOW))["a"].state == "pending"


def test_unreachable_nodes_are_the_gone_and_the_silent_among_those_asked_for() -> None:
    rows = [
        NodeStatus("lost", "h1", 1, "lost"),
        NodeStatus("left", "h2", 1, "left"),
        NodeStatus("silent", "h3", 1, "joined", heartbeat_age=3.5),  # over 1.5 x 2 s
        NodeStatus("fine", "h4", 1, "joined", heartbeat_age=2.9),
        NodeStatus("other", "h5", 1, "lost"),
    ]
    found = unreachable(rows, ["lost", "left", "silent", "fine"], S)
    assert sorted(found) == ["left", "lost", "silent"]  # "other" was not asked for
    assert found["lost"] == (
        "Node lost (h1) was lost: no heartbeat within 2 s x 3, or its connection to the head broke"
    )
    assert found["left"].startswith("Node left (h2) left the cluster: ")
    assert found["silent"] == (
        "Node silent (h3) has not been heard from for 3.5 s: it may be cut off from the head"
    )
    assert sorted(unreachable(rows, ["lost", "silent"], S, lost_only=True)) == ["lost"]
