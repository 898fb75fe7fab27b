"""The rendezvous handler against the in-memory store, with real threads and clocks.

Timeouts are short where the test waits for them to pass, and long wherever passing them would
make the test wrong (so a loaded machine only makes the tests slower, never red).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.api import (
    RendezvousClosedError,
    RendezvousSettings,
    RendezvousStateError,
    RendezvousTimeout,
    RendezvousTimeoutError,
)
from clusterbook.rendezvous.backends.memory import MemoryBackend
from clusterbook.rendezvous.handler import RendezvousHandler, RendezvousInfo
from clusterbook.rendezvous.ops import (
    MUTATING_ACTIONS,
    Action,
    apply,
    join_action,
    rank_of,
    sanitize,
)
from clusterbook.rendezvous.state import RendezvousState, decode, encode

WAIT = 60.0  # generous bound for "eventually"


def make_settings(
    min_nodes: int,
    max_nodes: int,
    *,
    join: float = 120.0,
    last_call: float = 0.2,
    interval: float = 0.1,
    attempts: int = 50,
) -> RendezvousSettings:
    return RendezvousSettings(
        "test-run",
        min_nodes,
        max_nodes,
        timeout=RendezvousTimeout(join=join, last_call=last_call, close=10.0, heartbeat=5.0),
        keep_alive_interval=interval,
        keep_alive_max_attempt=attempts,
    )


@pytest.fixture
def backend() -> MemoryBackend:
    return MemoryBackend()


@pytest.fixture
def make(backend) -> Iterator[Callable[..., RendezvousHandler]]:
    """Handlers on the shared backend; all shut down (heartbeat threads stopped) at the end."""
    made: list[RendezvousHandler] = []

    def factory(settings: RendezvousSettings, node: str, **kwargs) -> RendezvousHandler:
        handler = RendezvousHandler(backend, settings, node, **kwargs)
        made.append(handler)
        return handler

    yield factory
    for handler in made:
        handler.shutdown()


class Call:
    """``handler.next_rendezvous()`` on a thread of its own."""

    def __init__(self, handler: RendezvousHandler) -> None:
        self.result: RendezvousInfo | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(handler,), daemon=True)
        self.thread.start()

    def _run(self, handler: RendezvousHandler) -> None:
        try:
            self.result = handler.next_rendezvous()
        except BaseException as exc:
            self.error = exc

    def get(self) -> RendezvousInfo:
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "next_rendezvous did not return"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def join_all(*handlers: RendezvousHandler) -> list[RendezvousInfo]:
    calls = [Call(h) for h in handlers]
    return [c.get() for c in calls]


def stored(backend: MemoryBackend) -> RendezvousState:
    current = backend.get_state()
    assert current is not None
    return decode(current[0])


def eventually(predicate: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting until {what}"
        time.sleep(0.01)


# --- forming rounds ----------------------------------------------------------------------------


def test_three_nodes_up_to_max_complete_at_once(make) -> None:
    # A frozen wall clock: the last call can never end, so only reaching max_nodes completes.
    frozen = 1_700_000_000.0
    s = make_settings(2, 3, last_call=1.0)
    handlers = [make(s, f"node-{c}", clock=lambda: frozen) for c in "cab"]
    infos = join_all(*handlers)
    assert {i.rank for i in infos} == {0, 1, 2}
    assert {i.round for i in infos} == {0}
    assert {i.world_size for i in infos} == {3}
    assert {i.leader for i in infos} == {"node-a"}  # rank 0, as every node learns
    assert [i.rank for i in infos] == [2, 0, 1]  # by sorted node id, not by start order


def test_two_of_four_complete_after_the_last_call(make, backend) -> None:
    s = make_settings(2, 4, last_call=0.2)
    a, b = make(s, "a"), make(s, "b")
    started = time.time()
    infos = join_all(a, b)
    took = time.time() - started
    assert sorted(i.rank for i in infos) == [0, 1]
    assert {i.world_size for i in infos} == {2}
    assert took >= s.timeout.last_call
    state = stored(backend)
    assert state.complete
    assert state.deadline is None


def test_waiters_watch_until_the_last_call_instead_of_polling() -> None:
    class Spy(MemoryBackend):
        def __init__(self) -> None:
            super().__init__()
            self.timeouts: list[float] = []

        def watch(self, token, timeout):
            self.timeouts.append(timeout)
            return super().watch(token, timeout)

    spy = Spy()
    s = make_settings(1, 2, last_call=0.3, interval=30.0)
    handler = RendezvousHandler(spy, s, "solo")
    try:
        info = handler.next_rendezvous()
    finally:
        handler.shutdown()
    assert (info.rank, info.world_size) == (0, 1)
    # It slept until the end of the last call (not the 1 s cap, nor short polls).
    assert spy.timeouts
    assert 0 < spy.timeouts[0] <= 0.3 + 0.01
    assert len(spy.timeouts) <= 5


def test_late_node_waits_and_joins_the_next_round(make, backend) -> None:
    # last_call must outlast the threads of the second round starting (they race to join).
    s = make_settings(2, 3, last_call=1.5)
    a, b, c = make(s, "a"), make(s, "b"), make(s, "c")
    first = join_all(a, b)
    round_ = first[0].round
    assert {i.world_size for i in first} == {2}

    late = Call(c)
    eventually(lambda: a.num_nodes_waiting() == 1, "the late node waits")
    assert b.num_nodes_waiting() == 1
    assert stored(backend).wait_list == {"c"}
    assert late.thread.is_alive()  # it waits for the next round

    second = [*join_all(a, b), late.get()]
    assert {i.round for i in second} == {round_ + 1}
    assert sorted(i.rank for i in second) == [0, 1, 2]
    assert (second[2].rank, second[2].world_size, second[2].leader) == (2, 3, "a")
    assert a.num_nodes_waiting() == 0


def test_lost_compare_and_set_decides_again() -> None:
    class Racy(MemoryBackend):
        """Another node joins just before our first write."""

        def __init__(self) -> None:
            super().__init__()
            self.raced = False

        def set_state(self, state, token=None):
            if not self.raced:
                self.raced = True
                other = RendezvousState(participants={"other": 0}, last_heartbeats={"other": 1e12})
                super().set_state(encode(other), token)
            return super().set_state(state, token)

    racy = Racy()
    s = make_settings(2, 2)
    handler = RendezvousHandler(racy, s, "me")
    try:
        info = handler.next_rendezvous()
    finally:
        handler.shutdown()
    assert racy.raced
    assert (info.rank, info.world_size, info.leader) == (0, 2, "me")


# --- closing, timeouts, corruption -------------------------------------------------------------


def test_closed_rendezvous_refuses_joins_and_wakes_waiters(make, backend) -> None:
    s = make_settings(2, 3)
    a, b, c = make(s, "a"), make(s, "b"), make(s, "c")
    assert not a.is_closed()
    waiting = Call(b)  # alone below min_nodes: waits
    eventually(lambda: backend.get_state() is not None and "b" in stored(backend).participants,
               "b joined")  # fmt: skip
    a.set_closed()
    assert a.is_closed()
    assert c.is_closed()
    with pytest.raises(RendezvousClosedError, match="closed"):
        waiting.get()
    with pytest.raises(RendezvousClosedError, match="'c'"):
        c.next_rendezvous()
    a.set_closed()  # closing again is fine


def test_join_timeout_names_min_nodes_and_rolls_back(make, backend) -> None:
    s = make_settings(3, 4, join=0.5)
    a, b = make(s, "a"), make(s, "b")
    calls = [Call(a), Call(b)]
    for call, name in zip(calls, "ab", strict=True):
        with pytest.raises(RendezvousTimeoutError) as info:
            call.get()
        message = str(info.value)
        assert "needs at least 3" in message
        assert re.search(r"lower min_nodes=[12], or raise join_timeout=1\.0\.", message), message
        assert "0.5 s" in message
        assert f"'{name}'" in message
    state = stored(backend)
    assert state.participants == {}
    assert state.last_heartbeats == {}


def test_corrupt_state_raises_state_error(make, backend) -> None:
    backend.set_state(b"\x00 not a rendezvous state")
    handler = make(make_settings(1, 2), "a")
    with pytest.raises(RendezvousStateError):
        handler.next_rendezvous()
    with pytest.raises(RendezvousStateError):
        handler.num_nodes_waiting()


def test_node_id_must_be_a_string(backend) -> None:
    with pytest.raises(ConfigError):
        RendezvousHandler(backend, make_settings(1, 1), "")


# --- heartbeats, leaving -----------------------------------------------------------------------


def test_silent_node_is_removed_after_interval_times_attempts(make, backend) -> None:
    s = make_settings(3, 3, interval=0.1, attempts=20)  # dead after 2 s
    a, b, c = make(s, "a"), make(s, "b"), make(s, "c")
    infos = join_all(a, b, c)
    ranks = {node: info.rank for node, info in zip("abc", infos, strict=True)}

    c._stop_heartbeats()  # c hangs: it stays in the state but beats no more
    last_beat = stored(backend).last_heartbeats["c"]

    eventually(lambda: "c" not in stored(backend).last_heartbeats, "c is dropped")
    state = stored(backend)
    # Only heartbeats of a and b write now: the write that dropped c carries its time.
    assert max(state.last_heartbeats.values()) > last_beat + s.dead_after
    assert state.complete
    assert state.participants == {"a": ranks["a"], "b": ranks["b"]}
    eventually(lambda: a.state().joined == 2, "a sees c gone")


def test_heartbeats_keep_nodes_alive_well_past_the_dead_time(make, backend) -> None:
    s = make_settings(2, 2, interval=0.05, attempts=20)  # dead after 1 s
    a, b = make(s, "a"), make(s, "b")
    join_all(a, b)
    first = stored(backend).last_heartbeats
    eventually(
        lambda: all(
            stored(backend).last_heartbeats.get(n, 0) > first[n] + s.dead_after for n in "ab"
        ),
        "both heartbeat for longer than the dead time",
    )
    assert set(stored(backend).participants) == {"a", "b"}


def test_shutdown_leaves_and_is_idempotent(make, backend) -> None:
    s = make_settings(2, 2)
    a, b = make(s, "a"), make(s, "b")
    join_all(a, b)
    beating = a._beats._thread
    assert beating.is_alive()

    assert a.shutdown()
    assert not beating.is_alive()
    state = stored(backend)
    assert set(state.participants) == {"b"}
    assert "a" not in state.last_heartbeats
    assert state.complete

    assert b.shutdown()
    state = stored(backend)
    assert (state.round, state.complete, state.participants) == (1, False, {})
    token = backend.get_state()[1]
    assert a.shutdown()
    assert b.shutdown()
    assert backend.get_state()[1] == token


def test_next_rendezvous_again_leaves_the_old_round_first(make, backend) -> None:
    s = make_settings(2, 2)
    a, b = make(s, "a"), make(s, "b")
    first = join_all(a, b)
    second = join_all(a, b)
    assert {i.round for i in first} == {0}
    assert {i.round for i in second} == {1}
    assert sorted(i.rank for i in second) == [0, 1]


class Interloper(MemoryBackend):
    """Once armed, another node's heartbeat lands just before the next write."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def set_state(self, state, token=None):
        if self.armed:
            self.armed = False
            current = decode(self.get_state()[0])
            beats = {**current.last_heartbeats, "b": time.time()}
            super().set_state(encode(replace(current, last_heartbeats=beats)), token)
        return super().set_state(state, token)


