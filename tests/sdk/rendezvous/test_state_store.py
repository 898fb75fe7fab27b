"""What the TCP store holds, without its server: reports kept as the text they came as, batches
of steps run on the stored state itself (no copy of a whole cluster's state per batch), a
failing step or a batch over the limit taken back, and writes that wake whom they must."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from clusterbook.rendezvous.backends._store import DECISIONS, MEMBERS, StateStore
from clusterbook.rendezvous.backends.wire import TOKEN_INT
from clusterbook.rendezvous.info import Info
from clusterbook.rendezvous.ops import decisions_may_change, members_may_change
from clusterbook.rendezvous.report import NodeReport
from clusterbook.rendezvous.state import Draft, RendezvousState, decode, encode
from clusterbook.rendezvous.step import Step
from tests.sdk.rendezvous.test_step import (
    JOIN,
    KEEP_ALIVE,
    NAMES,
    OPS,
    PROPERTY_SETTINGS,
    T0,
    S,
    make,
    states,
)


def run(store: StateStore, *steps: Step) -> bool | None:
    return store.run([(step, len(step.to_wire())) for step in steps])[1]


def stored(store: StateStore) -> RendezvousState:
    current = store.current()
    assert current is not None
    return decode(current[0])


def test_the_store_keeps_a_report_as_the_text_it_came_as() -> None:
    text = '{"hostname": "n1",   "load": [1, 2.50]}'  # not as json.dumps would write it
    store = StateStore()
    run(store, Step.from_wire(make(JOIN, node="a", info=Info(text)).to_wire()))
    info = stored(store).node_info["a"]
    assert info.text == text
    assert info == {"hostname": "n1", "load": [1, 2.5]}


def test_a_report_that_is_no_json_object_reads_as_empty_and_the_state_stays_sound() -> None:
    store = StateStore()
    run(store, make(JOIN, node="a", info=Info('{"cut off')), make(JOIN, node="b", info=Info("[]")))
    state = stored(store)
    assert state.node_info == {"a": {}, "b": {}}
    assert NodeReport.from_text(state.node_info["a"].text) == NodeReport()


def test_a_batch_changes_the_stored_state_in_place() -> None:
    store = StateStore()
    run(store, make(JOIN, node="a"))
    assert store.decoded is not None
    beats, reports = store.decoded.last_heartbeats, store.decoded.node_info
    run(store, make(JOIN, node="b", info={"k": 1}), make(JOIN, node="c"))
    assert store.decoded.last_heartbeats is beats  # no copy of every node's entry per batch
    assert store.decoded.node_info is reports
    assert set(beats) == {"a", "b", "c"}
    assert stored(store).node_info == {"b": {"k": 1}}


@dataclass(frozen=True, slots=True)
class Faulty(Step):
    """A step that fails (a bug) after it changed the draft."""

    def run_on(self, draft: Draft) -> bool:
        Step.run_on(self, draft)
        raise RuntimeError("a bug in a step")


def test_a_failing_step_is_taken_back_and_the_others_stand(caplog) -> None:
    store = StateStore()
    run(store, make(JOIN, node="a"))
    holds, decisive = store.run(
        [
            (make(JOIN, node="b", info={"k": 1}), 1),
            (Faulty((JOIN,), "x", S, T0, T0 + 60.0, {"k": 2}), 1),
            (make(JOIN, node="c"), 1),
        ]
    )
    state = stored(store)
    assert decisive is not None
    assert holds[1] == 0.0  # answered at once
    assert (state.participants.keys(), set(state.last_heartbeats)) == ({"a", "b", "c"},) * 2
    assert set(state.node_info) == {"b"}
    assert "failed; no change" in caplog.text


def test_a_batch_over_the_limit_is_taken_back_whole() -> None:
    store = StateStore(limit=4096)
    run(store, make(JOIN, node="a", info={"k": 1}))
    before, token = stored(store), store.token
    big = {"blob": "x" * 4096}
    assert run(store, make(JOIN, node="b"), make(JOIN, node="c", info=big)) is None
    assert store.token == token
    assert stored(store) == before
    assert store.decoded == before


@PROPERTY_SETTINGS
@given(
    state=states(),
    steps=st.lists(st.tuples(OPS, st.sampled_from(NAMES), st.floats(-5.0, 5.0)), max_size=4),
)
def test_a_batch_wakes_every_watch_the_states_say_it_may_settle(state, steps) -> None:
    # The store says what a batch may change from its draft in O(1), not by comparing the
    # states (O(nodes) a write): it may wake more than the comparison would, never fewer.
    store = StateStore()
    store.write(encode(state))
    token = store.token
    decisive = run(
        store,
        *(make(*ops, node=node, now=T0 + shift, deadline=T0 + 60.0) for ops, node, shift in steps),
    )
    if decisive is None:
        return
    after = stored(store)
    if decisions_may_change(state, after):
        assert decisive
        assert store.settled(TOKEN_INT, token, level=DECISIONS)
    if members_may_change(state, after):
        assert store.settled(TOKEN_INT, token, level=MEMBERS)
    assert json.loads(encode(after)) == json.loads(store.current()[0])  # type: ignore[index]


def test_a_report_travels_after_its_step_as_it_is_and_comes_back_the_same() -> None:
    text = '{"name": "caf\u00e9 \\"x\\"", "note": "a\\nb"}'
    wire = make(JOIN, node="a", info=Info(text)).to_wire()
    assert wire.endswith(b"\n" + text.encode())  # not escaped into the step's JSON
    store = StateStore()
    run(store, Step.from_wire(wire))
    assert stored(store).node_info["a"].text == text


def test_a_report_that_grows_when_escaped_counts_at_its_escaped_size() -> None:
    # 1,000 bytes on the wire, 6,000 in the state (each control character as \u0001).
    store = StateStore(limit=4096)
    assert run(store, make(JOIN, node="a", info=Info("\x01" * 1000))) is None
    assert store.token == 0
    run(store, make(JOIN, node="a", info=Info("\x01" * 100)))
    current = store.current()
    assert current is not None
    assert len(current[0]) <= 4096


def test_a_read_since_a_token_has_only_the_reports_written_after_it() -> None:
    store = StateStore()
    run(store, make(JOIN, node="a", info={"n": 1}), make(JOIN, node="b", info={"n": 2}))
    token = store.token
    run(store, make(KEEP_ALIVE, node="a", now=T0 + 2.0, info={"n": 3}))
    since = store.current(since=token)
    assert since is not None
    got = decode(since[0])
    assert got.node_info == {"a": {"n": 3}}  # b's report did not change: not sent again
    assert (set(got.last_heartbeats), got.participants.keys()) == ({"a", "b"},) * 2
    nothing = store.current(since=store.token)
    assert nothing is not None
    assert decode(nothing[0]).node_info == {}
    store.write(encode(stored(store)))  # a whole state written: every report in it is new
    again = store.current(since=store.token - 1)
    assert again is not None
    assert decode(again[0]).node_info == {"a": {"n": 3}, "b": {"n": 2}}
    assert store.current(since=store.token + 5) == store.current()  # not this store's: whole


def test_a_read_since_the_last_write_is_answered_from_what_is_kept() -> None:
    # The head's follower asks so whenever its watch times out with nothing new: the state
    # without its reports, encoded once a write, not every node's entry again at each ask.
    store = StateStore()
    run(store, make(JOIN, node="a", info={"n": 1}), make(JOIN, node="b", info={"n": 2}))
    first, again = store.current(since=store.token), store.current(since=store.token)
    assert first is not None
    assert again is not None
    assert first[0] is again[0]
    assert decode(first[0]).node_info == {}
    assert decode(first[0]).participants.keys() == {"a", "b"}
