"""How a cluster's nodes are reached, for jobs and for files: a :class:`NodeReach`.

It is the part of a provider that the launcher and the cluster's file and command calls use
(``provider.reach``, see :mod:`clusterbook.providers.base`): how the MPI launcher gets to the
nodes, what is sent to them and brought back, what runs on each, and how a job's processes
there are stopped or kept. :class:`LocalReach` serves nodes that share this machine (its
files, its processes); an SSH cluster's sessions, a far agent's sshd and a Slurm allocation's
``srun`` serve the others (each provider's own).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from clusterbook.launch.remote import RemoteLaunch
from clusterbook.launch.result import KeptProcess
from clusterbook.nodes.commands import NodeRun, run_everywhere
from clusterbook.nodes.here import put_here
from clusterbook.nodes.outgoing import Outgoing
from clusterbook.nodes.transfer import uncounted
from clusterbook.spec import NodeSpec

__all__ = ["LocalReach", "NodeReach", "here_for"]


class NodeReach(Protocol):
    """How a cluster's nodes are reached (asked from any thread, once the provider started)."""

    def remote(self) -> RemoteLaunch | None:
        """How the MPI launcher reaches the nodes, or None when they are this machine."""
        ...

    def put(
        self,
        sent: Outgoing,
        sending: Callable[[int], None] = uncounted,
        nodes: Collection[str] | None = None,
    ) -> dict[str, Exception]:
        """Copy ``sent`` to the nodes (``nodes``: those of these names) that do not share
        this machine's files, telling ``sending`` the bytes as they go; return the nodes it
        failed on, with why. What goes to another path than its own (``sent.relocated``:
        ``put(dest=)``, ``write()``) is written here too when a node shares this machine's
        files (:func:`clusterbook.nodes.here.put_here`)."""
        ...

    def gather(
        self, directory: Path, skip: Sequence[str], receiving: Callable[[int], None] = uncounted
    ) -> tuple[list[Path], dict[str, Exception]]:
        """Move the files ranks wrote in ``directory`` and its directories on such nodes (but
        those whose relative names are in ``skip``: this machine has them) here, telling
        ``receiving`` the bytes as they come; return what arrived, and the nodes it failed
        on."""
        ...

    def run_on_nodes(
        self, argv: Sequence[str], timeout: float, nodes: Collection[str] | None = None
    ) -> list[NodeRun]:
        """Run ``argv`` on every node at once (``timeout`` seconds each); ``nodes``: only on
        the nodes of these names (the head checked they are the cluster's)."""
        ...

    def free_port(self, node: NodeSpec) -> int | None:
        """A TCP port free on ``node`` now, for the rendezvous of a job's rank 0 there
        (``MASTER_PORT``); None when the node cannot be asked (the job then picks one)."""
        ...

    def stop_job(self, token: str) -> None:
        """Make sure no process of job ``token`` is left on any node. Called when a job did
        not end cleanly; the job itself already stopped what runs on this machine."""
        ...

    def hold_job(self, token: str, failing: Mapping[str, int]) -> tuple[KeptProcess, ...]:
        """Stop (SIGSTOP) every process of job ``token`` on the nodes of other machines, each
        node's MPI daemons first, once the failing rank's program there (``failing``: its
        pid, by node name) has stopped itself; return them, ``host`` being the node's name.
        A failed job is kept so with ``clean="none"``, until :meth:`stop_job` ends it."""
        ...


def here_for(
    sent: Outgoing,
    sending: Callable[[int], None],
    here: Sequence[str],
    nodes: Collection[str] | None,
) -> dict[str, Exception]:
    """Write what ``sent`` relocates on this machine, once, if one of the nodes ``here``
    (those that share its files) is among ``nodes`` (None: all); the nodes it failed on."""
    chosen = [n for n in here if nodes is None or n in nodes]
    if not chosen or not sent.relocated:
        return {}
    try:
        put_here(sent, sending)
    except Exception as exc:
        return dict.fromkeys(chosen, exc)
    return {}


def _nothing(token: str) -> None:
    return None


class LocalReach:
    """Nodes (``nodes()``) that share this machine: the launcher needs no way to them, files
    are here already, a command runs here once for each node, and a job's processes are the
    job's own to stop and keep. ``stop_job``: what else stops a job's processes on the nodes
    (the nodes' agents, through the rendezvous)."""

    def __init__(
        self,
        nodes: Callable[[], Sequence[NodeSpec]],
        stop_job: Callable[[str], None] = _nothing,
    ) -> None:
        self._nodes = nodes
        self._stop_job = stop_job

    def remote(self) -> RemoteLaunch | None:
        return None

    def put(
        self,
        sent: Outgoing,
        sending: Callable[[int], None] = uncounted,
        nodes: Collection[str] | None = None,
    ) -> dict[str, Exception]:
        return here_for(sent, sending, [n.name for n in self._nodes()], nodes)

    def gather(
        self, directory: Path, skip: Sequence[str], receiving: Callable[[int], None] = uncounted
    ) -> tuple[list[Path], dict[str, Exception]]:
        return [], {}

    def run_on_nodes(
        self, argv: Sequence[str], timeout: float, nodes: Collection[str] | None = None
    ) -> list[NodeRun]:
        return run_everywhere(self._nodes(), {}, argv, timeout, only=nodes)

    def free_port(self, node: NodeSpec) -> int | None:
        return None

    def stop_job(self, token: str) -> None:
        self._stop_job(token)

    def hold_job(self, token: str, failing: Mapping[str, int]) -> tuple[KeptProcess, ...]:
        return ()
