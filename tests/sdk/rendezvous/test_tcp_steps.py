"""Rendezvous steps run by the TCP store: one request per step however many nodes race, answers
held while the node would wait, and decision watches that sleep through heartbeats."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest

from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.backends._store import StateStore
from clusterbook.rendezvous.backends.tcp import TcpBackend
from clusterbook.rendezvous.backends.tcp_server import StoreServer
from clusterbook.rendezvous.handler import RendezvousHandler
from clusterbook.rendezvous.state import RendezvousState, decode, encode
from clusterbook.rendezvous.step import Operation, Step
from clusterbook.rendezvous.view import NodeView, decode_answer
from tests.sdk.rendezvous.test_tcp_backend import (
    Later,
    LostLog,
    assert_serves,
    closed_by_peer,
    drop,
    raw_session,
    wait_for,
)

WAIT = 30.0
JOIN, EXIT, KEEP_ALIVE = Operation.JOIN, Operation.EXIT, Operation.KEEP_ALIVE


def settings(
    min_nodes: int, max_nodes: int, last_call: float = 600.0, interval: float = 60.0
) -> RendezvousSettings:
    """Nothing falls due by time alone during a test, unless asked for."""
    return RendezvousSettings(
        "steps",
        min_nodes,
        max_nodes,
        timeout=RendezvousTimeout(join=600.0, last_call=last_call),
        keep_alive_interval=interval,
        keep_alive_max_attempt=1000,  # nobody expires during a test
    )


def step(node: str, s: RendezvousSettings, *ops: Operation, **kw: object) -> Step:
    now = time.time()
    return Step(ops or (JOIN,), node, s, now, now + 600.0, **kw)  # type: ignore[arg-type]


def state_of(current: tuple[bytes, int] | None) -> RendezvousState:
    """The state of a whole answer (a get, a plain watch)."""
    assert current is not None
    return decode(current[0])


def view_of_answer(current: tuple[bytes, int] | None) -> NodeView:
    """A node's view, as the store answers the node's steps and decision and member watches."""
    assert current is not None
    answer = decode_answer(current[0])
    assert isinstance(answer, NodeView), answer
    return answer


# --- one request per step -------------------------------------------------------------------------


class NoCompareAndSet(TcpBackend):
    """A client that may not read or write the state itself: only the store may run steps."""

    def get_state(self):
        raise AssertionError("get_state called")

    def set_state(self, state, token=None):
        raise AssertionError("set_state called")


def test_a_step_runs_on_the_store_in_one_request(make_server, make_client, secret) -> None:
    server = make_server()
    client = NoCompareAndSet(server.url, secret, node="n")
    try:
        s = settings(2, 3)
        view = view_of_answer(client.update(step("n", s, EXIT, JOIN, info={"slots": 2})))
        assert (view.node, view.rank, view.joined) == ("n", 0, 1)
        # The answer is the node's view: the nodes' reports are in the store, for the head.
        assert state_of(make_client(server.url).get_state()).node_info == {"n": {"slots": 2}}
        assert view_of_answer(client.update(step("m", s))).deadline is not None
    finally:
        client.close()


def test_racing_joins_each_get_in_with_their_one_request(make_server, make_client) -> None:
    server = make_server()
    s = settings(1, 100)
    clients = [make_client(server.url, node=f"n{i}") for i in range(8)]
    start = threading.Barrier(len(clients))
    seen: dict[str, NodeView] = {}

    def join(client: TcpBackend) -> None:
        node = client.node
        assert node is not None
        start.wait()
        for i in range(5):  # no retry: each answer holds the join it answers
            seen[f"{node}.{i}"] = view_of_answer(client.update(step(f"{node}.{i}", s)))

    threads = [threading.Thread(target=join, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert len(seen) == 40
    assert all(node in state.participants for node, state in seen.items())
    assert set(state_of(clients[0].get_state()).participants) == set(seen)


def test_the_handler_joins_without_reading_or_writing_the_state_itself(make_server, secret) -> None:
    server = make_server()
    s = settings(2, 2)
    handlers = [RendezvousHandler(NoCompareAndSet(server.url, secret, node=n), s, n) for n in "ab"]
    calls = [Later(h.next_rendezvous) for h in handlers]
    try:
        infos = [c.get() for c in calls]
        assert sorted((i.rank, i.world_size) for i in infos) == [(0, 2), (1, 2)]
    finally:
        for h in handlers:
            h.shutdown()
            h._backend.close()


# --- answers held while the node would wait -------------------------------------------------------


def test_a_waiting_join_is_answered_once_the_round_completes(make_server, make_client) -> None:
    server = make_server()
    s = settings(2, 2)
    a, b = make_client(server.url, node="a"), make_client(server.url, node="b")
    held = Later(lambda: a.update(step("a", s, wait=120.0)))
    assert held.running_after(0.3)  # waiting for the other node, not answered yet
    done = view_of_answer(b.update(step("b", s, wait=120.0)))
    assert (done.complete, done.rank) == (True, 1)
    answer = held.get()
    assert answer is not None
    assert answer[1] == b.get_state()[1]
    assert view_of_answer(answer).rank == 0


def joined(client: TcpBackend) -> int:
    current = client.get_state()
    return 0 if current is None else len(decode(current[0]).participants)


class CountingStore(StateStore):
    """Counts how often the server asks whether a held request is settled."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    def settled(self, kind: int, value: int, *, level: int = 0) -> bool:
        self.looks += 1
        return super().settled(kind, value, level=level)


