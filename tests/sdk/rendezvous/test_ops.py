"""Rendezvous decisions and mutations, case by case (pure functions: no clock, no store)."""

from __future__ import annotations

import math

import pytest

from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.ops import (
    MUTATING_ACTIONS,
    ROLLBACK_PERIOD,
    Action,
    apply,
    close_action,
    exit_action,
    expired_nodes,
    join_action,
    keep_alive_action,
    next_expiry,
    next_wakeup,
    rank_of,
    remove_node,
    sanitize,
    world_size,
)
from clusterbook.rendezvous.state import RendezvousState

NOW = 1_700_000_000.0
FAR = NOW + 1_000.0  # an operation deadline far away
LAST_CALL = 5.0
INTERVAL = 1.0
ATTEMPTS = 3
DEAD_AFTER = INTERVAL * ATTEMPTS

S = RendezvousSettings(
    "run",
    min_nodes=2,
    max_nodes=3,
    timeout=RendezvousTimeout(join=60.0, last_call=LAST_CALL, close=10.0, heartbeat=1.0),
    keep_alive_interval=INTERVAL,
    keep_alive_max_attempt=ATTEMPTS,
)


def state(
    participants=(),
    wait=(),
    *,
    complete=False,
    closed=False,
    deadline=None,
    round=0,
    beats=None,
) -> RendezvousState:
    """A state whose members all heartbeat at NOW unless ``beats`` says otherwise."""
    parts = dict(participants) if isinstance(participants, dict) else dict.fromkeys(participants, 0)
    heartbeats = dict.fromkeys([*parts, *wait], NOW)
    heartbeats.update(beats or {})
    return RendezvousState(
        round=round,
        complete=complete,
        deadline=deadline,
        closed=closed,
        participants=parts,
        wait_list=frozenset(wait),
        last_heartbeats=heartbeats,
    )


COMPLETE_AB = {"a": 0, "b": 1}
COMPLETE_ABC = {"a": 0, "b": 1, "c": 2}


# --- join --------------------------------------------------------------------------------------

JOIN_CASES = [
    # (id, state, node, now, op deadline, expected)
    ("first node joins", state(), "a", NOW, FAR, Action.ADD_TO_PARTICIPANTS),
    ("newcomer joins incomplete", state(["a"]), "b", NOW, FAR, Action.ADD_TO_PARTICIPANTS),
    (
        "waiter joins once a new round starts",
        state(["a"], ["b"], round=1),
        "b",
        NOW,
        FAR,
        Action.ADD_TO_PARTICIPANTS,
    ),
    ("closed", state(["a"], closed=True), "b", NOW, FAR, Action.ERROR_CLOSED),
    (
        "closed wins over complete",
        state(COMPLETE_AB, complete=True, closed=True),
        "a",
        NOW,
        FAR,
        Action.ERROR_CLOSED,
    ),
    ("complete and participant", state(COMPLETE_AB, complete=True), "a", NOW, FAR, Action.FINISH),
    (
        "complete and participant even past the deadline",
        state(COMPLETE_AB, complete=True),
        "a",
        FAR + 1,
        FAR,
        Action.FINISH,
    ),
    (
        "complete and newcomer waits for the next round",
        state(COMPLETE_AB, complete=True),
        "c",
        NOW,
        FAR,
        Action.ADD_TO_WAIT_LIST,
    ),
    (
        "complete and full: newcomer still waits (no redundancy list)",
        state(COMPLETE_ABC, complete=True),
        "d",
        NOW,
        FAR,
        Action.ADD_TO_WAIT_LIST,
    ),
    (
        "already waiting",
        state(COMPLETE_AB, ["c"], complete=True),
        "c",
        NOW,
        FAR,
        Action.SYNC,
    ),
    (
        "waiting and heartbeat due",
        state(COMPLETE_AB, ["c"], complete=True, beats={"c": NOW - INTERVAL}),
        "c",
        NOW,
        FAR,
        Action.KEEP_ALIVE,
    ),
    ("alone below min waits", state(["a"]), "a", NOW, FAR, Action.SYNC),
    (
        "min reached, last call running",
        state(["a", "b"], deadline=NOW + 1),
        "a",
        NOW,
        FAR,
        Action.SYNC,
    ),
    (
        "last call ends exactly now: not yet",
        state(["a", "b"], deadline=NOW),
        "a",
        NOW,
        FAR,
        Action.SYNC,
    ),
    (
        "last call over",
        state(["a", "b"], deadline=NOW - 0.001),
        "b",
        NOW,
        FAR,
        Action.MARK_RENDEZVOUS_COMPLETE,
    ),
    (
        "participant heartbeat due",
        state(["a"], beats={"a": NOW - INTERVAL}),
        "a",
        NOW,
        FAR,
        Action.KEEP_ALIVE,
    ),
    (
        "participant heartbeat not yet due",
        state(["a"], beats={"a": NOW - INTERVAL + 0.01}),
        "a",
        NOW,
        FAR,
        Action.SYNC,
    ),
    (
        "incomplete but full (defensive): wait",
        state(["a", "b", "c"], deadline=NOW + 1),
        "d",
        NOW,
        FAR,
        Action.ADD_TO_WAIT_LIST,
    ),
    ("at the op deadline: not timed out", state(["a"]), "a", NOW, NOW, Action.SYNC),
    (
        "past the deadline: roll back from participants",
        state(["a"]),
        "a",
        NOW + 0.001,
        NOW,
        Action.REMOVE_FROM_PARTICIPANTS,
    ),
    (
        "past the deadline: roll back from the wait list",
        state(COMPLETE_AB, ["c"], complete=True),
        "c",
        NOW + 1,
        NOW,
        Action.REMOVE_FROM_WAIT_LIST,
    ),
    (
        "rollback period ends inclusive",
        state(["a"]),
        "a",
        NOW + ROLLBACK_PERIOD,
        NOW,
        Action.REMOVE_FROM_PARTICIPANTS,
    ),
    (
        "past the rollback period",
        state(["a"]),
        "a",
        NOW + ROLLBACK_PERIOD + 0.001,
        NOW,
        Action.ERROR_TIMEOUT,
    ),
    ("past the deadline and out", state(["b"]), "a", NOW + 1, NOW, Action.ERROR_TIMEOUT),
]


