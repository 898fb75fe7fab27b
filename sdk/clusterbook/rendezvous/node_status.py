"""What the head says of the nodes of a rendezvous (pure): their status rows, and which of them
cannot be reached, with a sentence saying why.

:class:`~clusterbook.rendezvous.head.RendezvousHead` holds what it has seen (the state, every
node's last report, the nodes gone and how) and asks these; nothing here reads a store or a
clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from clusterbook.rendezvous.api import RendezvousSettings
from clusterbook.rendezvous.report import NodeReport
from clusterbook.rendezvous.state import RendezvousState
from clusterbook.status import NodeStatus

__all__ = ["node_statuses", "unreachable"]


def node_statuses(
    state: RendezvousState,
    seen: Mapping[str, NodeReport],
    gone: Mapping[str, str],
    now: float,
) -> list[NodeStatus]:
    """Every node seen (``seen``: its last report) or in ``state``, by name: pending (waiting),
    joined, or as ``gone`` says (``"lost"`` or ``"left"``; left if it does not say), with its
    heartbeat's age at ``now`` (wall time) and its load."""
    rows = []
    for node in sorted(set(seen) | set(state.last_heartbeats)):
        report = seen.get(node, NodeReport())
        if node in state.participants:
            status = "joined" if state.complete else "pending"
        elif node in state.wait_list:
            status = "pending"
        else:
            status = gone.get(node, "left")
        last = state.last_heartbeats.get(node)
        rows.append(
            NodeStatus(
                name=node,
                host=report.hostname,
                slots=report.slots,
                state=status,
                round=state.round if node in state.participants else None,
                heartbeat_age=None if last is None else max(0.0, now - last),
                load=report.load,
                memory_used=report.memory_used,
                memory=report.memory,
                pid=report.pid,
                gpus=report.gpus.count,
                gpu_model=report.gpus.model,
            )
        )
    return rows


def unreachable(
    statuses: Iterable[NodeStatus],
    names: Collection[str],
    settings: RendezvousSettings,
    *,
    lost_only: bool = False,
) -> dict[str, str]:
    """Of the nodes ``names``, those lost or gone (and, unless ``lost_only``, those not heard
    from for over 1.5 heartbeat intervals), each with a sentence saying so."""
    wanted = set(names)
    out = {}
    for s in statuses:
        if s.name not in wanted:
            continue
        if s.state in ("lost", "left"):
            how = "left the cluster" if s.state == "left" else "was lost"
            out[s.name] = (
                f"Node {s.name} ({s.host}) {how}: no heartbeat within "
                f"{settings.keep_alive_interval:g} s x {settings.keep_alive_max_attempt}, or "
                "its connection to the head broke"
            )
        elif (
            not lost_only
            and s.heartbeat_age is not None
            and s.heartbeat_age > 1.5 * settings.keep_alive_interval
        ):
            out[s.name] = (
                f"Node {s.name} ({s.host}) has not been heard from for "
                f"{s.heartbeat_age:.1f} s: it may be cut off from the head"
            )
    return out