def test_a_join_looks_only_at_the_held_requests_it_may_settle(make_server, make_client) -> None:
    # While a round fills, each join is a write that settles none of the held joins (they wait
    # for decisions): looking at every one of them after every join made a round O(nodes^2).
    store = CountingStore()
    server = make_server(store=store)
    n = 24
    s = settings(n, n)
    clients = [make_client(server.url, node=f"n{i:02d}") for i in range(n)]
    observer = make_client(server.url)
    held = []
    for c in clients[:-1]:  # one after the other: each join a write of its own
        held.append(Later(lambda c=c: c.update(step(c.node, s, wait=120.0))))
        wait_for(lambda: joined(observer) == len(held))
    assert all(h.running_after(0) for h in held)
    done = view_of_answer(clients[-1].update(step(clients[-1].node, s, wait=120.0)))
    assert done.complete
    assert all(view_of_answer(h.get()).complete for h in held)
    # Each join's own look when it is held, and one look at each held join when the last one
    # completes the round: 2n. Looking at every held join after every join: n^2 / 2 more.
    assert store.looks <= 2 * n, store.looks


def test_a_held_join_is_answered_when_the_last_call_ends(make_server, make_client) -> None:
    server = make_server()
    s = settings(1, 2, last_call=0.3)
    a = make_client(server.url, node="a")
    state = view_of_answer(Later(lambda: a.update(step("a", s, wait=120.0))).get())
    assert state.deadline is not None
    assert not state.complete  # the node completes it itself, once it sees the time is up
    assert view_of_answer(a.update(step("a", s))).complete


def test_a_step_without_wait_is_answered_at_once(make_server, make_client) -> None:
    server = make_server()
    a = make_client(server.url, node="a")
    assert view_of_answer(a.update(step("a", settings(2, 2)))).participants == {"a": 0}


def test_a_node_that_dies_while_its_join_is_held_is_lost(make_server, make_client) -> None:
    lost = LostLog()
    server = make_server(on_lost=lost, lost_grace=0.1)
    node = make_client(server.url, node="n1")
    held = Later(lambda: node.update(step("n1", settings(2, 2), wait=120.0)))
    wait_for(lambda: server.connected_nodes == {"n1"})
    assert held.running_after(0.2)
    drop(node)
    held.thread.join(WAIT)
    wait_for(lambda: lost.nodes() == ["n1"])


# --- decision watches -----------------------------------------------------------------------------


