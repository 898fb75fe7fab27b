"""A node's agent between rounds, on an in-memory store: what it waits with."""

from __future__ import annotations

import threading
import time
from typing import Any

from clusterbook.rendezvous import registry
from clusterbook.rendezvous.agent import EXIT_CLOSED, FIRST_CONTACT, Agent
from clusterbook.rendezvous.api import RendezvousConnectionError, Token
from clusterbook.rendezvous.backends.memory import MemoryBackend
from clusterbook.rendezvous.state import decode

# A join URL whose store is nowhere: the agents here are given theirs (``backends``).
NOWHERE = (
    "tcp://127.0.0.1:1/run1?fingerprint=sha256:" + "0" * 64 + "&min=1&max=1&last_call=0.1&join=30"
)


class Spy(MemoryBackend):
    """One store for the agent's connections, recording how it follows its round (the first
    such watch stops the agent) and the tokens its updates ended on."""

    def __init__(self) -> None:
        super().__init__()
        self.agent: Agent | None = None
        self.calls: list[str] = []
        self.tokens: list[Token | None] = []
        self.updated: list[Token] = []

    def update(self, change: Any) -> tuple[bytes, Token] | None:
        after = super().update(change)
        if after is not None:
            self.updated.append(after[1])
        return after

    def _stop(self, call: str, token: Token | None) -> tuple[bytes, Token] | None:
        self.calls.append(call)
        self.tokens.append(token)
        assert self.agent is not None
        self.agent.stop_event.set()
        return super().watch(token, 0.0)

    def watch(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        return self._stop("watch", token)

    def watch_members(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        return self._stop("watch_members", token)

    def watch_decisions(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        return super().watch(token, timeout)  # a join's wait: not what is looked at here


def test_an_agent_follows_its_round_with_a_member_watch() -> None:
    # A plain watch would wake every node at every node's heartbeat (N answers, N times a
    # second); a member watch sleeps through heartbeats and reports.
    store = Spy()
    url = NOWHERE + "&interval=1&attempts=3"
    agent = store.agent = Agent(url, b"s" * 32, "node1", 1, backends=lambda *_a, **_k: store)
    assert agent.run() == EXIT_CLOSED
    assert store.calls == ["watch_members"]
    current = store.get_state()
    assert current is not None
    assert decode(current[0]).participants == {}  # it joined, then left cleanly


def test_an_agent_watches_from_the_state_its_join_ended_on() -> None:
    # Not from nothing: a watch without a token is answered at once, with what the join's
    # answer already said (a round trip and a state per node, at every start).
    store = Spy()
    url = NOWHERE + "&interval=1&attempts=3"
    agent = store.agent = Agent(url, b"s" * 32, "node1", 1, backends=lambda *_a, **_k: store)
    assert agent.run() == EXIT_CLOSED
    assert store.calls == ["watch_members"]
    assert store.tokens == [store.updated[0]]


class Unreachable(Spy):
    """The Spy's store, out of reach for its first ``seconds`` (its packets dropped)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self._until = time.monotonic() + seconds
        self.refused = 0

    def _reachable(self) -> None:
        if time.monotonic() < self._until:
            self.refused += 1
            raise RendezvousConnectionError("no answer within 1 s")

    def update(self, change: Any) -> tuple[bytes, Token] | None:
        self._reachable()
        return super().update(change)

    def watch_members(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        self._reachable()
        return super().watch_members(token, timeout)


def test_an_agent_that_never_reached_its_store_keeps_trying_past_its_lease() -> None:
    # Its head waits for it meanwhile: a network that drops the first packets (seen on a
    # loaded machine, for 3-4 s) must not make it give up, clean up and exit after its lease.
    store = Unreachable(seconds=2.5)
    url = NOWHERE + "&interval=1&attempts=3"
    agent = store.agent = Agent(
        url, b"s" * 32, "node1", 1, lease=1.0, backends=lambda *_a, **_k: store
    )
    assert agent.run() == EXIT_CLOSED  # joined, and followed its round
    assert store.refused > 1
    assert store.calls == ["watch_members"]


def test_an_agent_that_reached_its_store_gives_up_after_its_lease() -> None:
    store = Unreachable(seconds=0.0)
    url = NOWHERE + "&interval=1&attempts=3"
    agent = Agent(url, b"s" * 32, "node1", 1, lease=0.5, backends=lambda *_a, **_k: store)
    agent._reached = True  # as after its first answer
    started = time.monotonic()
    assert not agent._wait_for_store(Unreachable(seconds=60.0), RuntimeError("gone"))
    assert time.monotonic() - started < FIRST_CONTACT / 2  # the lease, not the first contact


class Beats(MemoryBackend):
    """Records the steps sent; stops the agent once it has followed its round for a while."""

    def __init__(self, follow: float) -> None:
        super().__init__()
        self.agent: Agent | None = None
        self.steps: list[tuple[str, ...]] = []
        self._follow = follow
        self._since: float | None = None

    def update(self, change: Any) -> tuple[bytes, Token] | None:
        self.steps.append(tuple(op.value for op in change.operations))
        return super().update(change)

    def watch(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        # (Every watch an agent follows its round with: it ends, however it watches.)
        assert self.agent is not None
        self._since = self._since or time.monotonic()
        if time.monotonic() - self._since > self._follow:
            self.agent.stop_event.set()
        return super().watch(token, timeout)

    def watch_members(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        return self.watch(token, timeout)

    def watch_decisions(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        return super().watch(token, timeout)  # a join's wait


def test_an_agent_heartbeats_between_its_watches_over_one_connection() -> None:
    # One connection per node at the head (one TLS session to set up, one socket to keep): the
    # agent's own thread sends its heartbeats between its watches.
    store = Beats(follow=1.0)
    made = []
    url = NOWHERE + "&interval=0.2&attempts=5"
    agent = store.agent = Agent(
        url, b"s" * 32, "node1", 1, backends=lambda *a, **k: made.append(k) or store
    )
    assert agent.run() == EXIT_CLOSED
    assert [k["node"] for k in made] == ["node1"]  # one store client, which names its node
    beats = store.steps.count(("keep_alive",))
    assert 3 <= beats <= 10, store.steps  # every 0.2 s for 1 s
    assert not [t for t in threading.enumerate() if "heartbeat" in t.name]


_WARMED_AGENT = r"""
import runpy, sys
from clusterbook.nodes.tasks.session import warm
from clusterbook.rendezvous.agent import AGENT_IMPORTS
warm(AGENT_IMPORTS)
before = set(sys.modules)
from clusterbook.rendezvous import agent
agent.Agent.run = lambda self: print(sorted(set(sys.modules) - before)) or 0
sys.argv = ["clusterbook", "worker", "join", sys.argv[1], "--token-file", sys.argv[2],
            "--node-id", "n1", "--slots", "1"]
runpy.run_module("clusterbook", run_name="__main__", alter_sys=True)
"""


def test_a_session_warmed_for_the_agent_leaves_it_nothing_to_import(tmp_path) -> None:
    # A bootstrap session imports AGENT_IMPORTS before it forks the node's agent: what the
    # agent imports after that is paid on the way to the cluster being ready.
    import subprocess
    import sys

    from clusterbook.rendezvous.api import RendezvousSettings
    from clusterbook.rendezvous.backends.tcp import write_secret

    token = tmp_path / "token"
    write_secret(token)
    url = registry.join_url(
        "tcp://127.0.0.1:1?fingerprint=sha256:" + "0" * 64, RendezvousSettings("r", 1, 1)
    )
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", _WARMED_AGENT, url, str(token)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"the agent still imports {proc.stdout.strip()}"
