"""The provider contract: where a :class:`~clusterbook.Cluster`'s nodes come from.

A provider brings nodes up at :meth:`Provider.start`, says what they are (:attr:`Provider.nodes`)
and releases them at :meth:`Provider.stop`. How the nodes are watched and how they are reached
are two parts it composes rather than inherits, each behind a narrow Protocol:
:attr:`Provider.watch` (a :class:`~clusterbook.providers.watch.NodeWatch`) and
:attr:`Provider.reach` (a :class:`~clusterbook.providers.reach.NodeReach`). That is all a new
provider must write: every other member has a default that fits a fixed set of nodes sharing
this machine's files (a :class:`~clusterbook.providers.watch.FixedWatch` and a
:class:`~clusterbook.providers.reach.LocalReach`).

======================  ==========  ================================================================
member                  default     what it must do
======================  ==========  ================================================================
``kind``                required    a short name (``"ssh"``), shown in status; the registry's key
``nodes``               required    the nodes jobs run on now (``()`` while none is ready)
``planned``             nodes       before ``start``: the nodes it brings up, where known already
                                    (None: only ``start`` finds them out: nodes that join, slots
                                    counted on the node)
``start(ctx)``          required    bring the nodes up; raise a ClusterError naming what failed,
                                    and leave nothing behind when it does
``stop()``              required    no process, key or file of the cluster left on any node it can
                                    reach; warn (``CleanupWarning``) naming the others; never
                                    raise; safe to call again, and after a failed ``start``
``lost_for_good()``     None        why nodes that were lost cannot come back (then status shows
                                    it, ``wait_ready`` raises it and ``mpirun`` refuses with it)
``join_command``        None        for nodes that join by themselves: the command that joins
``bounds``              None        ``(min_nodes, max_nodes)`` of a cluster whose size may change
``life_span``           None        seconds the nodes are there at most (a batch job's time
                                    limit): the cluster's ``life_span`` unless it was given one
``restart_wait``        60 s        how long a job's restart waits for enough nodes
``scaler``              None        for nodes that come in allocations (Slurm): a :class:`Scaler`,
                                    which ``cluster.scale()`` and ``adapt()`` drive
``preempting()``        empty       the nodes whose end was announced (Slurm's warning before a
                                    time limit): the head tells their ranks (SIGUSR1)
``watch``               FixedWatch  how the nodes are watched (:mod:`~clusterbook.providers.watch`)
``reach``               LocalReach  how the nodes are reached (:mod:`~clusterbook.providers.reach`)
======================  ==========  ================================================================

``watch`` (:class:`~clusterbook.providers.watch.NodeWatch`):

======================  ==========================================================================
``node_statuses()``     one :class:`NodeStatus` per node (by default pending until started, then
                        ready)
``unreachable(...)``    of the nodes named, those lost or silent, with a sentence each
``wait_ready(t)``       return once jobs can run; ``ReadyTimeoutError`` saying who is missing
                        after ``t``
``problem()``           what is wrong with the provider's view of the nodes (in status)
``resource_history(w)`` each node's CPU, memory and GPU use over the last ``w`` seconds, from
                        its agent's reports (:mod:`clusterbook.resources`; none without agents)
======================  ==========================================================================

``reach`` (:class:`~clusterbook.providers.reach.NodeReach`):

======================  ==========================================================================
``remote()``            how the launcher reaches the nodes, None when they are this machine
``put(sent)``           copy files to nodes that do not share this machine's; the nodes it failed
                        on, with why
``gather(dir, skip)``   move the files ranks wrote in ``dir`` on such nodes here
``run_on_nodes(...)``   run a command on every node (by default here, once a node)
``free_port(node)``     a TCP port free on ``node`` now (None: not known; the job then picks one)
``stop_job(token)``     no process of job ``token`` left on any node (the job's own clean-up
                        covers this machine)
``hold_job(...)``       keep job ``token``'s processes stopped (SIGSTOP) on the nodes of other
                        machines, for inspection (``clean="none"``); name them
======================  ==========================================================================

The parts are attributes the provider makes or is given, so that providers share them by
composition: the rendezvous head watches the nodes of every provider whose nodes run agents
(:class:`~clusterbook.providers.watch.AgentWatch`), and a Slurm cluster reaches its nodes as
an elastic one does (:class:`~clusterbook.providers.elastic.reach.FarReach`). Every provider
passes one contract suite (``tests/sdk/providers/contract.py``).

Providers are looked up by kind in :mod:`clusterbook.providers.registry`, which third parties
extend through the ``clusterbook.providers`` entry point group.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from clusterbook.errors import ConfigError
from clusterbook.launch.flavour import Launcher
from clusterbook.launch.nodes import RESTART_WAIT, NodeSource
from clusterbook.providers.reach import LocalReach, NodeReach
from clusterbook.providers.watch import FixedWatch, NodeWatch
from clusterbook.scaling import Allocation
from clusterbook.spec import NodeSpec

__all__ = ["Provider", "Scaler", "StartContext", "node_source"]


class Scaler(Protocol):
    """A provider whose nodes come in allocations that can be added and cancelled while the
    cluster runs (:mod:`clusterbook.scaling` decides which, the head asks)."""

    def allocations(self) -> list[Allocation]:
        """The allocations that hold or wait for nodes, oldest first."""
        ...

    def grow(self, count: int) -> None:
        """Ask for ``count`` more allocations of one node each; a refusal is a ClusterError
        quoting it, and the cluster keeps what it has."""
        ...

    def release(self, ids: Sequence[str]) -> None:
        """Cancel the allocations ``ids``: their nodes leave the cluster."""
        ...


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

    #: Set by :meth:`start` of the providers that keep the default :attr:`watch`.
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

    @property
    def watch(self) -> NodeWatch:
        """How the nodes are watched; by default a fixed set, pending until :attr:`started`,
        then ready."""
        return FixedWatch(lambda: self.nodes, lambda: self.started)

    @property
    def reach(self) -> NodeReach:
        """How the nodes are reached; by default they share this machine's files and
        processes."""
        return LocalReach(lambda: self.nodes)

    def lost_for_good(self) -> str | None:
        """Why nodes the cluster lost cannot come back, if they cannot (an SSH node whose agent
        gave up, a batch job that ended): one sentence saying what happened and what to do,
        which status, ``wait_ready()`` and ``mpirun()`` all give. None while they may come
        back (an elastic cluster's nodes may join again) or none was lost."""
        return None

    @property
    def join_command(self) -> str | None:
        """For nodes that join by themselves, once started: the command a node joins with."""
        return None

    def job_script(
        self, python: str, cluster_id: str, run_dir: Path | None, launcher: Launcher
    ) -> str:
        """For nodes from a batch job: the script :meth:`start` submits, its scheduler's
        options as directives (``#SBATCH``), for a cluster whose Python is ``python``, whose
        id is ``cluster_id``, whose run directory is ``run_dir`` and whose MPI launcher is
        ``launcher``. Others raise a ConfigError: they submit nothing."""
        raise ConfigError(
            f"cluster.job_script() shows the batch script a Slurm cluster (Cluster.slurm) "
            f"submits; a {self.kind} cluster submits none."
        )

    @property
    def bounds(self) -> tuple[int, int] | None:
        """``(min_nodes, max_nodes)`` of a cluster whose size may change, else None."""
        return None

    @property
    def life_span(self) -> float | None:
        """Seconds the nodes are there at most (a batch job's time limit), if bounded: the
        cluster's ``life_span`` unless it was given one."""
        return None

    @property
    def restart_wait(self) -> float:
        """Seconds a job's restart waits for enough nodes (an elastic round to form again)."""
        return RESTART_WAIT

    @property
    def scaler(self) -> Scaler | None:
        """How the cluster grows and shrinks while it runs, if it can (Slurm's allocations)."""
        return None

    def preempting(self) -> Collection[str]:
        """The nodes whose end was announced (a batch job's time limit is near): the head
        sends SIGUSR1 to the ranks of the jobs there, so that they can checkpoint."""
        return ()


def node_source(provider: Provider) -> NodeSource:
    """What a job asks of ``provider``'s nodes (see :class:`~clusterbook.launch.nodes.NodeSource`),
    asked of it when a job needs it."""
    return NodeSource(
        nodes=lambda: provider.nodes,
        known=lambda: [s.name for s in provider.watch.node_statuses()],
        unreachable=lambda names, **how: provider.watch.unreachable(names, **how),
        remote=lambda: provider.reach.remote(),
        lost_for_good=provider.lost_for_good,
        join_command=lambda: provider.join_command,
        bounds=lambda: provider.bounds,
    )