@pytest.mark.parametrize(
    ("st", "node", "now", "deadline", "expected"),
    [case[1:] for case in JOIN_CASES],
    ids=[case[0] for case in JOIN_CASES],
)
def test_join_action(st, node, now, deadline, expected) -> None:
    assert join_action(st, node, S, now, deadline) is expected


# --- exit, close, keep-alive ---------------------------------------------------------------------

OTHER_CASES = [
    ("exit participant", exit_action, state(["a", "b"]), "a", NOW, FAR, "REMOVE_FROM_PARTICIPANTS"),
    ("exit late", exit_action, state(["a"]), "a", NOW + 1, NOW, "ERROR_TIMEOUT"),
    ("exit waiter", exit_action, state(COMPLETE_AB, ["c"], complete=True), "c", NOW, FAR,
     "REMOVE_FROM_WAIT_LIST"),
    ("exit waiter late", exit_action, state([], ["c"]), "c", NOW + 1, NOW, "ERROR_TIMEOUT"),
    ("exit stranger", exit_action, state(["a"]), "z", NOW + 1, NOW, "FINISH"),
    ("close open", close_action, state(["a"]), "a", NOW, FAR, "MARK_RENDEZVOUS_CLOSED"),
    ("close closed", close_action, state(closed=True), "a", NOW + 1, NOW, "FINISH"),
    ("close late", close_action, state(), "a", NOW + 1, NOW, "ERROR_TIMEOUT"),
    ("beat due", keep_alive_action, state(["a"], beats={"a": NOW - INTERVAL}), "a", NOW, FAR,
     "KEEP_ALIVE"),
    ("beat not due", keep_alive_action, state(["a"], beats={"a": NOW - 0.5}), "a", NOW, FAR,
     "FINISH"),
    ("beat unknown node", keep_alive_action, state(["b"], beats={"b": NOW - 9}), "a", NOW, FAR,
     "FINISH"),
    ("beat late", keep_alive_action, state(["a"], beats={"a": NOW - 2}), "a", NOW + 1, NOW,
     "ERROR_TIMEOUT"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("op", "st", "node", "now", "deadline", "expected"),
    [case[1:] for case in OTHER_CASES],
    ids=[case[0] for case in OTHER_CASES],
)
def test_other_ops(op, st, node, now, deadline, expected) -> None:
    assert op(st, node, S, now, deadline) is Action[expected]


# --- apply -------------------------------------------------------------------------------------


def test_first_node_joins_without_deadline() -> None:
    new = apply(Action.ADD_TO_PARTICIPANTS, RendezvousState(), "a", S, NOW)
    assert new.participants == {"a": 0}
    assert new.last_heartbeats == {"a": NOW}
    assert new.deadline is None
    assert not new.complete


def test_min_reached_starts_the_last_call() -> None:
    new = apply(Action.ADD_TO_PARTICIPANTS, state(["a"]), "b", S, NOW + 2)
    assert new.deadline == NOW + 2 + LAST_CALL
    assert not new.complete
    assert set(new.participants) == {"a", "b"}


def test_more_nodes_do_not_extend_the_last_call() -> None:
    wide = RendezvousSettings("run", 2, 5, timeout=S.timeout)
    new = apply(Action.ADD_TO_PARTICIPANTS, state(["a", "b"], deadline=NOW + 1), "c", wide, NOW)
    assert new.deadline == NOW + 1


def test_max_reached_completes_at_once_with_sorted_ranks() -> None:
    new = apply(Action.ADD_TO_PARTICIPANTS, state(["c", "a"], deadline=NOW + 1), "b", S, NOW)
    assert new.complete
    assert new.deadline is None
    assert new.participants == {"a": 0, "b": 1, "c": 2}


def test_min_equal_max_completes_on_the_last_join() -> None:
    exact = RendezvousSettings("run", 2, 2, timeout=S.timeout)
    new = apply(Action.ADD_TO_PARTICIPANTS, state(["b"]), "a", exact, NOW)
    assert (new.complete, new.deadline, new.participants) == (True, None, {"a": 0, "b": 1})


def test_joining_from_the_wait_list_leaves_it() -> None:
    new = apply(Action.ADD_TO_PARTICIPANTS, state([], ["a", "b"], round=4), "a", S, NOW + 1)
    assert new.participants == {"a": 0}
    assert new.wait_list == {"b"}
    assert new.last_heartbeats["a"] == NOW + 1
    assert new.round == 4


def test_ranks_follow_sorted_node_ids_not_join_order() -> None:
    nodes = ["node-2", "node-10", "b", "a", "node-1"]
    st = state(nodes, deadline=NOW - 1)
    new = apply(Action.MARK_RENDEZVOUS_COMPLETE, st, "b", S, NOW)
    assert new.participants == {"a": 0, "b": 1, "node-1": 2, "node-10": 3, "node-2": 4}
    assert new.complete
    assert new.deadline is None
    reversed_order = state(list(reversed(nodes)), deadline=NOW - 1)
    again = apply(Action.MARK_RENDEZVOUS_COMPLETE, reversed_order, "a", S, NOW)
    assert again.participants == new.participants


def test_add_to_wait_list_heartbeats() -> None:
    st = state(COMPLETE_AB, complete=True)
    new = apply(Action.ADD_TO_WAIT_LIST, st, "c", S, NOW + 3)
    assert new.wait_list == {"c"}
    assert new.last_heartbeats["c"] == NOW + 3
    assert new.participants == COMPLETE_AB


def test_keep_alive_updates_only_the_node() -> None:
    st = state(["a", "b"], beats={"a": NOW - 5, "b": NOW - 4})
    new = apply(Action.KEEP_ALIVE, st, "a", S, NOW)
    assert new.last_heartbeats == {"a": NOW, "b": NOW - 4}


def test_apply_returns_a_new_state_and_keeps_the_old() -> None:
    st = state(["a"])
    before = (dict(st.participants), st.wait_list, dict(st.last_heartbeats))
    new = apply(Action.ADD_TO_PARTICIPANTS, st, "b", S, NOW + 1)
    assert new is not st
    assert (dict(st.participants), st.wait_list, dict(st.last_heartbeats)) == before


def test_leaving_an_incomplete_round_below_min_clears_the_last_call() -> None:
    new = apply(Action.REMOVE_FROM_PARTICIPANTS, state(["a", "b"], deadline=NOW + 1), "a", S, NOW)
    assert new.participants == {"b": 0}
    assert "a" not in new.last_heartbeats
    assert new.deadline is None
    assert (new.round, new.complete) == (0, False)


def test_leaving_an_incomplete_round_at_min_keeps_the_last_call() -> None:
    wide = RendezvousSettings("run", 2, 5, timeout=S.timeout)
    st = state(["a", "b", "c"], deadline=NOW + 1)
    new = apply(Action.REMOVE_FROM_PARTICIPANTS, st, "a", wide, NOW)
    assert new.deadline == NOW + 1


def test_leaving_a_complete_round_keeps_it_and_the_others_ranks() -> None:
    st = state(COMPLETE_ABC, complete=True, round=2)
    new = apply(Action.REMOVE_FROM_PARTICIPANTS, st, "b", S, NOW)
    assert new.participants == {"a": 0, "c": 2}
    assert (new.complete, new.round) == (True, 2)


def test_last_participant_leaving_starts_the_next_round() -> None:
    st = state({"a": 0}, ["w"], complete=True, round=2)
    new = apply(Action.REMOVE_FROM_PARTICIPANTS, st, "a", S, NOW)
    assert new.participants == {}
    assert (new.complete, new.round) == (False, 3)
    assert new.wait_list == {"w"}
    assert new.last_heartbeats == {"w": NOW}


def test_remove_from_wait_list() -> None:
    new = apply(Action.REMOVE_FROM_WAIT_LIST, state(COMPLETE_AB, ["c"], complete=True), "c", S, 0)
    assert new.wait_list == frozenset()
    assert set(new.last_heartbeats) == {"a", "b"}


def test_mark_closed() -> None:
    new = apply(Action.MARK_RENDEZVOUS_CLOSED, state(["a"]), "a", S, NOW)
    assert new.closed
    assert new.participants == {"a": 0}


@pytest.mark.parametrize("action", sorted(set(Action) - MUTATING_ACTIONS, key=lambda a: a.value))
def test_apply_refuses_actions_that_change_nothing(action: Action) -> None:
    with pytest.raises(ValueError, match=action.name):
        apply(action, state(["a"]), "a", S, NOW)


@pytest.mark.parametrize(
    ("action", "st"),
    [
        (Action.REMOVE_FROM_PARTICIPANTS, state(["b"])),
        (Action.REMOVE_FROM_WAIT_LIST, state(["b"])),
    ],
)
def test_apply_refuses_to_remove_a_stranger(action: Action, st: RendezvousState) -> None:
    with pytest.raises(ValueError, match="'a'"):
        apply(action, st, "a", S, NOW)


# --- sanitize and remove_node ------------------------------------------------------------------


def test_sanitize_removes_only_nodes_past_interval_times_attempts() -> None:
    st = state(
        ["fresh", "edge", "second-before", "dead"],
        ["dead-waiter", "live-waiter"],
        deadline=NOW + 1,
        beats={
            "fresh": NOW,
            "edge": NOW - DEAD_AFTER,  # exactly at the limit: still alive
            "second-before": NOW - DEAD_AFTER + 1,
            "dead": NOW - DEAD_AFTER - 0.001,
            "dead-waiter": NOW - DEAD_AFTER - 10,
            "live-waiter": NOW - INTERVAL,
        },
    )
    assert expired_nodes(st, S, NOW) == {"dead", "dead-waiter"}
    new = sanitize(st, S, NOW)
    assert set(new.participants) == {"fresh", "edge", "second-before"}
    assert new.wait_list == {"live-waiter"}
    assert set(new.last_heartbeats) == {"fresh", "edge", "second-before", "live-waiter"}
    assert new.deadline == NOW + 1


def test_sanitize_returns_the_same_state_when_nobody_expired() -> None:
    st = state(["a", "b"], beats={"a": NOW - DEAD_AFTER})
    assert sanitize(st, S, NOW) is st


def test_sanitize_a_complete_round_that_empties_starts_the_next() -> None:
    old = NOW - DEAD_AFTER - 1
    st = state(COMPLETE_AB, ["w"], complete=True, round=7, beats={"a": old, "b": old})
    new = sanitize(st, S, NOW)
    assert (new.round, new.complete, new.participants) == (8, False, {})
    assert new.wait_list == {"w"}


def test_sanitize_below_min_clears_the_last_call() -> None:
    st = state(["a", "b"], deadline=NOW + 1, beats={"b": NOW - DEAD_AFTER - 1})
    new = sanitize(st, S, NOW)
    assert new.participants == {"a": 0}
    assert new.deadline is None


def test_sanitize_of_a_waiter_leaves_the_round_alone() -> None:
    st = state(COMPLETE_AB, ["w"], complete=True, beats={"w": NOW - 100})
    new = sanitize(st, S, NOW)
    assert new.wait_list == frozenset()
    assert (new.complete, new.participants, new.round) == (True, COMPLETE_AB, 0)


def test_remove_node_is_immediate_and_runs_the_epilogue() -> None:
    st = state({"a": 0}, ["w"], complete=True, round=1)
    new = remove_node(st, "a", S)
    assert (new.round, new.complete, new.participants) == (2, False, {})
    assert "a" not in new.last_heartbeats
    incomplete = remove_node(state(["a", "b"], deadline=NOW + 1), "b", S)
    assert (incomplete.participants, incomplete.deadline) == ({"a": 0}, None)
    waiter = remove_node(st, "w", S)
    assert waiter.wait_list == frozenset()
    assert "w" not in waiter.last_heartbeats
    assert waiter.round == 1


def test_remove_node_of_a_stranger_changes_nothing() -> None:
    st = state(["a"])
    assert remove_node(st, "zz", S) is st


# --- next_wakeup, rank_of, world_size ----------------------------------------------------------


def test_next_wakeup_is_the_own_heartbeat_when_nothing_else_is_due() -> None:
    assert next_wakeup(state(["a"]), "a", S, NOW, FAR) == NOW + INTERVAL


def test_next_wakeup_is_the_end_of_the_last_call() -> None:
    st = state(["a", "b"], deadline=NOW + 0.25)
    assert next_wakeup(st, "a", S, NOW, FAR) == NOW + 0.25


def test_next_wakeup_ignores_the_deadline_field_of_a_complete_round() -> None:
    st = state(COMPLETE_AB, ["c"], complete=True, deadline=NOW + 0.25)
    assert next_wakeup(st, "c", S, NOW, FAR) == NOW + INTERVAL


def test_next_wakeup_is_the_earliest_expiry_of_another_node() -> None:
    st = state(["a", "b", "c"], beats={"b": NOW - 2.9, "c": NOW - 2.5})
    assert next_wakeup(st, "a", S, NOW, FAR) == pytest.approx(NOW + 0.1, abs=1e-6)


def test_next_wakeup_does_not_count_its_own_expiry() -> None:
    st = state(["a"], beats={"a": NOW - 2.9})
    assert next_wakeup(st, "a", S, NOW, FAR) == NOW - 2.9 + INTERVAL


def test_next_wakeup_is_the_op_deadline_when_sooner() -> None:
    st = state(["a", "b"], deadline=NOW + 3)
    assert next_wakeup(st, "a", S, NOW, NOW + 0.5) == NOW + 0.5


def test_next_wakeup_of_a_stranger_without_a_deadline_is_infinite() -> None:
    assert next_wakeup(RendezvousState(), "a", S, NOW, math.inf) == math.inf


def test_next_expiry_is_the_oldest_heartbeat_plus_dead_after() -> None:
    st = state(["a", "b", "c"], beats={"b": NOW - 2.9, "c": NOW - 2.5})
    assert next_expiry(st, S) == pytest.approx(NOW + 0.1, abs=1e-6)
    assert sanitize(st, S, next_expiry(st, S)) is st  # not yet dead at that instant
    assert "b" not in sanitize(st, S, next_expiry(st, S) + 1e-3).last_heartbeats
    assert next_expiry(RendezvousState(), S) == math.inf


def test_rank_and_world_size() -> None:
    incomplete = state(["a", "b"])
    assert rank_of(incomplete, "a") is None
    assert world_size(incomplete) == 2
    complete = state(COMPLETE_ABC, complete=True)
    assert [rank_of(complete, n) for n in "abcz"] == [0, 1, 2, None]
    assert world_size(complete) == 3
