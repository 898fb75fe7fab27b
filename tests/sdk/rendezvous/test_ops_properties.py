"""Properties of the rendezvous decisions over random runs of 2..12 simulated nodes.

The nodes share one state (as if every write won its compare-and-set) and one fake clock. Each
step is what a node's handler would do at that moment: one join decision (sanitize, decide,
apply), leaving (the exit op to its end), one heartbeat (the keep-alive op), or dying (no more
steps); or the clock moves on, by a little or by a lot. The invariants are checked after every
step, and at the end every node still joining must get an answer (complete or timeout).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.ops import (
    MUTATING_ACTIONS,
    Action,
    apply,
    exit_action,
    expired_nodes,
    join_action,
    keep_alive_action,
    rank_of,
    sanitize,
)
from clusterbook.rendezvous.state import RendezvousState

T0 = 1_700_000_000.0
INTERVAL = 1.0
KINDS = ["join"] * 6 + ["beat"] * 4 + ["tick"] * 3 + ["big-tick", "leave", "die"]
SELF_REMOVALS = {Action.REMOVE_FROM_PARTICIPANTS, Action.REMOVE_FROM_WAIT_LIST}

PROPERTY_SETTINGS = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass
class Node:
    name: str
    status: str = "idle"  # idle | joining | done | dead
    deadline: float = 0.0
    rank: int | None = None
    round: int | None = None


class Simulation:
    """One shared state, one clock, and the invariants checked at every change."""

    def __init__(self, settings: RendezvousSettings, n: int) -> None:
        self.s = settings
        self.now = T0
        self.state = RendezvousState()
        self.nodes = [Node(f"n{i}") for i in range(n)]
        self.completed: dict[int, dict[str, int]] = {}  # round -> ranks at completion
        self.answers = 0

    # --- what nodes do -------------------------------------------------------------------------

    def op_step(self, node: Node, op, deadline: float) -> Action:
        """One iteration of a handler's op loop, without the waiting."""
        before = self.state
        current = sanitize(before, self.s, self.now)
        action = op(current, node.name, self.s, self.now, deadline)
        if action in MUTATING_ACTIONS:
            current = apply(action, current, node.name, self.s, self.now)
        self.check(before, current, node.name, action)
        self.state = current
        return action

    def join_step(self, node: Node) -> None:
        if node.status == "dead":
            return
        if node.status == "done":  # next_rendezvous again: leave the round first
            self.leave(node)
        if node.status == "idle":
            node.status, node.deadline = "joining", self.now + self.s.timeout.join
        action = self.op_step(node, join_action, node.deadline)
        if action is Action.FINISH:
            node.status, node.round = "done", self.state.round
            node.rank = rank_of(self.state, node.name)
            assert node.rank is not None
            assert self.completed[node.round][node.name] == node.rank
            self.answers += 1
        elif action in (Action.ERROR_TIMEOUT, Action.ERROR_CLOSED):
            assert action is Action.ERROR_TIMEOUT  # nobody closes in this simulation
            assert self.now > node.deadline
            node.status = "idle"
            self.answers += 1

    def leave(self, node: Node) -> None:
        if node.status == "dead":
            return
        deadline = self.now + self.s.timeout.close
        for _ in range(4):
            if self.op_step(node, exit_action, deadline) is Action.FINISH:
                break
        else:
            raise AssertionError("the exit op did not finish")
        assert node.name not in self.state.last_heartbeats
        node.status, node.rank = "idle", None

    def beat(self, node: Node) -> None:
        if node.status != "done":
            return
        deadline = self.now + self.s.timeout.heartbeat
        for _ in range(3):
            if self.op_step(node, keep_alive_action, deadline) is Action.FINISH:
                break
        else:
            raise AssertionError("the keep-alive op did not finish")

    def run(self, kind: str, index: int, fraction: float) -> None:
        node = self.nodes[index % len(self.nodes)]
        if kind == "join":
            self.join_step(node)
        elif kind == "leave":
            self.leave(node)
        elif kind == "beat":
            self.beat(node)
        elif kind == "die":
            node.status = "dead"
        elif kind == "tick":
            self.now += fraction * INTERVAL
        else:  # big-tick: past heartbeats, last calls and maybe join deadlines
            self.now += INTERVAL + fraction * 3 * self.s.dead_after

    # --- invariants ----------------------------------------------------------------------------

    def check(self, before: RendezvousState, after: RendezvousState, actor: str, action) -> None:
        s, now = self.s, self.now
        parts, waiting = set(after.participants), after.wait_list

        assert after.round >= before.round
        assert not parts & waiting
        assert parts | waiting <= set(after.last_heartbeats)
        assert len(parts) <= s.max_nodes
        assert not expired_nodes(after, s, now), "a dead node survived a sanitize"

        # Nobody disappears early: only the actor itself (leaving, rolling back) or a node that
        # missed interval x attempts heartbeats, strictly.
        for gone in set(before.last_heartbeats) - set(after.last_heartbeats):
            if gone == actor and action in SELF_REMOVALS:
                continue
            last = before.last_heartbeats[gone]
            assert last + s.dead_after < now, f"{gone} removed {now - last:.3f}s after its beat"

        # The last call runs exactly while an incomplete round has min_nodes or more.
        if after.complete or len(parts) < s.min_nodes:
            assert after.deadline is None
        else:
            assert after.deadline is not None

        if after.complete:
            newly = not before.complete or before.round != after.round
            if newly:
                assert after.round not in self.completed, "a round completed twice"
                ranks = dict(after.participants)
                assert sorted(ranks.values()) == list(range(len(ranks)))
                assert ranks == {n: r for r, n in enumerate(sorted(ranks))}
                assert s.min_nodes <= len(ranks) <= s.max_nodes
                self.completed[after.round] = ranks
            at_completion = self.completed[after.round]
            # Ranks never change within a round; leavers leave gaps, nobody is renumbered.
            assert parts <= set(at_completion)
            for node, rank in after.participants.items():
                assert rank == at_completion[node]
            assert len(set(after.participants.values())) == len(parts)


