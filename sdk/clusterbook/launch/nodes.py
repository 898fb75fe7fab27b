"""Which nodes a job's attempt runs on: the cluster's (none lost) for a first run or a retry,
those left for a restart; and what a change of the nodes does to running jobs (a lost node
fails them, a grown round restarts those that asked for it)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterbook.errors import ClusterStateError, NodeLostError
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.spec import NodeSpec

if TYPE_CHECKING:  # the job imports these decisions
    from clusterbook.launch.job import Job

__all__ = [
    "RESTART_WAIT",
    "NodeSource",
    "Placement",
    "fail_on_lost_nodes",
    "lost_node",
    "nodes_for_attempt",
    "remaining_nodes",
    "restart_grown_jobs",
    "usable_nodes",
    "warn_ranks",
]

Placement = tuple[tuple[NodeSpec, ...], RemoteLaunch | None]
"""The nodes of an attempt, and how the launcher reaches them (None: on this machine)."""


Unreachable = Callable[..., dict[str, str]]


@dataclass(frozen=True, slots=True)
class NodeSource:
    """What a job asks of where its cluster's nodes come from, each a question asked when the
    answer is needed (:func:`clusterbook.providers.base.node_source` asks a provider).

    ``nodes``: the nodes jobs run on now; ``known``: the name of every node the cluster
    knows, lost ones too; ``unreachable(names, lost_only=...)``: of those, the ones lost or
    silent, with a sentence each; ``remote``: how the launcher reaches the nodes;
    ``lost_for_good``: why lost nodes cannot come back, if they cannot; ``join_command``: how
    nodes join by themselves, if they do; ``bounds``: ``(min_nodes, max_nodes)``, if the
    cluster's size may change."""

    nodes: Callable[[], tuple[NodeSpec, ...]]
    known: Callable[[], list[str]]
    unreachable: Unreachable
    remote: Callable[[], RemoteLaunch | None]
    lost_for_good: Callable[[], str | None]
    join_command: Callable[[], str | None]
    bounds: Callable[[], tuple[int, int] | None]
    # The nodes set aside now (clusterbook.launch.setaside), which no attempt runs on.
    aside: Callable[[], Collection[str]] = frozenset


#: How long a restart waits for a complete round of enough nodes (an elastic cluster's nodes
#: join again after one was lost).
RESTART_WAIT = 60.0


def usable_nodes(cluster: str, source: NodeSource) -> tuple[NodeSpec, ...]:
    """The nodes of ``source``, if a job can start on them: none was lost for good (the
    provider's own words), there are some, and none of them was lost."""
    if gone := source.lost_for_good():
        raise ClusterStateError(gone)
    nodes = source.nodes()
    if not nodes:
        lost = source.unreachable(source.known(), lost_only=True)
        if not lost:
            raise ClusterStateError(
                f"Cluster {cluster!r} has no nodes yet; call cluster.wait_ready() first."
            )
        join = source.join_command()
        raise ClusterStateError(
            f"Cluster {cluster!r} has no nodes now: {'; '.join(lost.values())}. "
            + (f"Nodes join with: {join}; " if join else "")
            + "cluster.wait_ready() returns once enough of them joined again."
        )
    lost = source.unreachable([n.name for n in nodes], lost_only=True)
    if lost:
        raise ClusterStateError(
            f"Cluster {cluster!r} lost {len(lost)} of its nodes: {'; '.join(lost.values())}. "
            "Stop it and start a new one (or, for an elastic cluster, wait for the next round "
            "with cluster.wait_ready())."
        )
    return nodes


def without_aside(
    cluster: str, nodes: tuple[NodeSpec, ...], aside: Collection[str]
) -> tuple[NodeSpec, ...]:
    """``nodes`` but those set aside; a clear error when that leaves none."""
    left = tuple(n for n in nodes if n.name not in aside)
    if not left:
        named = ", ".join(n.name for n in nodes)
        raise ClusterStateError(
            f"Every node of cluster {cluster!r} is set aside for failing ({named}); see "
            "cluster.status() for why and until when, or bring one back with "
            "cluster.reinstate(node)."
        )
    return left