def test_next_rendezvous_leaves_first_even_when_its_first_write_loses() -> None:
    store = Interloper()
    s = make_settings(1, 2, last_call=0.1)
    a, b = RendezvousHandler(store, s, "a"), RendezvousHandler(store, s, "b")
    try:
        join_all(a, b)
        store.armed = True
        again = Call(a)  # must leave round 0 (where b still is) and wait for round 1
        eventually(lambda: "a" in stored(store).wait_list, "a waits for the next round")
        assert not store.armed
        b.shutdown()
        info = again.get()
        assert (info.round, info.rank, info.world_size) == (1, 0, 1)
    finally:
        a.shutdown()
        b.shutdown()


def test_a_store_that_keeps_changing_makes_update_give_up() -> None:
    class Busy(MemoryBackend):
        def set_state(self, state, token=None):
            current = self.get_state()
            super().set_state(b"someone else", None if current is None else current[1])
            return super().set_state(state, token)

    with pytest.raises(RendezvousTimeoutError, match="changed under 1000 attempts"):
        Busy().update(lambda blob: b"mine")


def test_on_change_sees_each_new_state_and_its_errors_are_contained(make) -> None:
    seen: list[RendezvousState] = []
    s = make_settings(2, 2)

    def boom(_: RendezvousState) -> None:
        raise RuntimeError("a broken status widget")

    a = make(s, "a", on_change=seen.append)
    b = make(s, "b", on_change=boom)
    # a joins first, so that it waits in a round that is not complete yet (joining at once,
    # b's join could complete the round in the same step that adds a).
    first = Call(a)
    eventually(lambda: any("a" in st.participants for st in seen), "a has joined")
    second = Call(b)
    infos = [first.get(), second.get()]
    assert sorted(i.rank for i in infos) == [0, 1]
    assert seen
    assert seen[-1].complete
    assert set(seen[-1].participants) == {"a", "b"}
    assert any(not st.complete and "a" in st.participants for st in seen)


