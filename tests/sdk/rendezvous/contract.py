"""The contract every rendezvous backend passes (compare-and-set, fencing, watch, update,
rendezvous steps, errors).

A backend's test module subclasses :class:`BackendContract` (or :class:`RemoteBackendContract`
for stores that can be unreachable) and provides the ``backend`` fixture (a fresh, empty store
per test) and ``backend_pair`` (two clients of the same store, as two nodes would have).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from clusterbook.rendezvous.api import (
    RendezvousBackend,
    RendezvousConnectionError,
    RendezvousSettings,
    RendezvousTimeout,
)
from clusterbook.rendezvous.ops import MUTATING_ACTIONS, Action, apply, sanitize, with_info
from clusterbook.rendezvous.state import RendezvousState, decode, encode
from clusterbook.rendezvous.step import DECISIONS, Operation, Step
from clusterbook.rendezvous.view import NodeView, decode_answer, view_of

T0 = 1_700_000_000.0
SETTINGS = RendezvousSettings(
    "contract",
    2,
    3,
    timeout=RendezvousTimeout(join=60.0, last_call=5.0),
    keep_alive_interval=1.0,
    keep_alive_max_attempt=3,
)
REPORTS = {Action.ADD_TO_PARTICIPANTS, Action.ADD_TO_WAIT_LIST, Action.KEEP_ALIVE}
JOIN, EXIT, CLOSE, KEEP_ALIVE = (
    Operation.JOIN,
    Operation.EXIT,
    Operation.CLOSE,
    Operation.KEEP_ALIVE,
)

STARTS = {
    "empty": None,
    "one joined": RendezvousState(participants={"a": 0}, last_heartbeats={"a": T0 - 2}),
    "last call": RendezvousState(
        participants={"a": 0, "b": 0},
        deadline=T0 + 3,
        last_heartbeats={"a": T0 - 2, "b": T0 - 0.5},
    ),
    "last call over": RendezvousState(
        participants={"a": 0, "b": 0}, deadline=T0 - 1, last_heartbeats={"a": T0, "b": T0}
    ),
    "complete, one waiting": RendezvousState(
        round=4,
        complete=True,
        participants={"a": 0, "b": 1},
        wait_list=frozenset({"c"}),
        last_heartbeats={"a": T0 - 1.5, "b": T0, "c": T0},
        node_info={"a": {"slots": 2}},
    ),
    "one expired": RendezvousState(
        participants={"a": 0, "x": 0},
        deadline=T0 + 1,
        last_heartbeats={"a": T0, "x": T0 - 100},
    ),
    "closed": RendezvousState(closed=True, participants={"a": 0}, last_heartbeats={"a": T0}),
}
STEPS = {
    "newcomer joins": ((JOIN,), "n", None),
    "newcomer joins and reports": ((JOIN,), "n", {"slots": 4}),
    "a leaves and joins again": ((EXIT, JOIN), "a", None),
    "a heartbeats": ((KEEP_ALIVE,), "a", {"load": 0.5}),
    "a leaves": ((EXIT,), "a", None),
    "closing": ((CLOSE,), "n", None),
}


def by_hand(
    state: RendezvousState, ops: tuple[Operation, ...], node: str, info: dict | None
) -> RendezvousState | None:
    """What a node's handler wrote by compare-and-set, one decision at a time: drop the dead,
    decide, apply, until the decision changes nothing (None: it never wrote; dropping a dead
    node is a write)."""
    now, deadline = T0, T0 + 60.0
    current = sanitize(state, SETTINGS, now)
    wrote = current is not state
    for op in ops:
        while (action := DECISIONS[op](current, node, SETTINGS, now, deadline)) in (
            MUTATING_ACTIONS
        ):
            current = apply(action, current, node, SETTINGS, now)
            if info is not None and action in REPORTS:
                current = with_info(current, node, info)
            wrote = True
        if action is not Action.FINISH:
            break
    return current if wrote else None


def join_step(node: str, ops: tuple[Operation, ...] = (JOIN,), **kw: object) -> Step:
    kw.setdefault("settings", SETTINGS)
    return Step(ops, node, now=T0, deadline=T0 + 60.0, **kw)  # type: ignore[arg-type]


class BackendContract:
    """Mix into a test class that defines the fixtures ``backend`` and ``backend_pair``."""

    def test_empty_store_has_no_state(self, backend: RendezvousBackend) -> None:
        assert backend.get_state() is None

    def test_first_write_needs_no_token(self, backend: RendezvousBackend) -> None:
        state, token, won = backend.set_state(b"one")
        assert (state, won) == (b"one", True)
        assert backend.get_state() == (b"one", token)

    def test_none_token_loses_once_a_state_exists(self, backend: RendezvousBackend) -> None:
        _, token, _ = backend.set_state(b"one")
        state, now, won = backend.set_state(b"two", None)
        assert (state, now, won) == (b"one", token, False)

    def test_current_token_wins_and_tokens_grow(self, backend: RendezvousBackend) -> None:
        _, t1, _ = backend.set_state(b"one")
        state, t2, won = backend.set_state(b"two", t1)
        assert (state, won) == (b"two", True)
        assert t2 > t1
        assert backend.get_state() == (b"two", t2)

    def test_stale_token_never_wins(self, backend: RendezvousBackend) -> None:
        _, t1, _ = backend.set_state(b"one")
        _, t2, _ = backend.set_state(b"two", t1)
        state, token, won = backend.set_state(b"stale", t1)
        assert (state, token, won) == (b"two", t2, False)

    @pytest.mark.parametrize("bad", [-1, 10**9, "1", 1.0, True])
    def test_invalid_token_never_wins(self, backend: RendezvousBackend, bad: object) -> None:
        _, token, _ = backend.set_state(b"one")
        state, now, won = backend.set_state(b"evil", bad)  # type: ignore[arg-type]
        assert (state, now, won) == (b"one", token, False)

    def test_token_wins_only_once(self, backend_pair) -> None:
        a, b = backend_pair
        _, token, _ = a.set_state(b"base")
        results = {}

        def write(client: RendezvousBackend, value: bytes) -> None:
            results[value] = client.set_state(value, token)[2]

        threads = [threading.Thread(target=write, args=(c, v)) for c, v in ((a, b"A"), (b, b"B"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results.values()) == [False, True]
        winner = next(v for v, won in results.items() if won)
        assert a.get_state()[0] == winner
        assert b.get_state()[0] == winner

    def test_states_are_bytes_round_tripped(self, backend: RendezvousBackend) -> None:
        blob = encode(RendezvousState(round=3, participants={"n1": 0}, last_heartbeats={"n1": 1.5}))
        backend.set_state(blob)
        state, _ = backend.get_state()
        assert decode(state).participants == {"n1": 0}
        raw = bytes(range(256)) * 4
        backend.set_state(raw, backend.get_state()[1])
        assert backend.get_state()[0] == raw

    def test_watch_returns_at_once_when_token_differs(self, backend: RendezvousBackend) -> None:
        _, token, _ = backend.set_state(b"one")
        assert backend.watch(None, 5.0) == (b"one", token)
        assert backend.watch(token - 1, 5.0) == (b"one", token)

    def test_watch_times_out_without_change(self, backend: RendezvousBackend) -> None:
        _, token, _ = backend.set_state(b"one")
        t0 = time.monotonic()
        assert backend.watch(token, 0.2) == (b"one", token)
        assert time.monotonic() - t0 >= 0.19

    def test_watch_wakes_on_change_from_another_client(self, backend_pair) -> None:
        a, b = backend_pair
        _, token, _ = a.set_state(b"one")
        got = []
        waiter = threading.Thread(target=lambda: got.append(b.watch(token, 10.0)))
        waiter.start()
        time.sleep(0.1)
        _, t2, _ = a.set_state(b"two", token)
        waiter.join(timeout=10)
        assert got == [(b"two", t2)]

    def test_read_state_answers_the_state_whole_as_watch_does(self, backend_pair) -> None:
        a, b = backend_pair
        assert b.read_state(None, 0.0) is None
        _, token, _ = a.set_state(b"one")
        assert b.read_state(None, 5.0) == (b"one", token)
        assert b.read_state(token, 0.2) == (b"one", token)  # no change: at its timeout
        got = []
        waiter = threading.Thread(target=lambda: got.append(b.read_state(token, 10.0)))
        waiter.start()
        time.sleep(0.1)
        _, t2, _ = a.set_state(b"two", token)
        waiter.join(timeout=10)
        assert got == [(b"two", t2)]

    def test_read_state_since_a_token_has_every_report_written_after_it(
        self, backend: RendezvousBackend
    ) -> None:
        backend.update(join_step("a", info={"n": 1}))
        backend.update(join_step("b", info={"n": 2}))
        read = backend.read_state(None, 0.0)
        assert read is not None
        backend.update(join_step("c", info={"n": 3}))
        beat = Step((KEEP_ALIVE,), "a", SETTINGS, T0 + 2.0, T0 + 60.0, {"n": 4})
        backend.update(beat)
        whole, since = backend.get_state(), backend.read_state(None, 0.0, since=read[1])
        assert whole is not None
        assert since is not None
        assert since[1] == whole[1]
        got, expected = decode(since[0]), decode(whole[0])
        assert got.node_info.items() >= {"a": {"n": 4}, "c": {"n": 3}}.items()
        assert got.node_info.items() <= expected.node_info.items()
        assert replace(got, node_info={}) == replace(expected, node_info={})

    # --- update and rendezvous steps ------------------------------------------------------------

    def test_update_writes_what_the_change_returns_with_a_new_token(
        self, backend: RendezvousBackend
    ) -> None:
        assert backend.update(lambda blob: None) is None
        state, t1 = backend.update(lambda blob: b"first" if blob is None else blob + b"!")
        assert (state, backend.get_state()) == (b"first", (b"first", t1))
        state, t2 = backend.update(lambda blob: None if blob is None else blob + b"!")
        assert (state, t2 > t1) == (b"first!", True)
        assert backend.update(lambda blob: None) == (b"first!", t2)

    def test_stale_token_never_wins_after_an_update(self, backend: RendezvousBackend) -> None:
        _, t1, _ = backend.set_state(encode(RendezvousState()))
        _, t2 = backend.update(join_step("n"))
        assert t2 > t1
        state = backend.get_state()[0]  # whole: the update's answer may be the node's view
        assert backend.set_state(b"stale", t1) == (state, t2, False)
        assert backend.set_state(b"stale", None) == (state, t2, False)
        assert backend.get_state() == (state, t2)

    @pytest.mark.parametrize("start", STARTS)
    @pytest.mark.parametrize("step", STEPS)
    def test_a_step_writes_what_the_decisions_by_hand_would(
        self, backend: RendezvousBackend, start: str, step: str
    ) -> None:
        state, (ops, node, info) = STARTS[start], STEPS[step]
        before = None if state is None else backend.set_state(encode(state))[:2]
        after = backend.update(join_step(node, ops, info=info))
        expected = by_hand(state or RendezvousState(), ops, node, info)
        stored = backend.get_state()
        if expected is None:  # nothing written
            assert stored == before
            if stored is None:
                assert after is None
            else:
                assert after is not None
                assert after[1] == stored[1]
                assert _as_answered(after[0], decode(stored[0]), node)
        else:
            assert after is not None
            assert stored is not None
            assert decode(stored[0]) == expected  # what the store holds: that state, whole
            assert _as_answered(after[0], expected, node)
            assert stored[1] == after[1]
            assert before is None or after[1] > before[1]

    def test_racing_updates_are_atomic(self, backend_pair) -> None:
        nodes = {client: [f"{i}-{n}" for n in range(10)] for i, client in enumerate(backend_pair)}
        wide = RendezvousSettings("contract", 1, 100, timeout=RendezvousTimeout(last_call=600))
        missing: list[str] = []

        def join(client: RendezvousBackend, names: list[str]) -> None:
            for name in names:
                current = client.update(join_step(name, settings=wide))
                if current is None or name not in decode_answer(current[0]).participants:
                    missing.append(name)

        threads = [threading.Thread(target=join, args=item) for item in nodes.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert missing == []
        current = backend_pair[0].get_state()
        assert current is not None
        assert set(decode(current[0]).participants) == {n for ns in nodes.values() for n in ns}

    def test_decision_watch_wakes_when_a_node_leaves(self, backend_pair) -> None:
        a, b = backend_pair
        _, token, _ = a.set_state(encode(STARTS["last call"]))
        got = []
        waiter = threading.Thread(target=lambda: got.append(b.watch_decisions(token, 30.0)))
        waiter.start()
        time.sleep(0.1)
        left = a.update(join_step("b", (EXIT,)))
        waiter.join(timeout=30)
        assert got[0] is not None
        assert left is not None
        assert got[0][1] == left[1]  # woken by that write
        assert _as_answered(got[0][0], decode(b.get_state()[0]), getattr(b, "node", None))
        assert decode_answer(got[0][0]).joined == 1

    def test_member_watch_wakes_when_jobs_are_to_stop(self, backend_pair) -> None:
        a, b = backend_pair
        _, token, _ = a.set_state(encode(STARTS["last call"]))
        got = []
        waiter = threading.Thread(target=lambda: got.append(b.watch_members(token, 30.0)))
        waiter.start()
        time.sleep(0.1)
        stopping = replace(STARTS["last call"], stop_jobs=("job-1",))
        state, after, _ = a.set_state(encode(stopping), token)
        waiter.join(timeout=30)
        assert got[0] is not None
        assert got[0][1] == after
        assert _as_answered(got[0][0], decode(state), getattr(b, "node", None))
        assert decode_answer(got[0][0]).stop_jobs == ("job-1",)

    def test_a_node_learns_its_place_and_rank_0_from_its_answer(
        self, backend: RendezvousBackend
    ) -> None:
        # What a node reads of the answer to its step: its rank, the world size, the round and
        # where rank 0 is; from a store that answers views, in bytes that do not grow with N.
        sizes = {}
        for n in (3, 3_000):
            names = [f"n-{i:05d}" for i in range(n)]
            state = RendezvousState(
                round=5,
                complete=True,
                participants={name: rank for rank, name in enumerate(names)},
                last_heartbeats=dict.fromkeys(names, T0),
                node_info={names[0]: {"hostname": "first", "addresses": ["10.1.0.1"]}},
            )
            current = backend.get_state()
            backend.set_state(encode(state), None if current is None else current[1])
            after = backend.update(join_step(names[2], (KEEP_ALIVE,)))
            assert after is not None
            answer = decode_answer(after[0])
            view = answer if isinstance(answer, NodeView) else view_of(answer, names[2])
            assert (view.rank, view.joined, view.round) == (2, n, 5)
            assert (view.leader, view.leader_host, view.leader_addresses) == (
                names[0],
                "first",
                ("10.1.0.1",),
            )
            sizes[n] = len(after[0]) if isinstance(answer, NodeView) else None
        if self.answers_views:
            assert sizes[3] is not None
            assert sizes[3_000] is not None
            assert sizes[3_000] - sizes[3] <= 8, sizes  # the digits of the counts

    answers_views = False
    """Whether the store answers a node's steps with its view (:mod:`.view`)."""

    def test_close_is_idempotent(self, backend: RendezvousBackend) -> None:
        backend.close()
        backend.close()


def _as_answered(blob: bytes, state: RendezvousState, node: str | None) -> bool:
    """Whether ``blob`` is ``state`` as a store may answer a node's step or its decision or
    member watch: whole, without the nodes' reports (only the head reads them), or as the
    node's view of it."""
    answer = decode_answer(blob)
    if isinstance(answer, NodeView):
        return node is not None and answer == view_of(state, node)
    return answer in (state, replace(state, node_info={}))


class RemoteBackendContract(BackendContract):
    """For backends with a store to lose: also needs the ``unreachable`` fixture (a factory
    of clients whose store cannot be reached)."""

    def test_unreachable_store_raises_connection_error(self, unreachable) -> None:
        client = unreachable()
        with pytest.raises(RendezvousConnectionError):
            client.get_state()
        with pytest.raises(RendezvousConnectionError):
            client.set_state(b"x")
