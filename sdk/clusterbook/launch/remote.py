"""How the MPI launcher reaches a job's nodes when they are not all this machine: pure values.

A provider says it once its nodes are up (its reach's ``remote()``); the launcher turns it into
command-line options (:mod:`clusterbook.launch.command`) or, for the nodes of a Slurm
allocation, into a step of it (:mod:`clusterbook.launch.srun`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from clusterbook.launch.flavour import Launcher

__all__ = ["RemoteLaunch", "SrunStep"]


@dataclass(frozen=True, slots=True)
class SrunStep:
    """How a cluster's jobs start: as steps of Slurm job ``job_id``, by ``srun`` (its path).
    ``names``: Slurm's name of each node whose host (as the cluster knows it) is not that."""

    srun: str
    job_id: str
    names: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RemoteLaunch:
    """How the MPI launcher reaches the nodes: ssh options, an ssh wrapper (MPICH), and the
    head's address as the nodes see it. ``tree_spawn`` is off when the nodes cannot ssh to
    each other (only the head holds the key), so every daemon is started from the head.

    When the nodes' environments live at different paths, ``python``, ``launcher`` and
    ``hook_dir`` are paths that are the same on every node (per-cluster links to each node's
    own environment) and replace the cluster's for the job. ``srun``: the nodes are a Slurm
    allocation's, and jobs start as its steps (no ssh; see :mod:`clusterbook.launch.srun`)."""

    ssh_args: tuple[str, ...]
    ssh_wrapper: str
    head_addr: str
    hostnames: Mapping[str, str] = field(default_factory=dict)
    tree_spawn: bool = True
    python: str | None = None
    launcher: Launcher | None = None
    hook_dir: str | None = None
    srun: SrunStep | None = None
    launch_agent: str | None = None
