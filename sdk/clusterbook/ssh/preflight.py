"""Pre-flight checks of a node against the head: pure decisions over probed facts."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clusterbook.errors import ConfigError
from clusterbook.gpus import GPUS, NO_GPUS, GPUInfo, Slots, gpu_info, slots_from_gpus
from clusterbook.nodes.tasks.cpus import parse_place

__all__ = ["NodeFacts", "all_problems", "problems", "resolve_slots"]


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the probe found on a node (or on the head)."""

    hostname: str
    home: str
    python: str
    python_version: str
    cores: int
    mpi4py: str | None
    mpi_library: str | None
    clusterbook: str | None
    launcher_found: bool | None
    mpi4py_error: str | None = None
    gpus: GPUInfo = NO_GPUS
    place: str | None = None  # MACHINE/CPUS (NodeSpec.place); None from an older node program

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeFacts:
        names = [f.name for f in dataclasses.fields(cls)]
        given: dict[str, Any] = {name: data.get(name) for name in names}
        raw = data.get("gpus")  # what nvidia-smi said there
        given["gpus"] = gpu_info(raw) if isinstance(raw, Mapping) else NO_GPUS
        given["place"] = given["place"] if parse_place(given["place"]) else None
        return cls(**given)

    @property
    def minor(self) -> str:
        return ".".join(self.python_version.split(".")[:2])


def problems(
    head: NodeFacts, node: NodeFacts, *, host: str, slots: int, prefix: str, flavour: str
) -> list[str]:
    """What keeps ``node`` from running ranks with the head's environment; empty when fine."""
    found: list[str] = []
    env_hint = f"install the head's environment there (pip install 'clusterbook[{flavour}]')"
    if node.minor != head.minor:
        found.append(
            f"Python {node.python_version} at {node.python}, but the head runs "
            f"{head.python_version}; ranks need the same minor version: {env_hint}."
        )
    if node.clusterbook != head.clusterbook:
        have = f"clusterbook {node.clusterbook}" if node.clusterbook else "no clusterbook"
        found.append(f"{have} for {node.python}, the head has {head.clusterbook}: {env_hint}.")
    if node.mpi4py is None:
        why = f" ({node.mpi4py_error})" if node.mpi4py_error else ""
        found.append(f"mpi4py does not import with {node.python}{why}: {env_hint}.")
    elif node.mpi4py != head.mpi4py:
        found.append(f"mpi4py {node.mpi4py}, but the head has {head.mpi4py}: {env_hint}.")
    if node.mpi4py is not None and node.mpi_library != head.mpi_library:
        found.append(
            f"MPI is {node.mpi_library!r}, but the head's is {head.mpi_library!r}; every node "
            f"needs the same MPI: {env_hint}."
        )
    if node.launcher_found is False:
        found.append(f"the {flavour} launcher is missing under {prefix}: {env_hint}.")
    if node.cores < slots:
        found.append(
            f"{slots} slots asked, but the node has {node.cores} cores; ask for at most "
            f"{node.cores} slots there (like '{host}:{node.cores}')."
        )
    return found


def all_problems(
    head: NodeFacts,
    facts: Mapping[str, NodeFacts],
    failed: Mapping[str, Exception],
    nodes: Mapping[str, tuple[str, int, str]],
    flavour: str,
) -> dict[str, list[str]]:
    """Problems by node key: a failed probe's error, else what :func:`problems` finds.

    ``nodes`` maps each probed key to its (host, slots, launcher prefix).
    """
    found = {key: [str(exc)] for key, exc in failed.items()}
    for key, node in facts.items():
        host, slots, prefix = nodes[key]
        issues = problems(head, node, host=host, slots=slots, prefix=prefix, flavour=flavour)
        if issues:
            found[key] = issues
    return found


def resolve_slots(asked: Mapping[str, Slots], facts: Mapping[str, NodeFacts]) -> dict[str, int]:
    """The slots of each host of ``asked`` (``"node1:gpus"``: its GPU count in ``facts``); a
    :class:`~clusterbook.ConfigError` naming every such host that has no GPU, and the fix."""
    slots: dict[str, int] = {}
    refused = []
    for host, given in asked.items():
        if given != GPUS:
            slots[host] = given
            continue
        node = facts[host]
        try:
            slots[host] = slots_from_gpus(
                node.gpus,
                node=host,
                asked=f"'{host}:{GPUS}'",
                fix=f"give its slots as a number ('{host}:{node.cores}'), or list only hosts "
                f"with GPUs as 'HOST:{GPUS}'",
            )
        except ConfigError as exc:
            refused.append(str(exc))
    if refused:
        raise ConfigError(" ".join(refused))
    return slots