def test_decision_watch_sleeps_through_heartbeats_and_reports(make_server, make_client) -> None:
    server = make_server()
    s = settings(3, 3, interval=0.5)
    a, b = make_client(server.url, node="a"), make_client(server.url, node="b")
    a.update(step("a", s))
    _, token = b.update(step("b", s))
    waiter = make_client(server.url)
    woken = Later(lambda: waiter.watch_decisions(token, 120.0))
    time.sleep(0.6)  # a's heartbeat is due
    _, beat = a.update(step("a", s, KEEP_ALIVE, info={"load": 1.0}))
    assert beat > token
    state = state_of(a.get_state())
    reported = encode(replace(state, node_info={"a": {"x": 1}}))
    a.set_state(reported, beat)
    assert b.watch(token, 0.0)[1] == beat + 1  # a plain watch sees every change
    assert woken.running_after(0.3)  # the decision watch sleeps on
    left = b.update(step("b", s, EXIT))
    answer = woken.get()
    assert answer is not None
    assert left is not None
    assert answer[1] == left[1]
    assert set(state_of(answer).participants) == {"a"}  # a client of no node: the state
    assert (view_of_answer(left).joined, view_of_answer(left).rank) == (1, None)


@pytest.mark.parametrize("event", ["last call starts", "round completes", "closed"])
def test_decision_watch_wakes_on_what_decides(make_server, make_client, event: str) -> None:
    server = make_server()
    s = settings(2, 3) if event == "last call starts" else settings(3, 3)
    a, b = make_client(server.url, node="a"), make_client(server.url, node="b")
    _, token = a.update(step("a", s))
    if event == "round completes":
        _, token = a.update(step("c", s))
    woken = Later(lambda: a.watch_decisions(token, 120.0))
    assert woken.running_after(0.2)
    ops = (Operation.CLOSE,) if event == "closed" else (JOIN,)
    after = b.update(step("b", s, *ops))
    state = view_of_answer(woken.get())
    assert after is not None
    assert woken.result[1] == after[1]
    assert {
        "last call starts": state.deadline is not None,
        "round completes": state.complete,
        "closed": state.closed,
    }[event]


def test_decision_watch_sleeps_while_others_join_before_the_last_call(
    make_server, make_client
) -> None:
    server = make_server()
    s = settings(4, 4)
    a = make_client(server.url, node="a")
    _, token = a.update(step("a", s))
    woken = Later(lambda: a.watch_decisions(token, 120.0))
    other = make_client(server.url)
    other.update(step("b", s))
    other.update(step("c", s))
    assert woken.running_after(0.3)
    other.update(step("d", s))  # the fourth: the round completes
    assert view_of_answer(woken.get()).complete


# --- member watches (what an agent follows its round with) ----------------------------------------


def test_member_watch_sleeps_through_heartbeats_and_reports(make_server, make_client) -> None:
    server = make_server()
    s = settings(2, 2, interval=0.5)
    a, b = make_client(server.url, node="a"), make_client(server.url, node="b")
    a.update(step("a", s))
    _, token = b.update(step("b", s))
    woken = Later(lambda: make_client(server.url).watch_members(token, 120.0))
    time.sleep(0.6)  # a's heartbeat is due
    _, beat = a.update(step("a", s, KEEP_ALIVE, info={"load": 1.0}))
    assert beat > token
    reported = replace(state_of(a.get_state()), node_info={"a": {"x": 1}})
    a.set_state(encode(reported), beat)
    assert b.watch(token, 0.0)[1] == beat + 1  # a plain watch sees every change
    assert woken.running_after(0.3)  # the member watch sleeps on
    stopping = encode(replace(reported, stop_jobs=("job-1",)))
    _, stopped, won = a.set_state(stopping, beat + 1)
    assert won
    answer = woken.get()
    assert answer is not None
    assert answer[1] == stopped
    # What it answers a node: the state without the nodes' reports, which only the head reads.
    assert state_of(answer) == replace(decode(stopping), node_info={})


