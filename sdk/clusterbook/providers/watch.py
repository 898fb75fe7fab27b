"""How a cluster's nodes are watched: what each is doing, which are lost, when they are ready.

:class:`NodeWatch` is the part of a provider that answers it (``provider.watch``, see
:mod:`clusterbook.providers.base`). For nodes that run agents, the cluster's rendezvous head
(:class:`~clusterbook.rendezvous.head.RendezvousHead`) sees it all, and is a watch as it is;
:class:`AgentWatch` adds to it what the provider knows besides (the nodes it brought up
itself, why nodes lost cannot come back, how to start more). :class:`FixedWatch` watches a
fixed set of nodes that are ready once started and never lost.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any, Protocol

from clusterbook.errors import ReadyTimeoutError
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.resources import empty_answer
from clusterbook.spec import NodeSpec
from clusterbook.status import NodeStatus

__all__ = ["AgentWatch", "FixedWatch", "NodeWatch"]


class NodeWatch(Protocol):
    """How a cluster's nodes are watched (the cluster asks it from any thread)."""

    def node_statuses(self) -> list[NodeStatus]:
        """One status per node the cluster knows (pending, ready, joined, lost, left, ...)."""
        ...

    def unreachable(
        self, names: Collection[str], *, lost_only: bool = False, ended: bool = False
    ) -> dict[str, str]:
        """Of the nodes ``names``, those lost (and, unless ``lost_only``, those not heard from
        lately), each with a sentence saying so; names it does not know are not among them.
        ``ended``: the caller's work on them ended unexplained (MPI lost its daemons there):
        a node whose agent's connection dropped is called lost at once, without the grace
        that lets a live node's connection come back."""
        ...

    def wait_ready(self, timeout: float) -> None:
        """Return once jobs can run on the provider's nodes; raise
        :class:`~clusterbook.ReadyTimeoutError` saying who is missing after ``timeout``
        seconds (and a :class:`~clusterbook.ClusterStateError` at once when they cannot come)."""
        ...

    def losses(self) -> dict[str, int]:
        """How many times each node was lost, joined again since or not (never: absent)."""
        ...

    def problem(self) -> str | None:
        """What is wrong with the view of the nodes now (shown in status), if anything."""
        ...

    def resource_history(
        self,
        window: object = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]:
        """Each node's CPU, memory and GPU use over the last ``window`` seconds (a duration;
        None: all that is kept), of the ``nodes`` named (None: all), ``points`` samples a
        series at most, as :meth:`clusterbook.resources.ResourceHistory.answer` gives it: no
        node where nothing reports."""
        ...


class FixedWatch:
    """A fixed set of nodes (``nodes()``): pending until the provider has started
    (``started()``), then ready; none is ever lost, and there is nothing to wait for."""

    def __init__(
        self, nodes: Callable[[], Sequence[NodeSpec]], started: Callable[[], bool]
    ) -> None:
        self._nodes = nodes
        self._started = started

    def node_statuses(self) -> list[NodeStatus]:
        state = "ready" if self._started() else "pending"
        return [
            NodeStatus(n.name, n.host, n.slots, state, gpus=n.gpus.count, gpu_model=n.gpus.model)
            for n in self._nodes()
        ]

    def unreachable(
        self, names: Collection[str], *, lost_only: bool = False, ended: bool = False
    ) -> dict[str, str]:
        return {}

    def wait_ready(self, timeout: float) -> None:
        """Return at once once started; before, raise at once: nothing starts the nodes
        while this waits."""
        if self._started():
            return
        names = ", ".join(n.name for n in self._nodes()) or "none known yet"
        reason = f"the nodes are not started ({names})"
        raise ReadyTimeoutError(
            f"The cluster is not ready after {timeout:g} s: {reason}.",
            timeout=timeout,
            reason=reason,
        )

    def losses(self) -> dict[str, int]:
        return {}

    def problem(self) -> str | None:
        return None

    def resource_history(
        self,
        window: object = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]:
        """None of its nodes reports its use: no agent runs there."""
        return empty_answer(1.0)


class AgentWatch:
    """The watch of nodes whose agents join ``head``'s rendezvous: what the head sees of them,
    with what the provider knows besides.

    ``planned``: the nodes the provider brought up itself, whose agents it waits for: then
    there is one status per planned node, in its order, pending until its agent joined, with
    the GPUs the provider gave it (nodes sharing a machine share out its GPUs), and a timeout
    names the nodes still missing. ``give_up``: why the nodes lost cannot come back, if they
    cannot (``wait_ready`` raises it at once). ``hint``: how to start more nodes, told when
    ``wait_ready`` times out. Once the cluster stopped (:meth:`end`), the nodes show as they
    ended: lost if they were, else left (:meth:`end`).
    """

    def __init__(
        self,
        head: RendezvousHead,
        *,
        planned: Callable[[], Sequence[NodeSpec]] | None = None,
        give_up: Callable[[], str | None] | None = None,
        hint: Callable[[], str] | None = None,
    ) -> None:
        self.head = head
        self._planned = planned
        self._give_up = give_up
        self._hint = hint
        self._ended: list[NodeStatus] | None = None

    def node_statuses(self) -> list[NodeStatus]:
        ended = self._ended
        if ended is not None:
            return list(ended)
        rows = self.head.node_statuses()
        if self._planned is None:
            return rows
        seen = {s.name: s for s in rows}
        return [
            replace(
                seen.get(n.name) or NodeStatus(n.name, n.host, n.slots, "pending"),
                gpus=n.gpus.count,
                gpu_model=n.gpus.model,
            )
            for n in self._planned()
        ]

    def unreachable(
        self, names: Collection[str], *, lost_only: bool = False, ended: bool = False
    ) -> dict[str, str]:
        if self._ended is not None:
            return {}
        return self.head.unreachable(names, lost_only=lost_only, ended=ended)

    def wait_ready(self, timeout: float) -> None:
        if self._ended is not None:
            return
        hint = self._hint() if self._hint is not None else ""
        try:
            self.head.wait_ready(timeout, hint, self._give_up)
        except ReadyTimeoutError as exc:
            missing = [f"{s.name} ({s.state})" for s in self.node_statuses() if s.state != "joined"]
            if self._planned is None or not missing:
                raise
            reason = f"{exc.reason}; waiting for {', '.join(missing)}"
            raise ReadyTimeoutError(
                f"The cluster is not ready after {timeout:g} s: {reason}.",
                timeout=timeout,
                reason=reason,
            ) from None

    def losses(self) -> dict[str, int]:
        return self.head.losses()

    def problem(self) -> str | None:
        return None if self._ended is not None else self.head.problem()

    def resource_history(
        self,
        window: object = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]:
        """What the agents reported (after the end too: the history of a stopped cluster)."""
        return self.head.history.answer(window, nodes=nodes, points=points)

    def end(self) -> None:
        """The cluster stops: from now on, show the nodes as they are now, each lost if it
        was, else left, with no heartbeat age (none comes after the end: an age kept would
        stand still). Before the head served the rendezvous nothing started, and nothing
        ends: the nodes stay as they were."""
        if self._ended is None and self.head.join_url is not None:
            self._ended = [
                replace(s, state=s.state if s.state == "lost" else "left", heartbeat_age=None)
                for s in self.node_statuses()
            ]
