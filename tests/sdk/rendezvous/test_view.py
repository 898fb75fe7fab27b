"""A node's view of the rendezvous state: what it names, that its size does not grow with the
cluster, that it round-trips, and when it is too old to decide on."""

from __future__ import annotations

import pytest

from clusterbook.rendezvous.api import RendezvousSettings, RendezvousStateError
from clusterbook.rendezvous.ops import join_action, world_size
from clusterbook.rendezvous.state import RendezvousState, encode
from clusterbook.rendezvous.view import (
    NodeView,
    decode_answer,
    encode_view,
    fresh,
    view_of,
    views_of,
)

T0 = 1_700_000_000.0
S = RendezvousSettings("view", 2, 100_000, keep_alive_interval=1.0, keep_alive_max_attempt=3)
REPORT = {"hostname": "host-0", "addresses": ["10.0.0.1", "fd00::1"], "cores": 8}


def complete_round(nodes: int, *, waiting: int = 0) -> RendezvousState:
    names = [f"node-{i:06d}" for i in range(nodes)]
    return RendezvousState(
        round=7,
        complete=True,
        participants={name: rank for rank, name in enumerate(names)},
        wait_list=frozenset(f"late-{i:06d}" for i in range(waiting)),
        last_heartbeats={name: T0 + i / nodes for i, name in enumerate(names)},
        node_info={name: {**REPORT, "hostname": f"host-{i}"} for i, name in enumerate(names)},
        stop_jobs=("job-1",),
    )


def test_a_node_learns_its_place_and_where_rank_0_is() -> None:
    state = complete_round(5, waiting=2)
    view = view_of(state, "node-000003")
    assert (view.round, view.complete, view.rank, view.joined, view.waiting) == (7, True, 3, 5, 2)
    assert (view.leader, view.leader_host, view.leader_addresses) == (
        "node-000000",
        "host-0",
        ("10.0.0.1", "fd00::1"),
    )
    assert view.participants == {"node-000003": 3}  # it names only its own node
    assert view.beat == state.last_heartbeats["node-000003"]
    assert view.stop_jobs == ("job-1",)
    assert view.oldest() == state.oldest()
    assert world_size(view) == world_size(state) == 5
    late = view_of(state, "late-000001")
    assert (late.rank, late.listed, late.wait_list) == (None, True, frozenset({"late-000001"}))


def test_decisions_on_a_view_are_those_on_the_state() -> None:
    for state in (
        complete_round(3),
        RendezvousState(participants={"a": 0}, last_heartbeats={"a": T0}),
        RendezvousState(participants={"a": 0, "b": 0}, deadline=T0 - 1, last_heartbeats={}),
    ):
        for node in ("a", "node-000001", "newcomer"):
            for now in (T0, T0 + 2.0):
                assert join_action(view_of(state, node), node, S, now, T0 + 60) == join_action(
                    state, node, S, now, T0 + 60
                )


def test_an_answer_does_not_grow_with_the_cluster() -> None:
    sizes = {n: len(encode_view(view_of(complete_round(n), "node-000001"))) for n in (10, 10_000)}
    assert sizes[10_000] - sizes[10] <= 16, sizes  # digits of the counts and times, no more
    assert sizes[10_000] <= 1_000
    assert len(encode(complete_round(10_000))) > 100 * sizes[10_000]


def test_a_view_round_trips_and_is_told_apart_from_a_state() -> None:
    state = complete_round(4, waiting=1)
    view = view_of(state, "node-000002")
    assert decode_answer(encode_view(view)) == view
    assert decode_answer(encode(state)) == state
    assert decode_answer(encode_view(NodeView("n"))) == NodeView("n")


@pytest.mark.parametrize(
    "blob",
    [b"{not json", b'{"view":2,"node":"n"}', b'{"view":1}', b'{"view":1,"node":3}', b"[]"],
)
def test_a_corrupt_answer_is_a_state_error(blob: bytes) -> None:
    with pytest.raises(RendezvousStateError):
        decode_answer(blob)


def test_a_view_in_which_a_node_expired_is_not_decided_on() -> None:
    state = complete_round(3)
    view = view_of(state, "node-000001")
    assert fresh(view, S, T0 + S.dead_after) is view
    assert fresh(view, S, T0 + S.dead_after + 0.01) is None  # node-000000 expired: ask again
    dropped = fresh(state, S, T0 + S.dead_after + 0.5)  # a state drops it itself
    assert dropped is not None
    assert dropped.joined == 1


def test_the_views_a_store_encodes_per_state_are_each_nodes_own() -> None:
    state = complete_round(6, waiting=2)
    encode = views_of(state)
    for node in ("node-000000", "node-000005", "late-000001", "stranger", 'quo"te\u00e9'):
        assert encode(node) == encode_view(view_of(state, node))
        assert decode_answer(encode(node)) == view_of(state, node)