@pytest.mark.parametrize("event", ["a newcomer waits", "a node leaves", "closed"])
def test_member_watch_wakes_on_what_agents_follow(make_server, make_client, event: str) -> None:
    server = make_server()
    s = settings(2, 2)
    a, b = make_client(server.url, node="a"), make_client(server.url, node="b")
    a.update(step("a", s))
    _, token = b.update(step("b", s))  # a complete round of two
    woken = Later(lambda: a.watch_members(token, 120.0))
    assert woken.running_after(0.2)
    ops = {"a newcomer waits": (JOIN,), "a node leaves": (EXIT,), "closed": (Operation.CLOSE,)}
    node = "c" if event == "a newcomer waits" else "b"
    after = make_client(server.url, node=node).update(step(node, s, *ops[event]))
    state = view_of_answer(woken.get())
    assert after is not None
    assert woken.result[1] == after[1]
    assert {
        "a newcomer waits": state.waiting == 1,
        "a node leaves": state.joined == 1,
        "closed": state.closed,
    }[event]


# --- bad steps ------------------------------------------------------------------------------------


def wire(**changes: object) -> bytes:
    data = json.loads(step("n", settings(1, 2)).to_wire())
    for key, value in changes.items():
        if key in data["settings"]:
            data["settings"][key] = value
        else:
            data[key] = value
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        wire(v=99),
        wire(ops=["dance"]),
        wire(ops=[]),
        wire(node=""),
        wire(info=[1]),
        wire(min_nodes=3),  # above max_nodes
        wire(now="soon"),
        b'{"v":1}',
        wire().replace(b'"now":', b'"now":NaN,"x":'),
    ],
)
def test_malformed_steps_drop_the_connection_and_the_store_goes_on(
    make_server, secret, body: bytes
) -> None:
    server = make_server()
    chan = raw_session(server, secret)
    chan.send(b"U" + body)
    assert closed_by_peer(chan.sock)
    chan.sock.close()
    assert_serves(server, secret)


def test_a_step_that_would_grow_the_state_over_the_limit_is_not_stored(
    make_server, make_client
) -> None:
    limit = 4 << 20  # a store of 4 MB, as one of MAX_STATE refuses a state over its own
    server: StoreServer = make_server(store=StateStore(limit=limit))
    s = settings(1, 3)
    big = {"blob": "x" * (limit // 2 + 1024)}
    a, b = make_client(server.url, node="a"), make_client(server.url, node="b")
    _, token = a.update(step("a", s, info=big))
    refused = b.update(step("b", s, info=big))
    assert refused is not None
    assert refused[1] == token
    assert (view_of_answer(refused).joined, view_of_answer(refused).rank) == (1, None)
    assert view_of_answer(b.update(step("b", s, info={"small": 1}))).joined == 2


# --- nodes that expire while others wait ----------------------------------------------------------


class CountingSteps(TcpBackend):
    """Counts the steps its node sends."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.steps = 0

    def update(self, change):
        self.steps += 1
        return super().update(change)


def test_a_waiting_node_has_the_store_drop_a_node_that_expired(make_server, secret) -> None:
    # Its view cannot drop the dead node as a whole state could: one step has the store do it.
    server = make_server()
    s = RendezvousSettings(
        "steps",
        3,
        3,
        timeout=RendezvousTimeout(join=600.0, last_call=600.0),
        keep_alive_interval=5.0,
        keep_alive_max_attempt=1,
    )
    other = TcpBackend(server.url, secret)
    now = time.time()
    other.update(Step((JOIN,), "x", s, now - 4.7, now + 600.0))  # x expires in 0.3 s
    client = CountingSteps(server.url, secret, node="a")
    handler = RendezvousHandler(client, s, "a")
    joining = Later(handler.next_rendezvous)
    try:
        wait_for(lambda: set(state_of(other.get_state()).participants) == {"a"})
        assert client.steps <= 3, client.steps  # its join, then the step that dropped x
        for node in ("b", "c"):
            other.update(step(node, s))
        info = joining.get()
        assert (info.rank, info.world_size, info.leader) == (0, 3, "a")
    finally:
        handler.shutdown()
        client.close()
        other.close()