# --- scale -------------------------------------------------------------------------------------


def drive_round(backend: MemoryBackend, settings: RendezvousSettings, nodes: list[str]):
    """Every node, in turn, reads the store, decides and writes; until all finished."""
    now = [1_700_000_000.0]
    deadline = now[0] + settings.timeout.join
    ranks: dict[str, int] = {}
    pending = list(nodes)
    for _ in range(5):
        if not pending:
            break
        still = []
        for node in pending:
            now[0] += 1e-4
            current = backend.get_state()
            state = RendezvousState() if current is None else decode(current[0])
            token = None if current is None else current[1]
            state = sanitize(state, settings, now[0])
            action = join_action(state, node, settings, now[0], deadline)
            if action is Action.FINISH:
                rank = rank_of(state, node)
                assert rank is not None
                ranks[node] = rank
                continue
            if action in MUTATING_ACTIONS:
                new = apply(action, state, node, settings, now[0])
                assert backend.set_state(encode(new), token)[2]
            still.append(node)
        pending = still
    return ranks, pending


def test_a_thousand_nodes_form_one_round(backend) -> None:
    nodes = [f"node-{i:04d}" for i in range(1_000)]
    order = nodes[:]
    random.Random(7).shuffle(order)
    s = make_settings(2, 1_000, last_call=600.0, interval=600.0, attempts=3)
    ranks, pending = drive_round(backend, s, order)
    assert pending == []
    assert ranks == {node: i for i, node in enumerate(nodes)}
    state = stored(backend)
    assert state.complete
    assert state.round == 0
    assert len(state.participants) == 1_000
