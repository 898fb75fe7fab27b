"""The :class:`Cluster` facade: nodes from a provider, a run directory, MPI jobs on the nodes."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterbook.cluster import display
from clusterbook.cluster.options import ClusterOptions
from clusterbook.errors import ClusterStateError, ConfigError
from clusterbook.events import Subscribers
from clusterbook.gpus import Slots
from clusterbook.head import catalog
from clusterbook.head.mirror import Mirror
from clusterbook.head.record import STOP_FILE
from clusterbook.head.services import HeadServices, write_record_of
from clusterbook.launch.flavour import Launcher, find_launcher
from clusterbook.launch.job import Job
from clusterbook.launch.logstore import LogBudget
from clusterbook.launch.nodes import (
    fail_on_lost_nodes,
    lost_node,
    nodes_for_attempt,
    restart_grown_jobs,
    usable_nodes,
)
from clusterbook.launch.prepare import JobHooks, JobRequest, diagnose, prepare
from clusterbook.nodes.commands import runs_frame
from clusterbook.nodes.transfer import gather_into, put_paths
from clusterbook.paths import cluster_dir, default_run_root
from clusterbook.providers.base import Provider, StartContext
from clusterbook.providers.registry import make_provider
from clusterbook.spec import NodeSpec, read_hostfile, validate_timeout
from clusterbook.status import ClusterSnapshot, nodes_frame, snapshot_of
from clusterbook.views.progress import NodeWatch, bar, checked

if TYPE_CHECKING:
    import ipyparallel
    import pandas as pd
    from typing_extensions import Unpack

    from clusterbook.cluster.remote.attached import AttachedCluster
    from clusterbook.engines import EngineArgs
    from clusterbook.export.mpijob import MPIJobArgs
    from clusterbook.head.mirror import Mirror
    from clusterbook.launch.prepare import JobArgs
    from clusterbook.launch.saved import SavedJob
    from clusterbook.providers.environment.detect import Runner
from clusterbook.cluster.options import ClusterOptionsArgs, ElasticArgs, SlurmArgs, SSHArgs

__all__ = ["Cluster", "default_run_root"]

_LIVE: weakref.WeakSet[Cluster] = weakref.WeakSet()
_log = logging.getLogger("clusterbook.cluster.facade")


class Cluster:
    """A set of nodes to run MPI jobs on.

    Make one with :meth:`local`, :meth:`ssh`, :meth:`elastic`, :meth:`slurm`,
    :meth:`from_hostfile`, :meth:`from_environment` or :meth:`from_spec`; use it as a context
    manager (``start()`` on enter, ``stop()`` on exit, also on error). Every job's per-rank
    logs go to files under :attr:`run_dir` as they arrive, and stay there after the cluster
    stops. Every constructor takes the options of
    :class:`~clusterbook.cluster.options.ClusterOptions`: ``name``, ``run_dir``, ``python``,
    ``launcher``, ``mpi``, ``env`` and ``forward_env``.
    """

    def __init__(self, provider: Provider, options: ClusterOptions | None = None) -> None:
        options = options or ClusterOptions.make(provider.kind)
        self._provider = provider
        self._options = options
        self.kind = provider.kind
        self.name = options.name
        self.python = options.python
        self._state = "created"
        self._started: float | None = None
        self._created = time.time()
        self._started_at: float | None = None
        self._stopped_at: float | None = None
        self._stop_reason: str | None = None
        self._services: HeadServices | None = None
        self._supervised = False  # this process is a detached cluster's supervisor
        self._remote: AttachedCluster | None = None  # the supervisor of a detached cluster
        self._spec: dict[str, Any] | None = None
        self._mirror: Mirror | None = None  # copies at work_dir=URL
        self._launcher: Launcher | None = None
        self._jobs: list[Job] = []
        self._logs = LogBudget()  # what the jobs' log buffers hold together
        self._lock = threading.RLock()
        self._subscribers: Subscribers[ClusterSnapshot] = Subscribers()
        self._stoppers: list[Callable[[], None]] = []
        up = ("ready", "joined", "running")
        self._watch = NodeWatch(lambda: sum(s.state in up for s in provider.node_statuses()))

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Cluster:
        """A cluster of any registered kind: ``{"kind": "ssh", "hosts": [...], "name": ...}``
        (the kind's own arguments and the cluster options, in one mapping). An unknown kind
        is a :class:`ConfigError` listing the known ones."""
        args = dict(spec)
        kind = args.pop("kind", None)
        own = {k: args.pop(k) for k in list(args) if k in ClusterOptions.given_names()}
        provider = make_provider(kind, args)
        if own.get("life_span") is None and provider.life_span is not None:
            own["life_span"] = provider.life_span  # a batch job's nodes go at its time limit
        cluster = cls(provider, ClusterOptions.make(provider.kind, **own))
        cluster._spec = {"kind": kind, **args, **own}
        return cluster

    @classmethod
    def local(
        cls, workers: int = 1, slots: Slots | None = None, **options: Unpack[ClusterOptionsArgs]
    ) -> Cluster:
        """A cluster of ``workers`` nodes on this machine, ``slots`` ranks each (default: its
        cores) before a job counts as oversubscribed.

        ``slots="gpus"`` gives each node one slot per GPU: the machine's GPUs (``nvidia-smi
        -L``, counted now) are shared out among the nodes, and a node left with none is a
        :class:`ConfigError`. Whatever the slots, each rank gets one of the GPUs of its
        machine in ``CUDA_VISIBLE_DEVICES`` (see :mod:`clusterbook.gpus`)."""
        return cls.from_spec({"kind": "local", "workers": workers, "slots": slots, **options})

    @classmethod
    def ssh(cls, hosts: Sequence[str], **args: Unpack[SSHArgs]) -> Cluster:
        """A cluster of SSH hosts (``["node1:4", "node2:4"]``: names or addresses, with
        slots; ``"node1:gpus"``: one slot per GPU of the node, counted at ``start()``),
        bootstrapped securely at ``start()`` (arguments: :class:`SSHArgs`).

        Each node needs the head's Python environment (the same Python minor version,
        clusterbook, mpi4py and MPI): at the same path, or where ``node_python`` says.
        ``start()`` connects to every host once (in parallel, retrying until
        ``connect_timeout`` while sshd comes up), checks Python, clusterbook, mpi4py and MPI
        against the head and cores against slots, then installs a per-cluster key pair and
        known_hosts so that the MPI launcher's own ssh (node to node too) checks host keys
        strictly. ``stop()`` removes the key, the files and every process of the cluster.
        """
        return cls.from_spec({"kind": "ssh", "hosts": hosts, **args})

    @classmethod
    def elastic(cls, min_nodes: int, max_nodes: int, **args: Unpack[ElasticArgs]) -> Cluster:
        """A cluster whose nodes join by themselves (arguments: :class:`ElasticArgs`).

        ``start()`` serves the rendezvous and prints the command nodes join with
        (``clusterbook worker join URL --token-file F``; also :attr:`join_command`).
        ``wait_ready()`` returns once a round completes: ``min_nodes`` joined and the last
        call passed, or ``max_nodes`` joined. Each node says its slots as it joins
        (``--slots N``, default its cores; ``--slots gpus``: one per GPU it has).
        """
        bounds = {"min_nodes": min_nodes, "max_nodes": max_nodes}
        return cls.from_spec({"kind": "elastic", **bounds, **args})

    @classmethod
    def slurm(
        cls,
        nodes: int = 2,
        slots: int | None = None,
        partition: str | None = None,
        time: str | float | None = "1:00:00",
        account: str | None = None,
        sbatch_args: Sequence[str] = (),
        min_nodes: int | None = None,
        **args: Unpack[SlurmArgs],
    ) -> Cluster:
        """A cluster of ``nodes`` nodes from one Slurm batch job (other arguments:
        :class:`SlurmArgs`).

        ``start()`` submits the job (``sbatch``; its script and output go to :attr:`run_dir`)
        and returns at once; its step runs ``clusterbook worker join`` on every node it gets,
        so the nodes join as those of :meth:`elastic` do, each with its own sshd for MPI.
        ``wait_ready()`` returns once they joined (``min_nodes``: the job may start with fewer,
        ``sbatch --nodes=MIN-MAX``). While the job waits in the queue, ``status()`` shows a
        pending row per node to come, with Slurm's reason. ``slots`` is each node's ranks
        (``--cpus-per-task``; default: whole nodes, ``--exclusive``, one slot per CPU);
        ``partition``, ``time`` (Slurm's ``"1:00:00"``, ``"2-0"``, or ``"30m"``) and
        ``account`` go to sbatch (``time=None``: the partition's default), and so do
        ``sbatch_args`` (last: they win). The time limit is the cluster's ``life_span`` unless
        it is given one. ``stop()`` ends the job
        (``scancel`` if it is still there) and leaves nothing on the nodes. sbatch's refusal (an
        unknown partition, a bad time, no such account) is a :class:`ConfigError` quoting it.
        The nodes must see the head's home directory (the token file) and its Python
        environment at the same path, as the nodes of a Slurm cluster do.
        """
        job = {
            "nodes": nodes,
            "slots": slots,
            "partition": partition,
            "time": time,
            "account": account,
            "sbatch_args": tuple(sbatch_args),
            "min_nodes": min_nodes,
        }
        return cls.from_spec({"kind": "slurm", **job, **args})

    @classmethod
    def from_hostfile(cls, path: str | os.PathLike[str], **args: Unpack[SSHArgs]) -> Cluster:
        """An SSH cluster (:meth:`ssh`) of the hosts in an Open MPI (``node1 slots=4``,
        ``max_slots=N``) or MPICH (``node1:4``) hostfile: one node per distinct host, the
        slots of its lines added up, comments and blank lines skipped. A line of neither form
        is a :class:`ConfigError` naming the file, the line's number and the line."""
        return cls.ssh(read_hostfile(path), **args)

    @classmethod
    def from_environment(
        cls,
        kind: str | None = None,
        *,
        slots: int | None = None,
        environ: Mapping[str, str] | None = None,
        root: str | os.PathLike[str] | None = None,
        runner: Runner | None = None,
        via: str | None = None,
        **args: Unpack[SSHArgs],
    ) -> Cluster:
        """An SSH cluster (:meth:`ssh`) of the nodes the system around this process gives: a
        Slurm allocation, a PBS/Torque job, a SageMaker training job or a Kubeflow MPIJob's launcher
        pod (what is read, and in which order: :mod:`clusterbook.providers.environment.detect`).

        ``kind`` reads that system only (default: ``CLUSTERBOOK_ENVIRONMENT``, else the first
        found); ``slots`` gives every node that many instead of what the system says. The system's
        SSH settings (an MPIJob's key and pinned host keys, SageMaker's new containers trusted on
        first use) and MPI flavour are defaults that ``args`` (those of :meth:`ssh`) override.
        ``environ``, ``root`` and ``runner`` stand for this process's variables, ``/`` and the
        commands it runs (``scontrol``). None found:
        :class:`~clusterbook.providers.environment.detect.EnvironmentNotFoundError` saying what was
        looked for; on a SageMaker host other than the first, or an MPIJob worker pod:
        :class:`~clusterbook.providers.environment.detect.WorkerHostError`.

        ``via`` says how jobs start: ``"srun"``, as steps of the Slurm allocation (no ssh:
        Slurm's daemons start the ranks, MPI through its PMI plugin; see
        :mod:`clusterbook.providers.slurm.srun`), ``"ssh"`` (``mpirun`` over ssh), or ``"auto"``
        (None): srun inside a Slurm allocation where ``srun`` is on ``PATH`` and no SSH
        option is given, else ssh."""
        from clusterbook.providers.environment.detect import (
            cluster_spec,
            detect_environment,
            launch_via,
        )

        found = detect_environment(kind, environ=environ, root=root, runner=runner)
        path = (os.environ if environ is None else environ).get("PATH", "")
        how = launch_via(found, via, args, srun_found=shutil.which("srun", path=path) is not None)
        return cls.from_spec(cluster_spec(found, args, slots, via=how))

    @staticmethod
    def attach(
        what: str | os.PathLike[str],
        *,
        identity: str | os.PathLike[str] | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        ssh_config: str | os.PathLike[str] | None = None,
        python: str | None = None,
        connect_timeout: float = 10.0,
    ) -> AttachedCluster:
        """A handle on a cluster another kernel or process runs (or ran): ``what`` is its id
        (``clusterbook ls``, ``cb.clusters()``), its name (the newest of that name) or its
        directory. It shows the cluster's status and widget, reads and follows its jobs'
        logs, and stops it. An unknown id is an :class:`UnknownClusterError` listing the
        clusters there are; a directory that is not a cluster's, a :class:`RecordError`.

        A cluster whose head runs on another machine is ``"ssh://user@host/ID"`` (port
        ``host:P``; a directory after the host: ``ssh://host/path/to/dir``). It is reached
        over ssh as :meth:`ssh` reaches hosts: the ssh config, the ssh-agent's keys or
        ``identity``, ``known_hosts`` (default ``~/.ssh/known_hosts``), within
        ``connect_timeout`` seconds; ``python`` is the interpreter with clusterbook there
        (default: ``clusterbook`` on the PATH of its ssh sessions, else ``python3``). Close
        the handle (``close()``, or ``with``) to end that connection.
        """
        from clusterbook.cluster.remote.attached import AttachedCluster

        return AttachedCluster.attach(
            what,
            identity=identity,
            known_hosts=known_hosts,
            ssh_config=ssh_config,
            python=python,
            connect_timeout=connect_timeout,
        )

    @property
    def join_command(self) -> str | None:
        """For elastic clusters once started: the command a node joins with."""
        if self._remote is not None:
            return self._remote.join_command
        return self._provider.join_command

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The nodes, as the provider knows them (cores filled in once started); before
        ``start()``, those it will bring up where they are known (a local or SSH cluster's)."""
        if self._remote is not None:
            return self._remote.nodes
        if self._state == "created":
            return self._provider.planned or self._provider.nodes
        return self._provider.nodes

    def _shape(self) -> tuple[NodeSpec, ...]:
        """The nodes whose slots are known now: none before ``start()`` where only the start
        finds them out (nodes that join; SSH hosts of ``"gpus"`` slots)."""
        if self._state == "created" and self._remote is None:
            return self._provider.planned or ()
        return self.nodes

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """created, running or stopped."""
        return self._state

    @property
    def run_dir(self) -> Path:
        """Directory of this cluster's job logs (created by ``start()``)."""
        return self._options.run_dir

    @property
    def launcher(self) -> Launcher:
        """The MPI launcher jobs use (found at ``start()``)."""
        if self._launcher is None:
            opts = self._options
            self._launcher = find_launcher(self.python, opts.launcher, opts.mpi)
        return self._launcher

    @property
    def id(self) -> str:
        """What other processes find the cluster by (``cb.clusters()``, ``clusterbook ls``,
        ``Cluster.attach``): ``NAME-YYYYmmdd-HHMMSS``."""
        return self._options.id

    def start(self, *, progress: bool | None = None) -> Cluster:
        """Find the MPI launcher, prepare the run directory, bring the nodes up (with a bar
        of the nodes up where someone watches; ``progress`` decides instead). A detached
        cluster starts its supervisor process, which does all that, and attaches to it."""
        progress = checked(progress)
        with self._lock:
            if self._state == "running":
                return self
            if self._state == "stopped":
                raise ClusterStateError(
                    f"Cluster {self.name!r} was stopped; make a new cluster to run again."
                )
            if self._options.detached and not self._supervised:
                return self._start_detached()
            launcher = self.launcher
            self._claim_run_dir()
            if self._options.work_dir is not None and self._mirror is None:
                self._mirror = Mirror(self._options.work_dir, self._options.work_dir_options)
            env, total = self._options.env, len(self._provider.node_statuses()) or None
            self._state = "starting"
            self._write_record()
            try:
                with self._watch.showing(bar(progress, f"starting {self.name}", total, "node")):
                    ctx = StartContext(
                        self.id,
                        self.python,
                        launcher,
                        env,
                        self._changed,
                        self._watch.changed,
                        run_dir=self.run_dir,
                    )
                    self._provider.start(ctx)
            except BaseException as exc:
                self._state = "created"
                self._write_record(state="stopped", reason=f"could not start: {exc}")
                raise
            self._started = time.monotonic()
            self._started_at = time.time()
            self._state = "running"
            if not self._supervised:
                _LIVE.add(self)
            self._services = HeadServices(self, started=self._started_at)
            self._services.start()
        self._changed()
        threading.Thread(
            target=catalog.prune_quietly, name="clusterbook-prune", daemon=True
        ).start()
        return self

    def _start_detached(self) -> Cluster:
        """Start this cluster's supervisor process and attach to it."""
        from clusterbook.cluster.remote.attached import AttachedCluster
        from clusterbook.head.supervisor import launch_supervisor

        if self._spec is None:
            raise ConfigError(
                "A detached cluster must be made by Cluster.local, ssh, elastic or from_spec "
                "(its supervisor makes it again from that spec)."
            )
        self._claim_run_dir()
        # Its name too: the supervisor makes the cluster again, and one cluster has one name.
        spec = {**self._spec, "run_dir": str(self.run_dir), "detached": False, "name": self.name}
        spec["life_span"] = self._options.life_span
        launch_supervisor(spec, self.id, self.run_dir)
        self._remote = AttachedCluster.attach(str(self.run_dir))
        self._started = time.monotonic()
        self._started_at = time.time()
        self._state = "running"
        return self

    def _claim_run_dir(self) -> None:
        self._options = catalog.claim(self._options)

    def stop(self) -> None:
        """Stop every job and release the nodes. Safe to call more than once."""
        if self._remote is not None:
            self._remote.stop(reason="stop() was called")
            self._state = "stopped"
            return
        self._stop_for(None)

    def _stop_for(self, reason: str | None) -> None:
        with self._lock:
            if self._state != "running":
                if self._state == "created":
                    self._state = "stopped"
                return
            self._state = "stopping"
            self._stop_reason = reason or "stop() was called"
            jobs = list(self._jobs)
        if reason is not None:
            _log.warning("Stopping cluster %s: %s.", self.name, reason)
        self._write_record()
        try:
            self.stop_engines()
            for job in jobs:
                if not job.done:
                    job.cancel()
                job.cleanup()  # what a failed job kept stopped (clean="none")
        finally:
            try:
                self._provider.stop()
            finally:
                self._stopped_at = time.time()
                services, self._services = self._services, None
                if services is not None:
                    services.close()
                self._write_record(state="stopped")
                if self._mirror is not None:
                    self._mirror.close()
                (self.run_dir / STOP_FILE).unlink(missing_ok=True)
                with contextlib.suppress(OSError):  # empty once the provider cleaned it
                    cluster_dir(self.id).rmdir()
                # Stopped once all of it is done: whoever waits for it finds it all done.
                with self._lock:
                    self._state = "stopped"
                    _LIVE.discard(self)
                self._changed()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout: float = 60, *, progress: bool | None = None) -> None:
        """Return when every node is ready to run ranks; raise if that takes over ``timeout``.

        Nodes of local and SSH clusters are ready once ``start()`` returned, and again once
        nodes they lost joined again (a local cluster starts its agents again); an elastic
        cluster is ready when a rendezvous round completed (``min_nodes`` plus the last call,
        or ``max_nodes``), else :class:`ReadyTimeoutError` says who joined. Nodes that were
        lost and cannot come back (an SSH node whose agent gave up) are a
        :class:`ClusterStateError` saying so, at once. A bar shows the nodes up where someone
        watches (``progress`` decides instead).
        """
        limit = validate_timeout(timeout)
        self._require_running("wait_ready")
        if limit is None:
            return
        if self._remote is not None:
            return self._remote.wait_ready(limit)
        if gone := self._provider.lost_for_good():
            raise ClusterStateError(gone)
        total = (self._provider.bounds or (len(self.nodes),))[0] or None
        with self._watch.showing(bar(progress, "waiting for nodes", total, "node")):
            self._provider.wait_ready(limit)

    # -- jobs -----------------------------------------------------------------------------

    @property
    def total_slots(self) -> int:
        return sum(n.slots for n in self.nodes)

    @property
    def jobs(self) -> Sequence[Job | SavedJob]:
        """Every job started on this cluster, oldest first (of a detached cluster: as read
        from their directories)."""
        if self._remote is not None:
            return self._remote.jobs
        with self._lock:
            return list(self._jobs)

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
        self._require_running("mpirun")
        if self._remote is not None:
            return self._remote.mpirun(argv, np, **job)
        nodes = usable_nodes(self.name, self._provider)
        request = JobRequest.make(argv, np, slots=sum(n.slots for n in nodes), **job)
        unreachable, names = self._provider.unreachable, [n.name for n in nodes]

        hooks = JobHooks(
            on_failure=self._provider.stop_job,
            on_done=lambda _: self._changed(record=True),
            diagnose=lambda result: diagnose(unreachable(names), result),
            where=lambda restart: nodes_for_attempt(
                self.name, self._provider, restart=restart, running=lambda: self._state == "running"
            ),
            on_attempt=lambda _: self._changed(record=True),
            lost=lambda nodes: lost_node(nodes, self._provider.unreachable),
            free_port=self._provider.free_port,
            hold=self._provider.hold_job,
        )
        with self._lock:
            started = prepare(
                request,
                cluster=self.id,
                nodes=nodes,
                remote=self._provider.remote(),
                python=self.python,
                launcher=self.launcher,
                env=self._options.env,
                run_dir=self.run_dir,
                jobs_so_far=len(self._jobs),
                hooks=hooks,
                logs=self._logs,
                forward_env=self._options.forward_env,
            )
            self._jobs.append(started)
        self._changed(record=True)
        return started

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
            nodes=self._shape(),
            cluster_name=self.name,
            flavour=flavour,
            cluster_env=self._options.env,
            **options,
        )

    def put(self, *paths: str | os.PathLike[str], progress: bool | None = None) -> None:
        """Copy files and directories (with all they hold) from this machine to the same
        absolute paths on every node that does not share its filesystem.

        A file a node already has with the same bytes is left alone (a shared filesystem
        costs nothing); the nodes' copies of what did not exist there before are removed by
        :meth:`stop`. On a local cluster there is nothing to do.
        """
        self._require_running("put")
        if self._remote is not None:
            return self._remote.put(*paths, progress=progress)
        put_paths(self._provider.put, paths, progress)

    def run_on_nodes(self, argv: Sequence[str], timeout: float = 60.0) -> pd.DataFrame:
        """Run ``argv`` on every node at once (each stopped after ``timeout`` seconds), for
        set-up such as ``pip install``; one row per node: node, host, returncode (None: it
        was stopped, or the node could not be asked), stdout, stderr (their last MiB),
        duration."""
        self._require_running("run_on_nodes")
        if self._remote is not None:
            return self._remote.run_on_nodes(argv, timeout)
        return runs_frame(self._provider.run_on_nodes(argv, timeout))

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
        self._require_running("gather")
        if self._remote is not None:
            return self._remote.gather(directory, progress=progress)
        return gather_into(self._provider.gather, Path(directory), progress)

    def engines(self, n: int | None = None, **how: Unpack[EngineArgs]) -> ipyparallel.Client:
        """Start ``n`` ipyparallel engines (default: all slots) as an MPI job on the nodes
        and return a connected client; ``%%px`` then runs on them. Engine id = MPI rank; they
        stop with :meth:`stop_engines` or :meth:`stop`. ``timeout``, ``env``, ``encrypt``: see
        :func:`clusterbook.engines.start_engines`. Needs ``pip install 'clusterbook[jupyter]'``.
        A detached cluster has none (its head runs in another process): a
        :class:`ClusterStateError` says so, and what to use instead.
        """
        self._require_running("engines")
        if self._remote is not None:
            return self._remote.engines(n, **how)  # refused, saying why and what instead
        from clusterbook.engines import start_engines

        remote = self._provider.remote()
        head = (remote.head_addr or None) if remote is not None else None
        return start_engines(self, n, head_addr=head, **how)

    def on_stop(self, stop: Callable[[], None]) -> None:
        """Have :meth:`stop_engines` and :meth:`stop` call ``stop()``: for services that run
        beside the cluster's jobs (an engines' controller)."""
        with self._lock:
            self._stoppers.append(stop)

    def stop_engines(self) -> None:
        """Stop every engine and controller :meth:`engines` started (``stop()`` does too)."""
        with self._lock:
            stoppers, self._stoppers = self._stoppers, []
        for stop in reversed(stoppers):
            stop()

    # -- status ---------------------------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """An immutable view of the cluster now (what widgets and ``status()`` render)."""
        if self._remote is not None:
            return self._remote.snapshot()
        # Not under the cluster's lock: the provider's threads ask for snapshots (through
        # subscribers) while start() holds it waiting for them.
        jobs, state = list(self._jobs), self._state
        services = self._services
        left = services.keeper.time_left() if services and state == "running" else None
        return snapshot_of(
            name=self.name,
            kind=self.kind,
            state=state,
            statuses=self._provider.node_statuses(),
            jobs=jobs,
            launcher=self._launcher.path if self._launcher else None,
            run_dir=str(self.run_dir),
            uptime=None if self._started is None else time.monotonic() - self._started,
            problem=self._problem(),
            bounds=self._provider.bounds,
            time_left=left,
        )

    def _problem(self) -> str | None:
        """What is wrong now: nodes lost for good first (what mpirun and wait_ready say too),
        else with the nodes (the provider's view), and with the head's services."""
        services = self._services
        found = (
            self._provider.lost_for_good() or self._provider.problem(),
            services.problem if services else None,
        )
        return " ".join(p for p in found if p) or None

    def subscribe(self, callback: Callable[[ClusterSnapshot], None]) -> Callable[[], None]:
        """Call ``callback(snapshot)`` whenever the cluster changes (started, stopped, a job
        started or ended); returns the function that unsubscribes. Callbacks run on the
        thread that made the change and must be quick."""
        if self._remote is not None:
            return self._remote.subscribe(callback)
        return self._subscribers.subscribe(callback)

    def _changed(self, *, record: bool = False) -> None:
        """Tell subscribers and the record (``record``: now, not at the keeper's next tick:
        a job's start or end, which another process must see even if this one dies next)."""
        # Not under the cluster's lock: this runs on the provider's thread, which start()
        # may be waiting for with the lock held (a copy of the list is atomic).
        jobs = list(self._jobs)
        fail_on_lost_nodes(jobs, self._provider.unreachable)
        if self._state == "running":
            restart_grown_jobs(jobs, lambda: self._provider.nodes)
        self._watch.changed()
        services = self._services
        if services is not None:
            if record:
                services.keeper.write()
            else:
                services.keeper.changed()
        if len(self._subscribers):
            self._subscribers.publish(self.snapshot())

    def _write_record(self, state: str | None = None, reason: str | None = None) -> None:
        try:
            write_record_of(self, state, reason)
        except OSError as exc:
            _log.warning("Could not write the record of cluster %s: %s", self.name, exc)

    @property
    def time_left(self) -> float | None:
        """Seconds until the cluster stops by itself (``life_span``, ``idle_timeout``), if
        one of them is set and it runs."""
        if self._remote is not None:
            return self._remote.time_left
        services = self._services
        left = services.keeper.time_left() if services is not None else None
        return None if left is None else max(0.0, left[0])

    def status(self) -> pd.DataFrame:
        """One row per node: node, host, slots, gpus, gpu_model, state, ranks, job, ...
        (:func:`~clusterbook.status.nodes_frame`)."""
        return nodes_frame(self.snapshot())

    def __repr__(self) -> str:
        launcher = ""
        if self._launcher is not None:
            launcher = f" {self._launcher.flavour.value} {self._launcher.version}"
        problem = self._problem() if self._state == "running" else None
        return (
            f"<Cluster {self.name!r} {self.kind} {self._state}: {len(self.nodes)} nodes, "
            f"{self.total_slots} slots{launcher}{f' PROBLEM: {problem}' if problem else ''}>"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """In a notebook: the live widget of the Jupyter layer that registered one, with a
        static HTML view and the repr beside it (:mod:`clusterbook.cluster.display`)."""
        return display.mimebundle(self, **kwargs)

    def _require_running(self, what: str) -> None:
        if self._state == "created":
            raise ClusterStateError(
                f"Cluster {self.name!r} is not started; call cluster.start() or use "
                f"'with cluster:' before {what}()."
            )
        if self._state != "running":
            raise ClusterStateError(
                f"Cluster {self.name!r} is {self._state}; make a new cluster to {what}()."
            )


@atexit.register
def _stop_all() -> None:
    for cluster in list(_LIVE):
        cluster.stop()