def remaining_nodes(
    cluster: str,
    nodes: tuple[NodeSpec, ...],
    unreachable: Unreachable,
    bounds: tuple[int, int] | None,
) -> tuple[NodeSpec, ...]:
    """The ``nodes`` not lost, for a restart: at least one, and ``bounds``' minimum."""
    lost = unreachable([n.name for n in nodes], lost_only=True)
    left = tuple(n for n in nodes if n.name not in lost)
    least = bounds[0] if bounds else 1
    if len(left) < least:
        raise ClusterStateError(
            f"Cluster {cluster!r} has {len(left)} nodes left, fewer than the {least} it needs "
            f"({'; '.join(lost.values()) or 'its nodes were lost'})."
        )
    return left


def nodes_for_attempt(
    cluster: str,
    source: NodeSource,
    *,
    restart: bool,
    running: Callable[[], bool],
    wait: float = RESTART_WAIT,
) -> Placement:
    """Where a retry runs (the cluster's nodes, none lost) or a restart (the nodes left, at
    least the cluster's minimum: waiting up to ``wait`` seconds for an elastic cluster's
    round to form again), but those set aside, and how the launcher reaches them."""
    give_up = time.monotonic() + wait
    while True:
        if not running():
            raise ClusterStateError(f"Cluster {cluster!r} is not running any more.")
        if not restart:
            usable = usable_nodes(cluster, source)
            return without_aside(cluster, usable, source.aside()), source.remote()
        try:
            left = remaining_nodes(cluster, source.nodes(), source.unreachable, source.bounds())
        except ClusterStateError:  # the round has not formed again (yet)
            if time.monotonic() > give_up:
                raise
            time.sleep(0.05)
            continue
        # Every node left set aside is not waited for: their cool-down is not the round's.
        return without_aside(cluster, left, source.aside()), source.remote()


def lost_node(
    nodes: tuple[NodeSpec, ...], unreachable: Unreachable, *, ended: bool = False
) -> NodeLostError | None:
    """The error for the first of ``nodes`` that was lost, if one was; ``ended``: the work
    on them ended unexplained, so a node whose agent's connection dropped is lost now."""
    lost = unreachable([n.name for n in nodes], lost_only=True, ended=ended)
    if not lost:
        return None
    name, why = next(iter(lost.items()))
    host = next(n.host for n in nodes if n.name == name)
    return NodeLostError(f"{why}; the job was stopped.", node=name, host=host)


def fail_on_lost_nodes(jobs: Sequence[Job], unreachable: Unreachable) -> None:
    """A running job with ranks on a node that was lost cannot finish: fail it, naming the
    node (its agent stops what runs there once it has lost the head for its lease)."""
    for job in jobs:
        if job.done() or job.error is not None:
            continue
        if (error := lost_node(job.plan.nodes, unreachable)) is not None:
            job.fail(error)


def restart_grown_jobs(jobs: Sequence[Job], nodes: Callable[[], tuple[NodeSpec, ...]]) -> None:
    """A running job with ``restart_on_join`` whose nodes are fewer than the cluster's round
    now (``nodes()``: nodes joined, none of its own lost) is restarted on the larger round.
    The round is read only when some job asked for that (this runs at every change)."""
    asking = [j for j in jobs if not j.done() and j.recovery.restart_on_join]
    if not asking:
        return
    now = [n.name for n in nodes()]
    for job in asking:
        ran = {n.name for n in job.plan.nodes}
        if ran < set(now):
            job.restart_if_grown([name for name in now if name not in ran])


def warn_ranks(
    jobs: Sequence[Job], warned: Collection[str], told: Collection[tuple[str, int]]
) -> set[tuple[str, int]]:
    """Send SIGUSR1 to the launcher of each running attempt with ranks on a node of
    ``warned`` (its batch job's time limit is near), which forwards it to the ranks, so
    that they can checkpoint (``clusterbook.on_preempt``); once an attempt (``told``: those
    told before, by job id and attempt), and not before all its ranks started: a launcher
    still starting may not forward the signal yet, but end of it (a resumed attempt on a
    requeued batch job, warned again as it started: prterun exited 138). Returns the
    attempts told now."""
    now = set()
    for job in jobs:
        key = (job.id, job.attempt)
        if job.done() or key in told or not any(n.name in warned for n in job.plan.nodes):
            continue
        if job.ranks_started < job.np:
            continue  # the next change looks again (a heartbeat's, at the latest)
        with contextlib.suppress(ProcessLookupError):
            os.kill(job.pid, signal.SIGUSR1)
        now.add(key)
    return now
