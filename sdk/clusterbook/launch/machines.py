"""Which of a job's hosts share one machine's cores, and how many ranks each machine gets.

A node's place (:attr:`~clusterbook.spec.NodeSpec.place`) names its machine (the kernel's boot
id) and the CPUs it may use there. Hosts of one machine are containers, network namespaces or
several sshds of one computer (a test bed, stand-in hosts, Kubernetes pods on one node). Each
host's MPI daemon knows only its own host: it binds its ranks from the first CPUs it sees, and
counts its cores as free. Ranks of two hosts whose CPUs overlap then share cores that neither
daemon knew were taken. The launcher command (:mod:`clusterbook.launch.command`) hears of it
from here: no core binding on a machine whose hosts overlap, and Open MPI's ranks yield the
processor while they wait on a machine given more ranks than cores (busy-polling ranks that
share a core keep the rank they wait for off it: on 2 shared cores, a first message between two
hosts' ranks took 0.1-0.2 s instead of about 10 ms).

Pure: nodes and their ranks in, each machine's load out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from clusterbook.nodes.tasks.cpus import parse_place
from clusterbook.spec import NodeSpec

__all__ = ["MachineLoad", "machine_loads"]


@dataclass(frozen=True, slots=True)
class MachineLoad:
    """The job's ranks on one machine: its ``hosts`` (in the nodes' order), the ``ranks`` they
    get together, the ``cores`` they may use together (None: not known), and whether two of
    its hosts that get ranks may run them on the same CPUs (``overlap``)."""

    hosts: tuple[str, ...]
    ranks: int
    cores: int | None
    overlap: bool = False

    @property
    def crowded(self) -> bool:
        """More ranks than cores (a machine whose cores are not known never is)."""
        return self.cores is not None and self.ranks > self.cores


def machine_loads(nodes: Sequence[NodeSpec], ranks: Sequence[int]) -> list[MachineLoad]:
    """The load of each machine of ``nodes``, ``ranks[i]`` ranks on ``nodes[i]``.

    Nodes of one host are on one machine with its first node's cores (unknown if that node's
    are). Hosts whose places name one machine are on it together: their cores are the CPUs
    their places list in all, but no more than the sum of the hosts' cores where each is known
    (a cgroup's CPU quota caps a host below its CPUs). A host without a place is a machine of
    its own."""
    load: dict[str, int] = {}
    cores: dict[str, int | None] = {}
    places: dict[str, tuple[str, frozenset[int]] | None] = {}
    for node, count in zip(nodes, ranks, strict=True):
        if node.host not in load:
            load[node.host], cores[node.host] = 0, node.cores
            places[node.host] = parse_place(node.place)
        elif places[node.host] is None:
            places[node.host] = parse_place(node.place)
        load[node.host] += count
    machines: dict[str, list[str]] = {}
    for host, place in places.items():
        machines.setdefault(f"machine {place[0]}" if place else f"host {host}", []).append(host)
    out = []
    for hosts in machines.values():
        total = sum(load[h] for h in hosts)
        if len(hosts) == 1:
            out.append(MachineLoad((hosts[0],), total, cores[hosts[0]]))
            continue
        cpus = {h: place[1] for h in hosts if (place := places[h]) is not None}
        known = [c for h in hosts if (c := cores[h]) is not None]
        together = len(frozenset().union(*cpus.values()))
        capped = min(together, sum(known)) if len(known) == len(hosts) else together
        busy = [cpus[h] for h in hosts if load[h] > 0]
        overlap = any(a & b for a, b in combinations(busy, 2))
        out.append(MachineLoad(tuple(hosts), total, capped, overlap))
    return out
