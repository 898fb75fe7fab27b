"""The provider contract: where a :class:`~clusterbook.Cluster`'s nodes come from.

A provider brings nodes up at :meth:`Provider.start`, says what they are (:attr:`Provider.nodes`,
:meth:`Provider.node_statuses`), how the MPI launcher reaches them (:meth:`Provider.remote`),
and releases them at :meth:`Provider.stop`. That is all a new provider must write: every other
member has a default that fits a fixed set of nodes sharing this machine's files.

====================  ========  ==================================================================
member                default   what it must do
====================  ========  ==================================================================
``kind``              required  a short name (``"ssh"``), shown in status; the registry's key
``nodes``             required  the nodes jobs run on now (``()`` while none is ready)
``planned``           nodes     before ``start``: the nodes it brings up, where known already
                                (None: only ``start`` finds them out: nodes that join, slots
                                counted on the node)
``start(ctx)``        required  bring the nodes up; raise a ClusterError naming what failed, and
                                leave nothing behind when it does
``stop()``            required  no process, key or file of the cluster left on any node it can
                                reach; warn (``CleanupWarning``) naming the others; never raise
``wait_ready(t)``     returns   return once jobs can run; raise ``ReadyTimeoutError`` after ``t``
``remote()``          None      how the launcher reaches the nodes, None when they are this machine
``stop_job(token)``   nothing   no process of job ``token`` left on any node (the job's own
                                clean-up covers this machine)
``hold_job(...)``     ()        keep job ``token``'s processes stopped (SIGSTOP) on the nodes of
                                other machines, for inspection (``clean="none"``); name them
``node_statuses()``   derived   one :class:`NodeStatus` per node: pending until started, then ready
``problem()``         None      what is wrong with the provider's view of the nodes (in status)
``lost_for_good()``   None      why nodes that were lost cannot come back (then status shows it,
                                ``wait_ready`` raises it and ``mpirun`` refuses with it)
``unreachable(...)``  {}        of the nodes named, those lost or silent, with a sentence each
``put(sent)``         {}        copy files to nodes that do not share this machine's; the nodes
                                it failed on, with why
``gather(dir, skip)`` ([], {})  move the files ranks wrote in ``dir`` on such nodes here
``run_on_nodes(...)`` here      run a command on every node (by default here, once a node)
``free_port(node)``   None      a TCP port free on ``node`` now (None: not known; the job then
                                picks one at random, or this machine's for nodes here)
``join_command``      None      for nodes that join by themselves: the command that joins
``bounds``            None      ``(min_nodes, max_nodes)`` of a cluster whose size may change
``life_span``         None      seconds the nodes are there at most (a batch job's time limit):
                                the cluster's ``life_span`` unless it was given one
====================  ========  ==================================================================

Providers are looked up by kind in :mod:`clusterbook.providers.registry`, which third parties
extend through the ``clusterbook.providers`` entry point group.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from clusterbook.launch.flavour import Launcher
from clusterbook.launch.nodes import NodeSource
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.launch.result import KeptProcess
from clusterbook.nodes.commands import NodeRun, run_everywhere
from clusterbook.nodes.transfer import Outgoing, uncounted
from clusterbook.spec import NodeSpec
from clusterbook.status import NodeStatus

__all__ = ["Provider", "StartContext", "node_source"]


def _nothing() -> None:
    return None


def _quiet(what: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class StartContext:
    """What a provider needs to bring its nodes up.

    ``changed`` is to be called whenever the nodes change (a node joined, was lost, reported
    its load): the cluster then publishes a new snapshot. It may be called from any thread.
    ``progress`` is told what the start does now (``"checking 8 nodes"``), for its bar.
    ``run_dir`` is the cluster's run directory (where a batch script and its output go).
    ``cluster_id`` is the cluster's id (``NAME-YYYYmmdd-HHMMSS``, unique among this user's
    clusters): it names the cluster's directory on the head and on every node
    (:func:`clusterbook.paths.cluster_dir`), its key line and its processes' tags.
    """

    cluster_id: str
    python: str
    launcher: Launcher
    env: Mapping[str, str]
    changed: Callable[[], None] = _nothing
    progress: Callable[[str], None] = _quiet
    run_dir: Path | None = None


class Provider(ABC):
    """Where a cluster's nodes come from (see the module docstring for the whole contract)."""

    kind: ClassVar[str]

    #: Set by :meth:`start` of the providers that keep the default :meth:`node_statuses`.
    started: bool = False

    @property
    @abstractmethod
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The nodes jobs run on now, in rank order (``()`` while none is ready)."""

    @property
    def planned(self) -> tuple[NodeSpec, ...] | None:
        """Before :meth:`start`: the nodes it brings up, where they are known already (a list
        of hosts, workers on this machine), so that the cluster's shape can be read before it
        starts; None where only :meth:`start` finds them out (nodes that join by themselves,
        slots counted on the node). By default :attr:`nodes`, or None while there are none."""
        return self.nodes or None

    @abstractmethod
    def start(self, ctx: StartContext) -> None:
        """Bring the nodes up. Raise a :class:`~clusterbook.ClusterError` naming what failed
        (a :class:`~clusterbook.BootstrapError` by node), having released what was started."""

    @abstractmethod
    def stop(self) -> None:
        """Release the nodes: no process, key or file of the cluster left on any node it can
        reach. Never raises; a node it cannot clean is named in a ``CleanupWarning``. Safe to
        call more than once, and after a failed :meth:`start`."""

    def wait_ready(self, timeout: float) -> None:  # noqa: B027 - a fixed set is ready at once
        """Return once jobs can run on :attr:`nodes`; raise
        :class:`~clusterbook.ReadyTimeoutError` saying what is missing after ``timeout``
        seconds. A fixed set of nodes is ready once :meth:`start` returned."""

    def remote(self) -> RemoteLaunch | None:
        """How the MPI launcher reaches the nodes, or None when they are this machine."""
        return None

    def stop_job(self, token: str) -> None:  # noqa: B027 - this machine's is the job's own
        """Make sure no process of job ``token`` is left on any node. Called when a job did
        not end cleanly; the job itself already stopped what runs on this machine."""

    def hold_job(self, token: str, failing: Mapping[str, int]) -> tuple[KeptProcess, ...]:
        """Stop (SIGSTOP) every process of job ``token`` on the nodes of other machines, each
        node's MPI daemons first, once the failing rank's program there (``failing``: its
        pid, by node name) has stopped itself; return them, ``host`` being the node's name.
        A failed job is kept so with ``clean="none"``, until :meth:`stop_job` ends it. By
        default every node is this machine, where the job holds its own processes."""
        return ()

    def node_statuses(self) -> list[NodeStatus]:
        """One status per node; by default ``pending`` until started, then ``ready``."""
        state = "ready" if self.started else "pending"
        return [
            NodeStatus(n.name, n.host, n.slots, state, gpus=n.gpus.count, gpu_model=n.gpus.model)
            for n in self.nodes
        ]

    def problem(self) -> str | None:
        """What is wrong with the provider's view of the nodes now, if anything."""
        return None

    def lost_for_good(self) -> str | None:
        """Why nodes the cluster lost cannot come back, if they cannot (an SSH node whose agent
        gave up, a batch job that ended): one sentence saying what happened and what to do,
        which status, ``wait_ready()`` and ``mpirun()`` all give. None while they may come
        back (an elastic cluster's nodes may join again) or none was lost."""
        return None

    def unreachable(self, names: Collection[str], *, lost_only: bool = False) -> dict[str, str]:
        """Of the nodes ``names``, those lost (and, unless ``lost_only``, those not heard from
        lately), each with a sentence saying so."""
        return {}

    def put(
        self, sent: Outgoing, sending: Callable[[int], None] = uncounted
    ) -> dict[str, Exception]:
        """Copy ``sent`` to the nodes that do not share this machine's files, telling
        ``sending`` the bytes as they go; return the nodes it failed on, with why. By default
        every node shares them: nothing to do."""
        return {}

    def run_on_nodes(self, argv: Sequence[str], timeout: float) -> list[NodeRun]:
        """Run ``argv`` on every node at once (``timeout`` seconds each); by default every
        node is this machine, so it runs here, once for each."""
        return run_everywhere(self.nodes, {}, argv, timeout)

    def free_port(self, node: NodeSpec) -> int | None:
        """A TCP port free on ``node`` now, for the rendezvous of a job's rank 0 there
        (``MASTER_PORT``); None when the provider cannot ask the node."""
        return None

    def gather(
        self, directory: Path, skip: Sequence[str], receiving: Callable[[int], None] = uncounted
    ) -> tuple[list[Path], dict[str, Exception]]:
        """Move the files ranks wrote in ``directory`` and its directories on the nodes (but
        those whose relative names are in ``skip``: this machine has them) here, telling
        ``receiving`` the bytes as they come;
        return what arrived, and the nodes it failed on. By default every node shares this
        machine's files: nothing to move."""
        return [], {}

    @property
    def join_command(self) -> str | None:
        """For nodes that join by themselves, once started: the command a node joins with."""
        return None

    @property
    def bounds(self) -> tuple[int, int] | None:
        """``(min_nodes, max_nodes)`` of a cluster whose size may change, else None."""
        return None

    @property
    def life_span(self) -> float | None:
        """Seconds the nodes are there at most (a batch job's time limit), if bounded: the
        cluster's ``life_span`` unless it was given one."""
        return None


def node_source(provider: Provider) -> NodeSource:
    """What a job asks of ``provider``'s nodes (see :class:`~clusterbook.launch.nodes.NodeSource`),
    asked of it when a job needs it."""
    return NodeSource(
        nodes=lambda: provider.nodes,
        known=lambda: [s.name for s in provider.node_statuses()],
        unreachable=provider.unreachable,
        remote=provider.remote,
        lost_for_good=provider.lost_for_good,
        join_command=lambda: provider.join_command,
        bounds=lambda: provider.bounds,
    )
