"""What a provider (where nodes come from) gives a :class:`~clusterbook.Cluster`."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from clusterbook.launch.flavour import Launcher
from clusterbook.spec import NodeSpec

__all__ = ["Provider", "RemoteLaunch", "StartContext"]


@dataclass(frozen=True, slots=True)
class StartContext:
    """What a provider needs to bring its nodes up."""

    cluster_id: str
    python: str
    launcher: Launcher
    env: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class RemoteLaunch:
    """How the MPI launcher reaches the nodes: ssh options, an ssh wrapper (MPICH), and the
    head's address as the nodes see it. ``tree_spawn`` is off when the nodes cannot ssh to
    each other (only the head holds the key), so every daemon is started from the head.

    When the nodes' environments live at different paths, ``python``, ``launcher`` and
    ``hook_dir`` are paths that are the same on every node (per-cluster links to each node's
    own environment) and replace the cluster's for the job."""

    ssh_args: tuple[str, ...]
    ssh_wrapper: str
    head_addr: str
    hostnames: Mapping[str, str] = field(default_factory=dict)
    tree_spawn: bool = True
    python: str | None = None
    launcher: Launcher | None = None
    hook_dir: str | None = None


class Provider(Protocol):
    """Where a cluster's nodes come from, and how they are brought up and released.

    Providers whose nodes come and go (agents) also have ``changed`` (a callback the cluster
    sets, called on every change), ``wait_ready(timeout)`` and ``node_statuses()``; the
    cluster uses them when present.
    """

    kind: str
    nodes: tuple[NodeSpec, ...]

    def start(self, ctx: StartContext) -> None:
        """Bring the nodes up; raise a ClusterError naming what failed."""
        ...

    def stop(self) -> None:
        """Release the nodes: no process and no key of the cluster left on them."""
        ...

    def remote(self) -> RemoteLaunch | None:
        """How to launch on the nodes, or None when they are this machine."""
        ...

    def stop_job(self, token: str) -> None:
        """Make sure no process of job ``token`` is left on any node."""
        ...

    def problem(self) -> str | None:
        """What is wrong with the provider's view of the nodes now (shown in status)."""
        ...

    def unreachable(self, names: Collection[str], *, lost_only: bool = False) -> dict[str, str]:
        """Of the nodes ``names``, those lost (and, unless ``lost_only``, those not heard from
        lately), each with a sentence saying so."""
        ...
