"""How a cluster made of batch allocations grows and shrinks: the pure decisions.

A Slurm cluster's nodes come from allocations: its first batch job, and those
``cluster.scale(n)`` or ``cluster.adapt(...)`` submitted since, one node each. These functions
take what the head knows (the allocations, which of them run ranks, how many nodes the jobs
ask for, the clock) and say what to do: how many allocations to submit, which to cancel. The
head runs the commands (:mod:`clusterbook.cluster.resize`).

- :func:`plan_scale`: to reach ``target`` nodes, submit the nodes missing, or cancel whole
  allocations, the newest first, among those it may (never the first, never one whose nodes
  run ranks of a job that cannot be resized), and never going below ``target``.
- :func:`adapt_target` and :func:`idle_since`: ``adapt(minimum, maximum)`` grows while the
  jobs ask for more slots than the nodes give, and lets go of an allocation once its nodes
  have run no ranks for ``grace`` seconds.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from clusterbook.durations import duration
from clusterbook.errors import ConfigError

__all__ = [
    "Adapt",
    "Allocation",
    "ScalePlan",
    "adapt_target",
    "check_target",
    "idle_since",
    "nodes_wanted",
    "plan_scale",
]


@dataclass(frozen=True, slots=True)
class Allocation:
    """One batch job of the cluster, as the decisions see it: its id, the nodes it holds or
    waits for, Slurm's state and reason, and whether it is the cluster's first (never
    cancelled by scaling: the cluster ends with it)."""

    id: str
    nodes: int
    state: str = "PENDING"
    reason: str | None = None
    first: bool = False


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """What reaching a size takes: ``submit`` single-node allocations, and cancelling
    ``release`` (newest first); ``kept``: nodes above the target that stay, because the
    allocations that hold them may not be cancelled now."""

    submit: int = 0
    release: tuple[str, ...] = ()
    kept: int = 0


def check_target(target: object, least: int, most: int, what: str) -> int:
    """``target`` nodes, checked against the cluster's ``(least, most)``: a ConfigError naming
    the value, the bound and how to make a cluster that allows it."""
    if isinstance(target, bool) or not isinstance(target, int):
        raise ConfigError(f"{what} takes a whole number of nodes, got {target!r}.")
    if target < least:
        raise ConfigError(
            f"{what} asks for {target} node(s), fewer than the cluster's min_nodes={least}; "
            f"make the cluster with Cluster.slurm(..., min_nodes={max(target, 1)}) to go that low."
        )
    if target > most:
        raise ConfigError(
            f"{what} asks for {target} node(s), more than the cluster's max_nodes={most}; "
            f"make the cluster with Cluster.slurm(..., max_nodes={target}) to grow that far."
        )
    return target


def plan_scale(
    target: int, allocations: Sequence[Allocation], releasable: Collection[str]
) -> ScalePlan:
    """What takes ``allocations`` (oldest first) to ``target`` nodes: the nodes missing as new
    allocations, or the newest of those ``releasable`` cancelled while the nodes left stay at
    least ``target`` (whole allocations: a cluster may end above it, never below)."""
    total = sum(a.nodes for a in allocations)
    if target >= total:
        return ScalePlan(submit=target - total)
    release = []
    for allocation in reversed(allocations):
        if total == target:
            break
        if allocation.first or allocation.id not in releasable:
            continue
        if total - allocation.nodes >= target:
            release.append(allocation.id)
            total -= allocation.nodes
    return ScalePlan(release=tuple(release), kept=total - target)


@dataclass(frozen=True, slots=True)
class Adapt:
    """``cluster.adapt(minimum, maximum, interval, grace)``, checked: the size stays within
    ``[minimum, maximum]``; every ``interval`` seconds the head looks again; an allocation
    whose nodes ran no ranks for ``grace`` seconds may go."""

    minimum: int
    maximum: int
    interval: float = 30.0
    grace: float = 60.0

    @classmethod
    def make(
        cls,
        minimum: object,
        maximum: object,
        interval: object,
        grace: object,
        bounds: tuple[int, int],
    ) -> Adapt:
        least = check_target(minimum, bounds[0], bounds[1], "adapt(minimum=...)")
        most = check_target(maximum, bounds[0], bounds[1], "adapt(maximum=...)")
        if least > most:
            raise ConfigError(
                f"adapt(minimum={least}, maximum={most}): minimum must be at most maximum."
            )
        every = duration(interval, "interval")
        if every <= 0:
            raise ConfigError(f"adapt(interval=...) must be more than 0 s, got {interval!r}.")
        return cls(least, most, every, duration(grace, "grace"))


def nodes_wanted(asked: int, slots: int, per_node: int) -> int:
    """Nodes the jobs want beyond those they have: the slots ``asked`` by the running jobs
    (their ranks) above the ``slots`` the nodes give, in nodes of ``per_node`` slots."""
    return math.ceil(max(0, asked - slots) / max(per_node, 1))


def adapt_target(adapt: Adapt, *, nodes: int, busy: int, more: int) -> int:
    """The size to aim for: ``nodes`` (held or waited for) plus the ``more`` the jobs want,
    when they want some; else the ``busy`` nodes (those running ranks), so that idle ones may
    go; within ``[minimum, maximum]``."""
    target = nodes + more if more else busy
    return max(adapt.minimum, min(adapt.maximum, target))


def idle_since(
    before: Mapping[str, float], ids: Collection[str], busy: Collection[str], now: float
) -> dict[str, float]:
    """Since when each allocation of ``ids`` has been idle (its nodes running no ranks): what
    ``before`` said, ``now`` for one that just became idle; busy ones are not in it."""
    return {i: before.get(i, now) for i in ids if i not in busy}


def releasable(adapt: Adapt, idle: Mapping[str, float], now: float) -> set[str]:
    """The allocations idle for at least the grace period."""
    return {i for i, since in idle.items() if now - since >= adapt.grace}
