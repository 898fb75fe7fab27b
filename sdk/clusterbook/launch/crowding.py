"""Whether a job crowds its hosts: more ranks on a host than the cores it may give them.

Nodes on one host share its cores (a local cluster's workers, say), so ranks are counted by
host, as the launcher places them (:func:`~.command.host_load`), against the host's cores (its
CPU affinity and cgroup quota, counted where the node runs). A host whose cores are not known
is never counted as crowded. Crowding is not refused: both MPIs run the ranks (clusterbook
turns core binding off and, for Open MPI, allows it), but unless the job says
``oversubscribe=True`` it is told in an :class:`~clusterbook.errors.OversubscriptionWarning`,
so that a default never oversubscribes by accident and both flavours say the same.

Hosts that are one machine (network namespaces, containers, several sshds of one computer) are
counted here each on its own cores, as the user gave them: such hosts are most often meant (a
test bed, stand-in hosts), and a warning at every job would be noise. What the launcher does
about them (no core binding, Open MPI's ranks yielding) :mod:`~.machines` decides.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from clusterbook.errors import OversubscriptionWarning
from clusterbook.launch.command import host_load
from clusterbook.spec import NodeSpec
from clusterbook.wording import spell, spell_or

__all__ = ["Crowded", "crowded", "crowding_message", "warn_crowded"]


@dataclass(frozen=True, slots=True)
class Crowded:
    """A host given more ranks than it has cores: its nodes' names, the ranks, the cores."""

    host: str
    nodes: tuple[str, ...]
    ranks: int
    cores: int


def crowded(nodes: tuple[NodeSpec, ...], np: int) -> list[Crowded]:
    """The hosts to which ``np`` ranks on ``nodes`` give more ranks than cores."""
    found = []
    for host, (ranks, cores) in host_load(nodes, np).items():
        if cores is not None and ranks > cores:
            names = tuple(n.name for n in nodes if n.host == host)
            found.append(Crowded(host, names, ranks, cores))
    return found


def _most_uncrowded(nodes: tuple[NodeSpec, ...], np: int) -> int:
    """The most ranks below ``np`` that crowd no host (0: none, one rank crowds already)."""
    return next((n for n in range(np - 1, 0, -1) if not crowded(nodes, n)), 0)


def _where(item: Crowded) -> str:
    nodes = "" if item.nodes == (item.host,) else f" (nodes {', '.join(item.nodes)})"
    return f"{item.ranks} ranks on {item.host}{nodes}, which may use {item.cores} cores"


def crowding_message(nodes: tuple[NodeSpec, ...], np: int, found: list[Crowded]) -> str:
    """What an :class:`OversubscriptionWarning` says of ``found`` (:func:`crowded`): the
    hosts with their ranks and cores, and the fixes, spelt as the user's interface has them."""
    fixes = []
    fit = _most_uncrowded(nodes, np)
    if fit:
        fixes.append(f"ask for at most {fit} ranks ({spell_or('np', fit, f'{fit} ranks')})")
    slots = sum(n.slots for n in nodes)
    if slots > sum(cores for _, cores in host_load(nodes, slots).values() if cores):
        fixes.append(
            "give each host no more slots than its cores (fewer slots, or fewer nodes there)"
        )
    fixes.append(f"pass {spell('oversubscribe', True)} to run them anyway")
    return (
        f"{spell_or('np', np, f'{np} ranks')} puts more ranks on a host than it has cores: "
        f"{'; '.join(_where(item) for item in found)} (its CPU affinity and cgroup CPU "
        "quota). Ranks that share a core wait for each other. To fix: "
        f"{', or '.join(fixes)}."
    )


def warn_crowded(nodes: tuple[NodeSpec, ...], np: int, *, oversubscribe: bool) -> None:
    """Warn (:class:`OversubscriptionWarning`) when ``np`` ranks crowd a host of ``nodes``,
    unless the job asked for that (``oversubscribe``)."""
    if oversubscribe:
        return
    found = crowded(nodes, np)
    if found:
        warnings.warn(crowding_message(nodes, np, found), OversubscriptionWarning, stacklevel=3)
