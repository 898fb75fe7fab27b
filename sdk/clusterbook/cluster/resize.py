"""``cluster.scale(nodes)`` and ``cluster.adapt(minimum, maximum)``: :class:`Resizer`.

The decisions are :mod:`clusterbook.scaling`'s (pure); this module reads what they need (the
provider's allocations, which of them run ranks of which jobs, the slots the jobs ask for),
and has the provider's :class:`~clusterbook.providers.base.Scaler` act: submit or cancel.
``adapt`` is a thread that does that every ``interval`` until ``scale()``, another
``adapt()`` or the cluster's stop ends it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from clusterbook.durations import Duration
from clusterbook.errors import ClusterError, ClusterStateError, ConfigError
from clusterbook.head.state import Resizes
from clusterbook.launch.job import Job
from clusterbook.providers.base import Provider, Scaler
from clusterbook.scaling import (
    Adapt,
    Allocation,
    adapt_target,
    check_target,
    idle_since,
    nodes_wanted,
    plan_scale,
    releasable,
)

__all__ = ["Resizer", "Resizing"]

_log = logging.getLogger("clusterbook.cluster.resize")


def _holders(allocation: Allocation, jobs: Sequence[Job]) -> list[Job]:
    """The running jobs with ranks on the nodes of ``allocation`` (a node's name ends with
    its allocation's id)."""
    suffix = f"-{allocation.id}"
    return [j for j in jobs if not j.done() and any(n.name.endswith(suffix) for n in j.plan.nodes)]


def _resizable(job: Job) -> bool:
    """Whether ``job`` runs on if a node of its goes: it has restarts left."""
    return job.recovery.restarts > job.restarts


class Resizer:
    """Scales the cluster of ``provider`` whose jobs ``jobs()`` gives (see the module)."""

    def __init__(self, provider: Provider, jobs: Callable[[], Sequence[Job]]) -> None:
        self._provider = provider
        self._jobs = jobs
        self._lock = threading.Lock()  # one decision at a time
        self._adapting: threading.Event | None = None  # set: that adapt loop ends
        self._idle: dict[str, float] = {}
        self.problem: str | None = None  # the last adapt step's error, shown in status

    def _scaler(self, what: str) -> tuple[Scaler, tuple[int, int]]:
        scaler, bounds = self._provider.scaler, self._provider.bounds
        if scaler is None or bounds is None:
            kind = self._provider.kind
            raise ConfigError(
                f"cluster.{what}() grows and shrinks Slurm clusters (Cluster.slurm), whose "
                f"nodes come in batch jobs; a {kind} cluster's nodes are what it started with "
                "(an elastic cluster's nodes join by themselves, with its join_command)."
            )
        return scaler, bounds

    def scale(self, nodes: int) -> None:
        """Reach ``nodes`` nodes; ends an ``adapt()``.

        More nodes: one more batch job per node, with the same script and options as the
        cluster's own (sbatch's refusal is a :class:`~clusterbook.errors.ConfigError` quoting
        it; the cluster keeps what it has), whose agents join the running cluster; each shows
        in ``status()`` as a pending row with Slurm's reason while it waits. Fewer: the newest
        of those batch jobs are cancelled whole, never the cluster's own, never below
        ``nodes``, and never one whose nodes run ranks of a job with no ``restarts=`` left (a
        :class:`~clusterbook.errors.ClusterStateError` names them, and nothing is cancelled);
        a job with restarts left runs on, on the nodes left. ``nodes`` stays within the
        cluster's ``min_nodes`` and ``max_nodes``.
        """
        scaler, (least, most) = self._scaler("scale")
        target = check_target(nodes, least, most, f"scale({nodes!r})")
        self.close()
        with self._lock:
            allocations = scaler.allocations()
            jobs = self._jobs()
            held = {
                a.id: holders
                for a in allocations
                if (holders := [j for j in _holders(a, jobs) if not _resizable(j)])
            }
            plan = plan_scale(target, allocations, {a.id for a in allocations} - set(held))
            free = plan_scale(target, allocations, {a.id for a in allocations})
            if plan.kept > free.kept:
                said = "; ".join(  # those it would cancel, were their jobs not there
                    f"Slurm job {i}: {', '.join(j.id for j in held[i])}"
                    for i in free.release
                    if i in held
                )
                raise ClusterStateError(
                    f"scale({target}) would cancel nodes that run ranks of jobs with no "
                    f"restarts left ({said}). Wait for them, cancel them, or start them with "
                    "restarts= so that they run on when a node goes."
                )
            if plan.release:
                scaler.release(plan.release)
            if plan.submit:
                scaler.grow(plan.submit)

    def adapt(
        self, minimum: int, maximum: int, *, interval: Duration = "30s", grace: Duration = "1m"
    ) -> None:
        """Grow and shrink between ``minimum`` and ``maximum`` (see ``Cluster.adapt``)."""
        _, bounds = self._scaler("adapt")
        settings = Adapt.make(minimum, maximum, interval, grace, bounds)
        self.close()
        stop = threading.Event()
        self._adapting, self._idle = stop, {}
        threading.Thread(
            target=self._adapt_loop, args=(settings, stop), name="clusterbook-adapt", daemon=True
        ).start()

    def _adapt_loop(self, settings: Adapt, stop: threading.Event) -> None:
        while not stop.wait(settings.interval):
            try:
                self.adapt_once(settings, time.monotonic())
                self.problem = None
            except ClusterError as exc:
                self.problem = f"adapt: {exc}"
                _log.warning("Adapting the cluster failed: %s", exc)

    def adapt_once(self, settings: Adapt, now: float) -> None:
        """One step of ``adapt``: ask for the nodes the jobs want, let go of those idle for the
        grace period."""
        scaler, _ = self._scaler("adapt")
        with self._lock:
            allocations = scaler.allocations()
            jobs = [j for j in self._jobs() if not j.done()]
            busy = {a.id for a in allocations if _holders(a, jobs)}
            self._idle = idle_since(self._idle, [a.id for a in allocations], busy, now)
            here = self._provider.nodes
            per_node = max((n.slots for n in here), default=1)
            total = sum(a.nodes for a in allocations)
            coming = max(0, total - len(here)) * per_node  # slots of nodes still to join
            slots = sum(n.slots for n in here) + coming
            more = nodes_wanted(sum(j.np for j in jobs), slots, per_node)
            busy_nodes = sum(a.nodes for a in allocations if a.id in busy)
            target = adapt_target(settings, nodes=total, busy=busy_nodes, more=more)
            plan = plan_scale(target, allocations, releasable(settings, self._idle, now))
            if plan.release:
                scaler.release(plan.release)
            if plan.submit:
                scaler.grow(plan.submit)

    def close(self) -> None:
        """End the ``adapt()`` loop, if one runs."""
        stop, self._adapting = self._adapting, None
        if stop is not None:
            stop.set()


class Resizing:
    """``Cluster.scale`` and ``Cluster.adapt``: on the cluster's local head, or asked of the
    supervisor of a detached one."""

    def _resizer(self, what: str) -> Resizes:
        """The cluster's :class:`Resizer` once it runs here; a detached cluster's handle on
        its supervisor."""
        raise NotImplementedError

    def scale(self, nodes: int) -> None:
        """Grow or shrink a Slurm cluster to ``nodes`` (within its ``min_nodes`` and
        ``max_nodes``) by submitting or cancelling batch jobs of one node; ends an
        :meth:`adapt`. See :meth:`Resizer.scale`."""
        self._resizer("scale").scale(nodes)

    def adapt(
        self, minimum: int, maximum: int, *, interval: Duration = "30s", grace: Duration = "1m"
    ) -> None:
        """Let a Slurm cluster grow while its jobs' ranks outnumber its slots and let go of
        nodes idle for ``grace``, looking every ``interval`` (see :meth:`scale`)."""
        self._resizer("adapt").adapt(minimum, maximum, interval=interval, grace=grace)
