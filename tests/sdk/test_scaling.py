"""The pure decisions of scale() and adapt() (clusterbook.scaling), with a made-up queue of
allocations and an injected clock; and what scale() says on a cluster that cannot scale."""

from __future__ import annotations

import pytest

import clusterbook as cb
from clusterbook.scaling import (
    Adapt,
    Allocation,
    ScalePlan,
    adapt_target,
    check_target,
    idle_since,
    nodes_wanted,
    plan_scale,
    releasable,
)
from clusterbook.testing import FakeProvider

FIRST = Allocation("10", 2, "RUNNING", first=True)


def queue(*more: int) -> list[Allocation]:
    """The cluster's first job (2 nodes) and one job of ``n`` nodes for each of ``more``."""
    return [FIRST, *(Allocation(str(11 + i), n, "RUNNING") for i, n in enumerate(more))]


def test_growing_submits_the_nodes_missing_one_job_each():
    assert plan_scale(5, queue(1), {"11"}) == ScalePlan(submit=2)
    assert plan_scale(3, queue(1), {"11"}) == ScalePlan()


def test_shrinking_cancels_the_newest_it_may_and_never_the_first():
    everything = {"10", "11", "12", "13"}
    assert plan_scale(3, queue(1, 1, 1), everything) == ScalePlan(release=("13", "12"))
    assert plan_scale(2, queue(1, 1, 1), everything) == ScalePlan(release=("13", "12", "11"))
    assert plan_scale(1, queue(1), everything) == ScalePlan(release=("11",), kept=1)


def test_shrinking_skips_the_jobs_it_may_not_cancel_and_says_what_stays():
    assert plan_scale(2, queue(1, 1, 1), {"11", "12"}) == ScalePlan(release=("12", "11"), kept=1)
    assert plan_scale(2, queue(2, 1), {"11", "12"}) == ScalePlan(release=("12", "11"))


def test_shrinking_never_goes_below_the_target_with_whole_jobs():
    assert plan_scale(3, queue(2), {"11"}) == ScalePlan(kept=1)


@pytest.mark.parametrize(
    ("target", "match"),
    [
        (0, r"scale\(0\) asks for 0 node\(s\), fewer than the cluster's min_nodes=1"),
        (5, r"more than the cluster's max_nodes=4; make the cluster with .*max_nodes=5"),
        ("2", r"scale\(0\) takes a whole number of nodes, got '2'"),
        (True, "got True"),
    ],
)
def test_a_size_out_of_bounds_is_a_config_error_saying_how_to_allow_it(target, match):
    with pytest.raises(cb.ConfigError, match=match):
        check_target(target, 1, 4, "scale(0)" if target in (0, "2", True) else "scale(5)")


def test_adapt_checks_its_bounds_and_durations():
    assert Adapt.make(1, 3, "2s", "1m", (1, 4)) == Adapt(1, 3, 2.0, 60.0)
    with pytest.raises(cb.ConfigError, match="minimum must be at most maximum"):
        Adapt.make(3, 2, "2s", "1m", (1, 4))
    with pytest.raises(cb.ConfigError, match="max_nodes=4"):
        Adapt.make(1, 8, "2s", "1m", (1, 4))
    with pytest.raises(cb.ConfigError, match="interval"):
        Adapt.make(1, 2, 0, "1m", (1, 4))


def test_the_nodes_jobs_want_are_their_ranks_beyond_the_slots_in_whole_nodes():
    assert nodes_wanted(asked=4, slots=2, per_node=2) == 1
    assert nodes_wanted(asked=5, slots=2, per_node=2) == 2
    assert nodes_wanted(asked=2, slots=4, per_node=2) == 0
    assert nodes_wanted(asked=3, slots=0, per_node=0) == 3


def test_adapt_grows_to_what_jobs_want_within_the_maximum_and_else_keeps_the_busy_nodes():
    adapt = Adapt(minimum=1, maximum=4)
    assert adapt_target(adapt, nodes=2, busy=2, more=1) == 3
    assert adapt_target(adapt, nodes=2, busy=2, more=5) == 4
    assert adapt_target(adapt, nodes=3, busy=1, more=0) == 1
    assert adapt_target(adapt, nodes=3, busy=0, more=0) == 1  # never below the minimum


def test_an_allocation_goes_once_idle_for_the_grace_period_by_the_clock_given():
    adapt = Adapt(minimum=1, maximum=6, grace=10.0)
    idle = idle_since({}, ["10", "11", "12"], busy={"10"}, now=100.0)
    assert idle == {"11": 100.0, "12": 100.0}
    idle = idle_since(idle, ["10", "11", "12"], busy={"12"}, now=105.0)  # 12 ran ranks again
    assert idle == {"10": 105.0, "11": 100.0}
    assert releasable(adapt, idle, now=109.0) == set()
    assert releasable(adapt, idle, now=110.0) == {"11"}
    assert releasable(adapt, idle, now=115.0) == {"10", "11"}
    # A waiting queue: a job wants 2 more nodes, the idle one stays (it is wanted).
    allocations = queue(1, 1)
    target = adapt_target(adapt, nodes=4, busy=2, more=2)
    assert plan_scale(target, allocations, releasable(adapt, idle, 115.0)) == ScalePlan(submit=2)
    # Nothing wanted: the idle ones beyond the busy go, newest first.
    target = adapt_target(adapt, nodes=4, busy=2, more=0)
    assert plan_scale(target, allocations, {"11", "12"}) == ScalePlan(release=("12", "11"))


@pytest.mark.parametrize("what", ["scale", "adapt"])
def test_scale_and_adapt_on_a_cluster_that_cannot_say_which_kinds_can(what, tmp_path):
    with cb.Cluster(FakeProvider(nodes=2)) as cluster:
        call = (lambda: cluster.scale(3)) if what == "scale" else (lambda: cluster.adapt(1, 3))
        with pytest.raises(cb.ConfigError, match=rf"cluster.{what}\(\) grows and shrinks Slurm"):
            call()
