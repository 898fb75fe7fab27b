"""The :class:`Cluster` facade: how a cluster is made, and what it does, by its :class:`Head`.

A ``Cluster`` is made from a provider (where its nodes come from) and its options, and delegates
everything else to its head (:class:`~clusterbook.cluster.handle.Head`): the
:class:`~clusterbook.cluster.local_head.LocalHead` that runs it in this process, or, once a
detached cluster has started, the :class:`~clusterbook.cluster.remote.attached.AttachedCluster`
on the supervisor that runs it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterbook.cluster import display
from clusterbook.cluster.kinds import ClusterKinds
from clusterbook.cluster.local_head import LocalHead
from clusterbook.cluster.options import ClusterOptions, split_spec
from clusterbook.cluster.resize import Resizing
from clusterbook.durations import Duration
from clusterbook.functions.methods import FunctionMethods, SweepMethods
from clusterbook.head.state import Resizes
from clusterbook.paths import default_run_root
from clusterbook.providers.base import Provider
from clusterbook.resources import ResourceFrames
from clusterbook.spec import NodeSpec

if TYPE_CHECKING:
    import ipyparallel
    import pandas as pd
    from typing_extensions import Self, Unpack

    from clusterbook.cluster.handle import ClusterHandle, Head, JobHandle
    from clusterbook.cluster.remote.attached import AttachedCluster
    from clusterbook.engines import EngineArgs
    from clusterbook.export.mpijob import MPIJobArgs
    from clusterbook.launch.flavour import Launcher
    from clusterbook.launch.job import Job
    from clusterbook.launch.prepare import JobArgs
    from clusterbook.launch.saved import SavedJob
    from clusterbook.resources import Only
    from clusterbook.status import ClusterSnapshot

__all__ = ["Cluster", "default_run_root"]


class Cluster(ClusterKinds, FunctionMethods, SweepMethods, ResourceFrames, Resizing):
    """A set of nodes to run MPI jobs on.

    Make one with :meth:`local`, :meth:`ssh`, :meth:`elastic`, :meth:`slurm`,
    :meth:`from_hostfile`, :meth:`from_environment` (:mod:`clusterbook.cluster.kinds`) or
    :meth:`from_spec`; use it as a context manager (``start()`` on enter, ``stop()`` on exit,
    also on error). Every job's per-rank logs go to files under :attr:`run_dir` as they
    arrive, and stay there after the cluster stops. Every constructor takes the options of
    :class:`~clusterbook.cluster.options.ClusterOptions`: ``name``, ``run_dir``, ``python``,
    ``launcher``, ``mpi``, ``env`` and ``forward_env``.
    """

    def __init__(self, provider: Provider, options: ClusterOptions | None = None) -> None:
        self._use(LocalHead(provider, options or ClusterOptions.make(provider.kind)))

    def _use(self, local: LocalHead) -> None:
        self._local = local  # what it was made of: its provider and options, found here
        self._head: Head = local  # what runs it: local, or the handle on its supervisor
        self._provider, self._options = local.provider, local.options
        self.kind, self.name, self.python = local.kind, local.name, local.python

    def _resizer(self, what: str) -> Resizes:
        return self._head  # the local head, or a detached cluster's handle on its supervisor

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Self:
        """A cluster of any registered kind: ``{"kind": "ssh", "hosts": [...], "name": ...}``
        (the kind's own arguments and the cluster options, in one mapping). An unknown kind
        is a :class:`ConfigError` listing the known ones."""
        provider, options, made = split_spec(spec)
        self = cls.__new__(cls)  # made as __init__ makes it, with the spec kept
        self._use(LocalHead(provider, options, spec=made))
        return self

    @property
    def join_command(self) -> str | None:
        """For elastic clusters once started: the command a node joins with."""
        return self._head.join_command

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The nodes, as the provider knows them (cores filled in once started); before
        ``start()``, those it will bring up where they are known (a local or SSH cluster's)."""
        return self._head.nodes

    @property
    def state(self) -> str:
        """created, running or stopped."""
        return self._head.state

    @property
    def run_dir(self) -> Path:
        """Directory of this cluster's job logs (created by ``start()``)."""
        return self._head.run_dir

    @property
    def launcher(self) -> Launcher:
        """The MPI launcher jobs use (found at ``start()``)."""
        return self._local.launcher

    @property
    def id(self) -> str:
        """What other processes find the cluster by (``cb.clusters()``, ``clusterbook ls``,
        ``Cluster.attach``): ``NAME-YYYYmmdd-HHMMSS``."""
        return self._head.id

    def start(self, *, progress: bool | None = None) -> Cluster:
        """Find the MPI launcher, prepare the run directory, bring the nodes up (with a bar
        of the nodes up where someone watches; ``progress`` decides instead). A detached
        cluster starts its supervisor process, which does all that, and attaches to it."""
        self._head = self._head.start(progress=progress)
        return self

    def stop(self) -> None:
        """Stop every job and release the nodes. Safe to call more than once."""
        self._head.stop(reason="stop() was called")

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout: Duration = 60, *, progress: bool | None = None) -> None:
        """Return when every node is ready to run ranks; raise if that takes over ``timeout``.

        Nodes of local and SSH clusters are ready once ``start()`` returned, and again once
        nodes they lost joined again (a local cluster starts its agents again); an elastic
        cluster is ready when a rendezvous round completed (``min_nodes`` plus the last call,
        or ``max_nodes``), else :class:`ReadyTimeoutError` says who joined. Nodes that were
        lost and cannot come back (an SSH node whose agent gave up) are a
        :class:`ClusterStateError` saying so, at once. A bar shows the nodes up where someone
        watches (``progress`` decides instead).
        """
        self._head.wait_ready(timeout, progress=progress)

    # -- jobs -----------------------------------------------------------------------------

    @property
    def total_slots(self) -> int:
        return sum(n.slots for n in self.nodes)

    @property
    def jobs(self) -> Sequence[Job | SavedJob]:
        """Every job started on this cluster, oldest first (of a detached cluster: as read
        from their directories)."""
        return self._head.jobs

    def job(self, job_id: str | None = None) -> Job | SavedJob:
        """A job by id (``job-0001``), or the newest one; :class:`ClusterStateError` names the
        jobs there are."""
        return self._head.job(job_id)

    def reinstate(self, node: str) -> None:
        """Bring ``node`` (a name of the node column of :meth:`status`), set aside because its
        ranks kept failing (``state="set-aside"``), back into jobs now; its next cool-down
        still doubles. A node the cluster does not have is a :class:`ConfigError`."""
        self._head.reinstate(node)

    def mpirun(
        self, argv: Sequence[str], np: int | None = None, **job: Unpack[JobArgs]
    ) -> Job | SavedJob:
        """Start ``argv`` as an MPI program of ``np`` ranks on the cluster's nodes.

        ``argv`` is the program and its arguments, as a list (``"python"`` stands for the
        cluster's interpreter); ``np`` the number of ranks (default: all slots). The other
        arguments (``env``, ``cwd``, ``timeout``, ``oversubscribe``, ``launcher_args``,
        ``abort_on_error``, the recovery options and ``clean``) are those of
        :class:`~clusterbook.launch.prepare.JobArgs`. Returns
        the running :class:`Job`; ``job.wait()`` returns its :class:`JobResult`. A detached
        cluster's supervisor runs the job: it is read from its directory (a :class:`SavedJob`).
        """
        return self._head.mpirun(argv, np, **job)

    def to_mpijob(
        self,
        argv: Sequence[str],
        np: int | None = None,
        *,
        image: str,
        **options: Unpack[MPIJobArgs],
    ) -> dict[str, Any]:
        """``argv`` as a Kubeflow MPIJob manifest (``kubeflow.org/v2beta1``) for ``kubectl
        apply -f``: ``np`` ranks (default: all slots) on pods of ``image``, run by ``clusterbook
        run`` in the launcher pod. The cluster gives the defaults: a worker per node, its
        nodes' slots, its MPI flavour, its name and ``env`` (before ``start()`` too, where its
        nodes are known then; where not, an elastic or Slurm cluster's, a
        :class:`ConfigError` asks for ``slots_per_worker`` and ``np``); ``options`` are those of
        :func:`clusterbook.export.mpijob.render_mpijob` (``retries``, ``deadline``, ``retention``,
        ``clean``, ``resources``, ...). ``clusterbook.export.mpijob.to_yaml`` writes it as YAML."""
        from clusterbook.errors import LauncherNotFoundError
        from clusterbook.export.mpijob import render_for_nodes

        flavour = self._options.mpi
        if flavour is None:
            with contextlib.suppress(LauncherNotFoundError):  # no MPI here: the default
                flavour = self.launcher.flavour
        return render_for_nodes(
            argv,
            np,
            image=image,
            # Before start(): only those whose slots are known (not nodes that join, nor SSH
            # hosts of "gpus" slots).
            nodes=(self._provider.planned or ()) if self.state == "created" else self.nodes,
            cluster_name=self.name,
            flavour=flavour,
            cluster_env=self._options.env,
            **options,
        )

    def put(
        self,
        *paths: str | os.PathLike[str],
        progress: bool | None = None,
        dest: str | os.PathLike[str] | None = None,
    ) -> None:
        """Copy files and directories (with all they hold) from this machine to every node:
        to the same absolute paths, or under ``dest``.

        ``dest`` is a path on the nodes: relative ones are taken from the directory the
        cluster's jobs run in by default (this process's working directory; a detached
        cluster's, where it was started) and may not leave it, absolute ones may not be in the
        cluster's run directory, ``~/.clusterbook`` or ``~/.ssh`` (a
        :class:`~clusterbook.errors.ConfigError` says so before anything is sent). One path
        goes at ``dest`` (a directory's contents in it); several, or a ``dest`` ending in
        ``/``, each go into ``dest`` under their own names.

        A file a node already has with the same bytes is left alone (a shared filesystem
        costs nothing); one with other bytes is replaced whole (written beside it, then
        renamed: never a part of a file); files there that ``put`` does not send stay. On
        other machines, what did not exist there before is removed by :meth:`stop`; nodes
        that share this machine's files (a local cluster's) get a ``dest`` written here, and
        it stays. Without ``dest``, a local cluster has nothing to do.
        """
        self._head.put(*paths, progress=progress, dest=dest)

    def write(
        self,
        path: str | os.PathLike[str],
        data: bytes | str,
        nodes: str | Collection[str] | None = None,
        *,
        mode: int = 0o644,
    ) -> None:
        """Write ``data`` (bytes, or str as UTF-8) to the file ``path`` on every node, or on
        those ``nodes`` names (as :attr:`nodes` and :meth:`status` name them).

        ``path`` is checked as :meth:`put`'s ``dest`` is and must name a file. The file gets
        ``mode`` (default ``0o644``; ``0o600`` for a secret) and is written atomically: into
        a temporary file beside it, renamed over ``path`` only once whole, so a full disk
        leaves what was there and no partial file. An existing file is replaced (one with the
        same bytes is left as it is, mode included); missing directories are made (0700).
        What did not exist before goes at :meth:`stop`, as with :meth:`put`.
        """
        self._head.write(path, data, nodes, mode=mode)

    def run_on_nodes(
        self,
        argv: Sequence[str],
        timeout: Duration = 60.0,
        nodes: str | Collection[str] | None = None,
    ) -> pd.DataFrame:
        """Run ``argv`` on every node at once, or on those ``nodes`` names (a name or a list,
        as :attr:`nodes` and :meth:`status` name them; another name is a
        :class:`~clusterbook.errors.ConfigError` listing them), each stopped after
        ``timeout`` (seconds, a ``timedelta`` or text like ``"30s"``), for set-up such as
        ``pip install``; one row per node: node, host, returncode (None: it was stopped, or
        the node could not be asked), stdout, stderr (their last MiB), duration."""
        return self._head.run_on_nodes(argv, timeout, nodes)

    def gather(
        self, directory: str | os.PathLike[str], *, progress: bool | None = None
    ) -> list[Path]:
        """Move the files ranks wrote in ``directory`` on the nodes (and in the directories
        in it, at the same relative paths) to ``directory`` on this machine; return the paths
        that arrived.

        Files this machine already has there stay as they are, and so do the nodes' files of
        those names (a name another node sent too gets ``.from-HOST`` appended); hidden
        files and directories are left on the nodes. A file cut off on its way is not kept
        here, under any name, and stays on its node.
        """
        return self._head.gather(directory, progress=progress)

    def engines(self, n: int | None = None, **how: Unpack[EngineArgs]) -> ipyparallel.Client:
        """Start ``n`` ipyparallel engines (default: all slots) as an MPI job on the nodes
        and return a connected client; ``%%px`` then runs on them. Engine id = MPI rank; they
        stop with :meth:`stop_engines` or :meth:`stop`. ``timeout``, ``env``, ``encrypt``: see
        :func:`clusterbook.engines.start_engines`. Needs ``pip install 'clusterbook[jupyter]'``.
        A detached cluster has none (its head runs in another process): a
        :class:`ClusterStateError` says so, and what to use instead.
        """
        client: ipyparallel.Client = self._head.engines(n, **how)
        return client

    def on_stop(self, stop: Callable[[], None]) -> None:
        """Have :meth:`stop_engines` and :meth:`stop` call ``stop()``: for services that run
        beside the cluster's jobs (an engines' controller)."""
        self._local.on_stop(stop)

    def stop_engines(self) -> None:
        """Stop every engine and controller :meth:`engines` started (``stop()`` does too)."""
        self._local.stop_engines()

    # -- status ---------------------------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """An immutable view of the cluster now (what widgets and ``status()`` render)."""
        return self._head.snapshot()

    def subscribe(self, callback: Callable[[ClusterSnapshot], None]) -> Callable[[], None]:
        """Call ``callback(snapshot)`` whenever the cluster changes (started, stopped, a job
        started or ended); returns the function that unsubscribes. Callbacks run on the
        thread that made the change and must be quick."""
        return self._head.subscribe(callback)

    @property
    def time_left(self) -> float | None:
        """Seconds until the cluster stops by itself (``life_span``, ``idle_timeout``), if
        one of them is set and it runs."""
        return self._head.time_left

    def status(self) -> pd.DataFrame:
        """One row per node: node, host, slots, gpus, gpu_model, state, ranks, job, ...
        (:func:`~clusterbook.status.nodes_frame`)."""
        return self._head.status()

    def resource_history(
        self, window: Duration | None = None, **only: Unpack[Only]
    ) -> dict[str, Any]:
        """Each node's use, JSON-ready (:meth:`.ResourceFrames.resource_history`)."""
        return self._head.resource_history(window, **only)

    def __repr__(self) -> str:
        return repr(self._head)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """In a notebook: the live widget of the Jupyter layer that registered one, with a
        static HTML view and the repr beside it (:mod:`clusterbook.cluster.display`)."""
        return display.mimebundle(self, **kwargs)


if TYPE_CHECKING:  # mypy checks that each satisfies the protocol the layers above take
    _CLUSTERS: tuple[type[ClusterHandle], ...] = (Cluster, AttachedCluster)
    _JOBS: tuple[type[JobHandle], ...] = (Job, SavedJob)
    _HEADS: tuple[type[Head], ...] = (LocalHead, AttachedCluster)
