"""Failing nodes set aside: the policy, the bench (its clock injected), which nodes an
attempt's ending counts against, and the nodes an attempt may run on."""

from __future__ import annotations

import pytest

from clusterbook.errors import ClusterStateError, ConfigError, NodeLostError
from clusterbook.launch.nodes import NodeSource, nodes_for_attempt, usable_nodes
from clusterbook.launch.result import JobResult, RankFailure
from clusterbook.launch.setaside import (
    IDLE_DROP,
    Bench,
    SetAsidePolicy,
    failed_nodes,
    idle_drops,
    with_aside,
)
from clusterbook.spec import NodeSpec
from clusterbook.status import ClusterSnapshot, NodeStatus, nodes_frame
from clusterbook.views.html import render_nodes


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_three_failures_in_the_window_set_a_node_aside_for_its_cooldown():
    clock = Clock()
    bench = Bench(SetAsidePolicy(failures=3, window=600, cooldown=60), clock)
    assert bench.note({"n1": "rank 0 exited 1"}) == []
    clock.now += 10
    assert bench.note({"n1": "rank 0 exited 1", "n2": "rank 2 exited 1"}) == []
    clock.now += 10
    assert bench.note({"n1": "rank 1 exited 3"}) == ["n1"]
    aside = bench.aside()
    assert list(aside) == ["n1"]
    assert aside["n1"].until == clock.now + 60
    assert aside["n1"].reason == "3 failures in 10 min (last: rank 1 exited 3)"
    clock.now += 59.9
    assert "n1" in bench.aside()
    clock.now += 0.2
    assert bench.aside() == {}  # the cool-down ended


def test_failures_older_than_the_window_do_not_count():
    clock = Clock()
    bench = Bench(SetAsidePolicy(failures=3, window=100, cooldown=60), clock)
    bench.note({"n1": "x"})
    clock.now += 60
    bench.note({"n1": "x"})
    clock.now += 60  # the first is out of the window now
    assert bench.note({"n1": "x"}) == []
    assert bench.note({"n1": "x"}) == ["n1"]


def test_the_cooldown_doubles_each_time_up_to_the_limit():
    clock = Clock()
    bench = Bench(SetAsidePolicy(failures=1, window=10, cooldown=60, limit=200), clock)
    lengths = []
    for _ in range(4):
        assert bench.note({"n1": "x"}) == ["n1"]
        until = bench.aside()["n1"].until
        lengths.append(until - clock.now)
        clock.now = until + 1
    assert lengths == [60, 120, 200, 200]


def test_a_failure_while_aside_changes_nothing_and_reinstate_brings_the_node_back():
    clock = Clock()
    bench = Bench(SetAsidePolicy(failures=2, window=600, cooldown=60), clock)
    bench.note({"n1": "x"})
    bench.note({"n1": "x"})
    until = bench.aside()["n1"].until
    clock.now += 5
    assert bench.note({"n1": "late"}) == []
    assert bench.aside()["n1"].until == until
    assert bench.reinstate("n1") is True
    assert bench.aside() == {}
    assert bench.reinstate("n1") is False  # not aside any more
    assert bench.reinstate("never-failed") is False
    # Its failures were forgotten: one more is not enough; two set it aside for twice as long.
    assert bench.note({"n1": "x"}) == []
    assert bench.note({"n1": "x"}) == ["n1"]
    assert bench.aside()["n1"].until == clock.now + 120


def test_the_last_node_not_aside_is_never_set_aside():
    clock = Clock()
    bench = Bench(SetAsidePolicy(failures=1), clock)
    assert bench.note({"only": "x"}, ["only"]) == []  # a one-node cluster: failures only
    assert bench.note({"a": "x"}, ["a", "b"]) == ["a"]
    assert bench.note({"b": "x"}, ["a", "b"]) == []  # a is aside: b is the last
    clock.now += 61  # a's cool-down ended
    assert bench.note({"b": "x"}, ["a", "b"]) == ["b"]


def test_failures_zero_never_sets_a_node_aside():
    bench = Bench(SetAsidePolicy.make(False), Clock())
    for _ in range(10):
        assert bench.note({"n1": "x"}) == []
    assert bench.aside() == {}


def test_the_policy_is_made_from_what_the_user_gives():
    assert SetAsidePolicy.make(None) == SetAsidePolicy.make(True) == SetAsidePolicy()
    made = SetAsidePolicy.make({"failures": 2, "window": "5m", "cooldown": "30s"})
    assert made == SetAsidePolicy(failures=2, window=300, cooldown=30, limit=3600)
    # A limit below the first cool-down is the cool-down.
    assert SetAsidePolicy.make({"cooldown": "2h"}).limit == 7200
    with pytest.raises(ConfigError, match=r"'tries'.*the keys are 'failures'"):
        SetAsidePolicy.make({"tries": 3})
    with pytest.raises(ConfigError, match=r"failures -1 must be a whole number >= 0"):
        SetAsidePolicy.make({"failures": -1})
    with pytest.raises(ConfigError, match=r"set_aside=3 is not a set-aside policy.*False"):
        SetAsidePolicy.make(3)
    with pytest.raises(ConfigError, match="cooldown"):
        SetAsidePolicy.make({"cooldown": "soon"})