def make_settings(min_nodes: int, max_nodes: int, attempts: int, last_call: float, join: float):
    return RendezvousSettings(
        "prop",
        min_nodes,
        max_nodes,
        timeout=RendezvousTimeout(join=join, last_call=last_call, close=5.0, heartbeat=1.0),
        keep_alive_interval=INTERVAL,
        keep_alive_max_attempt=attempts,
    )


@st.composite
def scenarios(draw):
    n = draw(st.integers(2, 12))
    min_nodes = draw(st.integers(1, n))
    max_nodes = draw(st.integers(min_nodes, n + 1))
    s = make_settings(
        min_nodes,
        max_nodes,
        attempts=draw(st.integers(1, 4)),
        last_call=draw(st.sampled_from([0.5, 2.0, 6.0])),
        join=draw(st.sampled_from([4.0, 20.0, 60.0])),
    )
    step = st.tuples(
        st.sampled_from(KINDS),
        st.integers(0, n - 1),
        st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False),
    )
    return s, n, draw(st.lists(step, min_size=20, max_size=150))


@PROPERTY_SETTINGS
@given(scenarios())
def test_random_runs_keep_the_invariants(scenario) -> None:
    s, n, steps = scenario
    sim = Simulation(s, n)
    for kind, index, fraction in steps:
        sim.run(kind, index, fraction)

    # Drain: the live nodes keep heartbeating and stepping; each one still joining gets an
    # answer (its round completes, or its join deadline passes) in bounded time.
    joining = [node for node in sim.nodes if node.status == "joining"]
    for _ in range(4 * int((s.timeout.join + 10) / 0.25)):
        if not any(node.status == "joining" for node in joining):
            break
        sim.now += 0.25
        for node in sim.nodes:
            sim.beat(node)
            if node.status == "joining":
                sim.join_step(node)
    assert not any(node.status == "joining" for node in joining), "a join never got an answer"


@PROPERTY_SETTINGS
@given(
    st.integers(1, 12).flatmap(
        lambda k: st.tuples(
            st.just(k),
            st.integers(1, k),
            st.integers(0, 4),
            st.permutations(range(k)),
            st.floats(0.0, 0.4, allow_nan=False),
        )
    )
)
def test_live_nodes_all_make_it_into_one_round(params) -> None:
    """k live nodes joining together: min(k, max_nodes) of them form round 0, ranked by sorted
    id, and the rest wait in the wait list; all within one last call."""
    k, min_nodes, extra, order, tick = params
    max_nodes = max(min_nodes, k - 2 + extra)  # sometimes fewer places than nodes
    s = make_settings(min_nodes, max_nodes, attempts=3, last_call=2.0, join=600.0)
    sim = Simulation(s, k)
    for _ in range(1_000):
        if sum(node.status == "done" for node in sim.nodes) >= min(k, max_nodes):
            break
        for i in order:
            sim.beat(sim.nodes[i])
            if sim.nodes[i].status != "done":
                sim.join_step(sim.nodes[i])
        sim.now += tick + 0.01
    done = sorted(node.name for node in sim.nodes if node.status == "done")
    assert len(done) == min(k, max_nodes)
    assert sim.completed == {0: {name: rank for rank, name in enumerate(done)}}
    waiting = {node.name for node in sim.nodes} - set(done)
    assert sim.state.wait_list == waiting
    assert all(node.status == "joining" for node in sim.nodes if node.name in waiting)
