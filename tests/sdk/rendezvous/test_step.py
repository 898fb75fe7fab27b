"""Rendezvous steps (pure): the same writes as deciding by hand, on the wire and back, how long
a store may hold the answer, and which writes wake the nodes that wait."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.ops import decisions_may_change, members_may_change
from clusterbook.rendezvous.state import RendezvousState, decode, encode
from clusterbook.rendezvous.step import WAKE_SLACK, Operation, Step, StepFormatError
from tests.sdk.rendezvous.contract import by_hand

T0 = 1_700_000_000.0
S = RendezvousSettings(
    "contract",  # by_hand decides with the contract's settings: these are the same
    2,
    3,
    timeout=RendezvousTimeout(join=60.0, last_call=5.0),
    keep_alive_interval=1.0,
    keep_alive_max_attempt=3,
)
JOIN, EXIT, CLOSE, KEEP_ALIVE = (
    Operation.JOIN,
    Operation.EXIT,
    Operation.CLOSE,
    Operation.KEEP_ALIVE,
)
NAMES = ["a", "b", "c", "d"]

PROPERTY_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def make(*ops: Operation, node: str = "a", **kw: object) -> Step:
    kw.setdefault("settings", S)
    kw.setdefault("now", T0)
    kw.setdefault("deadline", T0 + 60.0)
    return Step(ops or (JOIN,), node, **kw)  # type: ignore[arg-type]


@st.composite
def states(draw: st.DrawFn) -> RendezvousState:
    participants = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3))
    waiting = draw(st.lists(st.sampled_from([n for n in NAMES if n not in participants])))
    beat = st.floats(T0 - 10.0, T0 + 0.5)
    return RendezvousState(
        round=draw(st.integers(0, 3)),
        complete=draw(st.booleans()),
        deadline=draw(st.none() | st.floats(T0 - 6.0, T0 + 6.0)),
        closed=draw(st.booleans()),
        participants={n: i for i, n in enumerate(sorted(participants))},
        wait_list=frozenset(waiting),
        last_heartbeats={n: draw(beat) for n in [*participants, *waiting]},
    )


OPS = st.sampled_from([(JOIN,), (EXIT, JOIN), (EXIT,), (KEEP_ALIVE,), (CLOSE,)])


@PROPERTY_SETTINGS
@given(state=states(), ops=OPS, node=st.sampled_from(NAMES), info=st.none() | st.just({"k": 1}))
def test_a_step_writes_what_deciding_by_hand_writes(state, ops, node, info) -> None:
    step = make(*ops, node=node, info=info)
    assert step.run(state) == by_hand(state, ops, node, info)
    blob = step(encode(state))
    assert (None if blob is None else decode(blob)) == step.run(state)


@PROPERTY_SETTINGS
@given(state=states(), ops=OPS, node=st.sampled_from(NAMES))
def test_a_repeatable_step_run_twice_does_what_it_does_once(state, ops, node) -> None:
    step = make(*ops, node=node)
    assert step.repeatable is (len(ops) == 1)
    once = step.run(state) or state
    if step.repeatable:
        assert step.run(once) in (None, once)


def test_leaving_and_joining_in_one_step() -> None:
    old = RendezvousState(
        complete=True, participants={"a": 0, "b": 1}, last_heartbeats={"a": T0, "b": T0}
    )
    new = make(EXIT, JOIN).run(old)
    assert new is not None
    assert (new.participants, new.wait_list) == ({"b": 1}, {"a"})
    alone = RendezvousState(complete=True, participants={"a": 0}, last_heartbeats={"a": T0})
    new = make(EXIT, JOIN).run(alone)
    assert new is not None
    assert (new.round, new.complete, new.participants) == (1, False, {"a": 0})


def test_a_step_that_cannot_leave_in_time_does_not_join() -> None:
    old = RendezvousState(participants={"a": 0}, last_heartbeats={"a": T0 + 100.0})
    late = make(EXIT, JOIN, now=T0 + 100.0, deadline=T0 + 1.0)  # past the rollback period
    assert late.run(old) is None


# --- how long a store may hold the answer --------------------------------------------------------


def test_hold_lasts_until_the_end_of_the_last_call() -> None:
    waiting = RendezvousState(participants={"a": 0, "b": 0}, deadline=T0 + 0.3)
    waiting = replace(waiting, last_heartbeats={"a": T0, "b": T0})
    assert make(wait=30.0).hold(waiting) == pytest.approx(0.3 + WAKE_SLACK)
    assert make(wait=0.1).hold(waiting) == 0.1
    assert make().hold(waiting) == 0.0  # no wait asked


def test_hold_is_zero_when_the_node_would_not_wait() -> None:
    complete = RendezvousState(complete=True, participants={"a": 0}, last_heartbeats={"a": T0})
    assert make(wait=30.0).hold(complete) == 0.0  # done
    due = RendezvousState(participants={"a": 0}, last_heartbeats={"a": T0 - 1.5})
    assert make(wait=30.0).hold(due) == 0.0  # its heartbeat is due: it writes first
    over = RendezvousState(
        participants={"a": 0, "b": 0}, deadline=T0 - 1, last_heartbeats={"a": T0, "b": T0}
    )
    assert make(wait=30.0).hold(over) == 0.0  # it completes the round itself


def test_hold_wakes_the_node_for_its_heartbeat() -> None:
    state = RendezvousState(participants={"a": 0}, last_heartbeats={"a": T0 - 0.25})
    assert make(wait=30.0).hold(state) == pytest.approx(0.75 + WAKE_SLACK)


# --- the wire ------------------------------------------------------------------------------------


def test_steps_round_trip_on_the_wire() -> None:
    step = make(EXIT, JOIN, info={"slots": 4, "addresses": ["10.0.0.1"]}, wait=1.0)
    assert Step.from_wire(step.to_wire()) == step
    odd = Step.from_wire(make(info={"load": float("nan")}).to_wire())  # reports as before
    assert odd.info is not None
    assert odd.info["load"] != odd.info["load"]
    assert Step.from_wire(make(KEEP_ALIVE).to_wire()) == make(KEEP_ALIVE)


def test_each_step_carries_its_own_settings_on_the_wire() -> None:
    # The settings' JSON is kept per settings object: made anew, equal or not, each is its own.
    for run in range(100):
        settings = replace(S, run_id=f"run-{run}", max_nodes=3 + run % 4)
        step = Step((JOIN,), "a", settings, T0, T0 + 1)
        assert Step.from_wire(step.to_wire()).settings == settings
    assert Step.from_wire(Step((JOIN,), "a", replace(S), T0, T0 + 1).to_wire()).settings == S


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\xff",
        b"[]",
        b'{"v": 2}',
        make().to_wire().replace(b'"ops":["join"]', b'"ops":[]'),
        make().to_wire().replace(b'"ops":["join"]', b'"ops":"join"'),
        make().to_wire().replace(b'"join"', b'"fly"'),
        make().to_wire().replace(b'"node":"a"', b'"node":7'),
        make().to_wire().replace(b'"wait":0.0', b'"wait":-1'),
        make().to_wire().replace(b'"wait":0.0', b'"wait":Infinity'),
        make().to_wire().replace(b'"max_nodes":3', b'"max_nodes":1'),
        make().to_wire().replace(b'"wait"', b'"info":{"k":1},"wait"'),  # reports follow it
        make(info={"k": 1}).to_wire().replace(b"\n", b"\n\xff"),  # not UTF-8
    ],
)
def test_malformed_steps_are_refused(blob: bytes) -> None:
    with pytest.raises(StepFormatError):
        Step.from_wire(blob)


def test_bad_steps_are_refused_when_made() -> None:
    with pytest.raises(TypeError):
        Step((), "a", S, T0, T0)
    with pytest.raises(TypeError):
        Step(("join",), "a", S, T0, T0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wait"):
        make(wait=float("nan"))


# --- which writes wake the nodes that wait -------------------------------------------------------

BASE = RendezvousState(
    participants={"a": 0, "b": 0},
    wait_list=frozenset({"w"}),
    last_heartbeats={"a": T0, "b": T0, "w": T0},
)


@pytest.mark.parametrize(
    ("change", "decides", "members"),
    [
        ({"last_heartbeats": {"a": T0 + 1, "b": T0, "w": T0}}, False, False),
        ({"node_info": {"a": {"load": 2.0}}}, False, False),
        ({"stop_jobs": ("job-1",)}, False, True),  # every agent stops that job's processes
        ({"participants": {"a": 0, "b": 0, "c": 0}}, False, True),  # joined before last call
        ({"wait_list": frozenset({"w", "x"})}, False, True),  # a newcomer: a round with room?
        ({"participants": {"a": 0}}, True, True),  # left
        ({"participants": {"a": 0, "c": 0}}, True, True),  # one left, one joined
        ({"wait_list": frozenset()}, True, True),
        ({"deadline": T0 + 5}, True, True),
        ({"complete": True}, True, True),
        ({"round": 1}, True, True),
        ({"closed": True}, True, True),
    ],
)
def test_which_writes_wake_waiters_and_members(change: dict, decides: bool, members: bool) -> None:
    """A write wakes a node waiting in a join when it may change a decision, and an agent
    that follows its round on anything but heartbeats and reports (every decision among them)."""
    after = replace(BASE, **change)
    assert decisions_may_change(BASE, after) is decides
    assert members_may_change(BASE, after) is members


def test_a_step_that_finds_a_dead_node_stores_its_removal() -> None:
    # The views a store answers cannot drop a dead node as a whole state can: the store must.
    old = RendezvousState(
        participants={"a": 0, "x": 0}, last_heartbeats={"a": T0 + 100.0, "x": T0 + 90.0}
    )
    new = make(JOIN, now=T0 + 100.0, deadline=T0 + 160.0).run(old)  # a waits: no write of its own
    assert new is not None
    assert (new.participants, set(new.last_heartbeats)) == ({"a": 0}, {"a"})


@PROPERTY_SETTINGS
@given(
    state=states(),
    steps=st.lists(st.tuples(OPS, st.sampled_from(NAMES), st.floats(-5.0, 5.0)), max_size=4),
)
def test_the_oldest_heartbeats_a_draft_keeps_are_the_states_own(state, steps) -> None:
    # A store's draft keeps the two oldest heartbeats as it writes, instead of finding them
    # in every new state (O(nodes) per write): they must be what a scan of the state finds.
    draft = state.draft()
    for ops, node, shift in steps:
        make(*ops, node=node, now=T0 + shift, deadline=T0 + 60.0).run_on(draft)
    new = draft.freeze()
    assert new.oldest() == decode(encode(new)).oldest()  # decoded: found by a scan