NODES = (NodeSpec("a", "10.0.0.1", 2), NodeSpec("b", "10.0.0.2", 2))


def result(*failed: tuple[int, int]) -> JobResult:
    failures = tuple(RankFailure(rank, "h", code, ()) for rank, code in failed)
    return JobResult("job-0001", 1, {r: c for r, c in failed}, failures, 1.0)


def test_an_attempt_counts_against_the_nodes_of_the_ranks_that_failed_and_a_lost_node():
    # Four ranks on two nodes of two slots: ranks 0-1 on a, 2-3 on b.
    assert failed_nodes(NODES, 4, result((3, 1)), None) == {"b": "rank 3 exited 1"}
    assert failed_nodes(NODES, 4, result((0, 2), (1, 2)), None) == {"a": "rank 0 exited 2"}
    lost = NodeLostError("gone", node="a", host="10.0.0.1")
    assert failed_nodes(NODES, 4, result(), lost) == {"a": "node lost"}
    assert failed_nodes(NODES, 4, result(), None) == {}  # cancelled, timed out: no one's fault


def source(aside: set[str]) -> NodeSource:
    return NodeSource(
        nodes=lambda: NODES,
        known=lambda: [n.name for n in NODES],
        unreachable=lambda names, **how: {},
        remote=lambda: None,
        lost_for_good=lambda: None,
        join_command=lambda: None,
        bounds=lambda: None,
        aside=lambda: aside,
    )


def test_a_node_lost_while_idle_counts_once_per_drop_and_a_busy_one_not_at_all():
    dropped, counted = idle_drops({"n2": 1}, {}, set())
    assert dropped == {"n2": IDLE_DROP}
    # No loss since: the same drop, not another.
    again, counted = idle_drops({"n2": 1}, counted, set())
    assert again == {}
    # Lost again, and back before this look: still a drop (a late look misses none). n1
    # runs ranks: its attempt's end counts it, and it is not news at the next look.
    dropped, counted = idle_drops({"n1": 1, "n2": 2}, counted, {"n1"})
    assert dropped == {"n2": IDLE_DROP}
    assert counted == {"n1": 1, "n2": 2}
    assert idle_drops({"n1": 1, "n2": 2}, counted, set())[0] == {}


def test_an_agent_dropping_three_times_while_idle_sets_its_node_aside():
    clock = Clock()
    bench = Bench(SetAsidePolicy(), clock)
    counted: dict[str, int] = {}
    for times in range(1, 4):
        dropped, counted = idle_drops({"n2": times}, counted, set())
        bench.note(dropped, ["n1", "n2"])
        clock.now += 5
    assert bench.aside()["n2"].reason == f"3 failures in 10 min (last: {IDLE_DROP})"


@pytest.mark.parametrize("restart", [False, True])
def test_an_attempt_runs_without_the_nodes_set_aside(restart: bool):
    placed, _ = nodes_for_attempt("c", source({"b"}), restart=restart, running=lambda: True)
    assert placed == NODES[:1]
    assert usable_nodes("c", source({"b"})) == NODES  # a new job is not refused its nodes
    # At once, a restart too: a round that formed is not waited for again (wait=3600 would
    # hang the test past its timeout).
    with pytest.raises(ClusterStateError, match=r"Every node of cluster 'c' is set aside.*reinst"):
        nodes_for_attempt("c", source({"a", "b"}), restart=restart, running=lambda: True, wait=3600)


def test_a_node_set_aside_shows_so_with_why_and_until_when():
    statuses = [
        NodeStatus("a", "10.0.0.1", 2, "joined"),
        NodeStatus("b", "10.0.0.2", 2, "joined"),
        NodeStatus("c", "10.0.0.3", 2, "lost"),
    ]
    clock = Clock()
    bench = Bench(SetAsidePolicy(failures=1), clock)
    bench.note({"b": "rank 2 exited 1", "c": "node lost"})
    shown = with_aside(statuses, bench.aside())
    assert [s.state for s in shown] == ["joined", "set-aside", "lost"]
    assert shown[1].last_reason == "1 failures in 10 min (last: rank 2 exited 1)"
    assert shown[1].until == clock.now + 60
    snapshot = ClusterSnapshot(
        name="c", kind="ssh", state="running", nodes=tuple(shown), jobs=(), launcher=None,
        run_dir="/tmp", uptime=1.0, problem=None,
    )  # fmt: skip
    frame = nodes_frame(snapshot)
    assert list(frame.state) == ["joined", "set-aside", "lost"]
    assert frame.until.isna().tolist() == [True, False, True]
    assert frame.until[1].timestamp() == clock.now + 60
    html = render_nodes(snapshot)
    assert "set-aside" in html
    assert "3 failures" not in html  # node c is lost: shown so, not set aside
    assert "1 failures in 10 min (last: rank 2 exited 1) until " in html
