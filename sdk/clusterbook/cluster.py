"""The :class:`Cluster` facade: nodes from a provider, a run directory, MPI jobs on the nodes."""

from __future__ import annotations

import atexit
import os
import re
import secrets
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterbook.errors import (
    ClusterError,
    ClusterStateError,
    ConfigError,
    NodeLostError,
    RunDirError,
)
from clusterbook.events import Subscribers
from clusterbook.launch.command import LaunchPlan, build_command, placement
from clusterbook.launch.flavour import Launcher, MPIFlavour, find_launcher
from clusterbook.launch.job import Job
from clusterbook.launch.logs import LogStore
from clusterbook.launch.program import check_argv, check_cwd, resolve_program
from clusterbook.launch.rankwrap import HOOK_DIR
from clusterbook.launch.result import JobResult, ssh_refusals
from clusterbook.paths import default_run_root
from clusterbook.providers.base import Provider, StartContext
from clusterbook.providers.local import LocalAgentsProvider, local_nodes
from clusterbook.spec import NodeSpec, validate_env, validate_np, validate_timeout
from clusterbook.status import ClusterSnapshot, NodeStatus, job_status, nodes_frame
from clusterbook.transfer import outgoing

if TYPE_CHECKING:
    from clusterbook.ssh.hostkeys import HostKeyPolicy

if TYPE_CHECKING:
    import ipyparallel
    import pandas as pd

__all__ = ["Cluster", "default_run_root"]


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_JOB_RE = re.compile(r"job-\d{4,}")
_LIVE: weakref.WeakSet[Cluster] = weakref.WeakSet()


class Cluster:
    """A set of nodes to run MPI jobs on.

    Make one with :meth:`local`; use it as a context manager (``start()`` on enter,
    ``stop()`` on exit, also on error). Every job's per-rank logs go to files under
    :attr:`run_dir` as they arrive, and stay there after the cluster stops.
    """

    def __init__(
        self,
        provider: Provider,
        *,
        name: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        python: str | None = None,
        launcher: str | None = None,
        mpi: MPIFlavour | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._provider = provider
        if hasattr(provider, "changed"):
            provider.changed = lambda: self._changed()
        self.kind = provider.kind
        self.name = name or f"{provider.kind}-{secrets.token_hex(3)}"
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise ConfigError(
                f"Cluster name {self.name!r} must be 1-63 letters, digits, '.', '-' or '_', "
                "starting with a letter or digit."
            )
        # A relative path would mean another file once a job runs in another directory.
        self.python = os.path.abspath(python) if python and os.sep in python else python
        self.python = self.python or sys.executable
        self._launcher_path = launcher
        self._mpi = mpi
        self._env = validate_env(env)
        self._run_dir = Path(run_dir) if run_dir is not None else None
        self._state = "created"
        self._started: float | None = None
        self._launcher: Launcher | None = None
        self._jobs: list[Job] = []
        self._lock = threading.RLock()
        self._subscribers: Subscribers[ClusterSnapshot] = Subscribers()
        self._stoppers: list[Callable[[], None]] = []

    @classmethod
    def local(
        cls,
        workers: int = 1,
        slots: int | None = None,
        *,
        name: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        python: str | None = None,
        launcher: str | None = None,
        mpi: MPIFlavour | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Cluster:
        """A cluster of ``workers`` nodes on this machine, ``slots`` ranks each.

        Parameters
        ----------
        workers
            Number of nodes.
        slots
            Ranks per node before a job counts as oversubscribed (default: number of cores).
        name
            Name shown in status and used for the run directory.
        run_dir
            Directory for job logs (default: a new one under :func:`default_run_root`).
        python
            Interpreter that ``"python"`` in a job's argv stands for (default: this one).
        launcher, mpi
            Path of mpirun/mpiexec, or the MPI flavour (``"openmpi"``, ``"mpich"``) to look
            for; by default the launcher next to ``python`` is used, then the one on PATH.
        env
            Variables every job's ranks get (a job's own ``env`` adds to them).
        """
        return cls(
            LocalAgentsProvider(local_nodes(workers, slots)),
            name=name,
            run_dir=run_dir,
            python=python,
            launcher=launcher,
            mpi=mpi,
            env=env,
        )

    @classmethod
    def ssh(
        cls,
        hosts: Sequence[str],
        *,
        user: str | None = None,
        identity: str | os.PathLike[str] | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        host_keys: str | HostKeyPolicy | Mapping[str, str] | None = None,
        port: int = 22,
        connect_timeout: float = 30.0,
        node_python: Mapping[str, str] | None = None,
        name: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        python: str | None = None,
        launcher: str | None = None,
        mpi: MPIFlavour | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Cluster:
        """A cluster of SSH hosts, bootstrapped securely at ``start()``.

        Each node needs the head's Python environment (the same Python minor version,
        clusterbook, mpi4py and MPI): at the same path, or where ``node_python`` says.
        ``start()`` connects to every host once (in parallel, retrying until
        ``connect_timeout`` while sshd comes up), checks Python, clusterbook, mpi4py and MPI
        against the head and cores against slots, then installs a per-cluster key pair and
        known_hosts so that the MPI launcher's own ssh (node to node too) checks host keys
        strictly. ``stop()`` removes the key, the files and every process of the cluster from
        every node.

        Parameters
        ----------
        hosts
            ``["node1:4", "node2:4"]``: host names or addresses, with slots (default 1).
        user, identity
            Login user (default: yours) and private key (default ``~/.ssh/id_ed25519``).
        known_hosts, host_keys
            Host key policy: by default keys must be in ``known_hosts`` (default the user's
            ``~/.ssh/known_hosts``); ``host_keys="accept-new"`` trusts new hosts on first use
            (recorded in ``known_hosts`` if given, else ``~/.clusterbook/known_hosts``; later
            changes are refused); a mapping of host to
            ``"SHA256:..."`` fingerprint pins keys. A changed key is always refused.
        port
            sshd port of every node.
        connect_timeout
            Seconds to wait for every node's sshd to answer.
        node_python
            Interpreters of nodes whose environment is at another path than the head's, like
            ``{"node2": "/opt/venv/bin/python"}`` (its MPI launcher must be beside it). Jobs
            then run through a per-cluster link to each node's own environment, which needs
            the same home directory on every node.
        name, run_dir, python, launcher, mpi, env
            As for :meth:`local`.
        """
        from clusterbook.providers.ssh import SSHProvider

        provider = SSHProvider(
            hosts,
            user=user,
            identity=identity,
            known_hosts=known_hosts,
            host_keys=host_keys,
            port=port,
            connect_timeout=connect_timeout,
            node_python=node_python,
        )
        return cls(
            provider,
            name=name,
            run_dir=run_dir,
            python=python,
            launcher=launcher,
            mpi=mpi,
            env=env,
        )

    @classmethod
    def elastic(
        cls,
        min_nodes: int,
        max_nodes: int,
        *,
        listen: str = "127.0.0.1",
        port: int = 0,
        last_call: float = 1.0,
        join_timeout: float = 600.0,
        keep_alive_interval: float = 1.0,
        keep_alive_max_attempt: int = 3,
        name: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        python: str | None = None,
        launcher: str | None = None,
        mpi: MPIFlavour | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Cluster:
        """A cluster whose nodes join by themselves.

        ``start()`` serves the rendezvous on ``listen:port`` and prints the command nodes join
        with (``clusterbook worker join URL --token-file F``; also :attr:`join_command`).
        ``wait_ready()`` returns once a round completes: ``min_nodes`` joined and the last
        call (``last_call`` seconds) passed, or ``max_nodes`` joined. Nodes heartbeat every
        ``keep_alive_interval`` seconds and are dropped after ``keep_alive_max_attempt``
        missed beats, or at once when their connection drops.
        """
        from clusterbook.providers.elastic import ElasticProvider

        provider = ElasticProvider(
            min_nodes,
            max_nodes,
            listen=listen,
            port=port,
            last_call=last_call,
            join_timeout=join_timeout,
            keep_alive_interval=keep_alive_interval,
            keep_alive_max_attempt=keep_alive_max_attempt,
        )
        return cls(
            provider,
            name=name,
            run_dir=run_dir,
            python=python,
            launcher=launcher,
            mpi=mpi,
            env=env,
        )

    @property
    def join_command(self) -> str | None:
        """For elastic clusters once started: the command a node joins with."""
        return getattr(self._provider, "join_command", None)

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The nodes, as the provider knows them (cores filled in once started)."""
        return self._provider.nodes

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """created, running or stopped."""
        return self._state

    @property
    def run_dir(self) -> Path:
        """Directory of this cluster's job logs (created by ``start()``)."""
        if self._run_dir is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self._run_dir = default_run_root() / f"{self.name}-{stamp}"
        return self._run_dir

    @property
    def launcher(self) -> Launcher:
        """The MPI launcher jobs use (found at ``start()``)."""
        if self._launcher is None:
            self._launcher = find_launcher(self.python, self._launcher_path, self._mpi)
        return self._launcher

    def start(self) -> Cluster:
        """Find the MPI launcher and prepare the run directory. Returns the cluster."""
        with self._lock:
            if self._state == "running":
                return self
            if self._state == "stopped":
                raise ClusterStateError(
                    f"Cluster {self.name!r} was stopped; make a new cluster to run again."
                )
            launcher = self.launcher
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # logs are private
                (self.run_dir / "jobs").mkdir(exist_ok=True)
            except OSError as exc:
                raise RunDirError.from_os_error(self.run_dir, exc) from exc
            self._provider.start(StartContext(self.name, self.python, launcher, self._env))
            self._started = time.monotonic()
            self._state = "running"
            _LIVE.add(self)
        self._changed()
        return self

    def stop(self) -> None:
        """Stop every job and release the nodes. Safe to call more than once."""
        with self._lock:
            if self._state != "running":
                self._state = "stopped"
                return
            self._state = "stopping"
            jobs = list(self._jobs)
        try:
            self.stop_engines()
            for job in jobs:
                if not job.done:
                    job.cancel()
        finally:
            self._provider.stop()
            with self._lock:
                self._state = "stopped"
                _LIVE.discard(self)
            self._changed()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout: float = 60) -> None:
        """Return when every node is ready to run ranks; raise if that takes over ``timeout``.

        Nodes of local and SSH clusters are ready once ``start()`` returned; an elastic
        cluster is ready when a rendezvous round completed (``min_nodes`` plus the last call,
        or ``max_nodes``), else :class:`ReadyTimeoutError` says who joined.
        """
        limit = validate_timeout(timeout)
        self._require_running("wait_ready")
        wait = getattr(self._provider, "wait_ready", None)
        if wait is not None and limit is not None:
            wait(limit)

    # -- jobs -----------------------------------------------------------------------------

    @property
    def total_slots(self) -> int:
        return sum(n.slots for n in self.nodes)

    @property
    def jobs(self) -> list[Job]:
        """Every job started on this cluster, oldest first."""
        with self._lock:
            return list(self._jobs)

    def mpirun(
        self,
        argv: Sequence[str],
        np: int | None = None,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
        oversubscribe: bool = False,
        launcher_args: Sequence[str] = (),
        abort_on_error: bool = True,
    ) -> Job:
        """Start ``argv`` as an MPI program of ``np`` ranks on the cluster's nodes.

        Parameters
        ----------
        argv
            The program and its arguments, as a list; ``"python"`` stands for the cluster's
            interpreter.
        np
            Number of ranks (default: all slots).
        env
            Variables for the ranks, passed byte for byte.
        cwd
            Working directory of the ranks (default: the current one).
        timeout
            Seconds after which the job is stopped; Python ranks first dump their stacks.
        oversubscribe
            Allow more ranks than slots.
        launcher_args
            Extra arguments for mpirun/mpiexec, placed before the program.
        abort_on_error
            A Python rank that raises, or calls ``sys.exit`` with a non-zero code, aborts the
            whole MPI job, so that no other rank hangs in a collective. Turn it off for
            programs that handle errors themselves (interactive engines).

        Returns
        -------
        Job
            The running job; ``job.wait()`` returns its :class:`JobResult`.
        """
        self._require_running("mpirun")
        program = check_argv(argv)
        nodes = self.nodes
        if not nodes:
            raise ClusterStateError(
                f"Cluster {self.name!r} has no nodes yet; call cluster.wait_ready() first."
            )
        np = validate_np(
            self.total_slots if np is None else np, self.total_slots, oversubscribe=oversubscribe
        )
        job_env = {**self._env, **validate_env(env)}
        limit = validate_timeout(timeout)
        workdir = check_cwd(cwd)
        base_env = dict(os.environ)
        lost = self._provider.unreachable([n.name for n in nodes], lost_only=True)
        if lost:
            raise ClusterStateError(
                f"Cluster {self.name!r} lost {len(lost)} of its nodes: "
                + "; ".join(lost.values())
                + ". Stop it and start a new one (or, for an elastic cluster, wait for the next "
                "round with cluster.wait_ready())."
            )
        remote = self._provider.remote()
        # Nodes whose environments differ in path run the same per-cluster link on each node.
        python = (remote and remote.python) or self.python
        launcher = (remote and remote.launcher) or self.launcher
        program = resolve_program(
            program,
            python=python,
            path_env={**base_env, **job_env}.get("PATH"),
            cwd=workdir,
            local=remote is None,
        )
        job_id, directory = self._new_job_dir()
        token = f"{self.name}-{secrets.token_hex(6)}"
        plan = LaunchPlan(
            launcher=launcher,
            nodes=nodes,
            np=np,
            argv=tuple(program),
            env=job_env,
            hostfile=str(directory / "hostfile"),
            output_dir=str(directory / "raw"),
            as_root=hasattr(os, "geteuid") and os.geteuid() == 0,
            oversubscribe=oversubscribe,
            remote=remote,
            inherited_env=base_env,
            launcher_args=tuple(launcher_args),
            job_token=token,
            hook_dir=(remote and remote.hook_dir) or HOOK_DIR,
            abort_on_error=abort_on_error,
        )
        here = socket.gethostname()
        names = remote.hostnames if remote else {}
        hosts = {
            r: names.get(nodes[i].host, nodes[i].host) if remote else here
            for r, i in enumerate(placement(nodes, np))
        }
        store = LogStore(directory, hosts, launcher_host=here)
        stop_job = self._provider.stop_job
        names = [n.name for n in nodes]
        job = Job(
            job_id,
            plan,
            build_command(plan),
            directory,
            store,
            base_env=base_env,
            cwd=workdir,
            timeout=limit,
            on_failure=stop_job,
            on_done=lambda _: self._changed(),
            diagnose=lambda result: self._diagnose(names, result),
        )
        with self._lock:
            self._jobs.append(job)
        self._changed()
        return job

    def _new_job_dir(self) -> tuple[str, Path]:
        """The next job's id and directory, made now: numbered after every job already in
        the run directory (one used before, or by another process, too)."""
        jobs = self.run_dir / "jobs"
        with self._lock:
            try:
                found = [int(p.name[4:]) for p in jobs.iterdir() if _JOB_RE.fullmatch(p.name)]
            except OSError:
                found = []
            number = max(len(self._jobs), *found, 0) + 1
            while True:
                job_id = f"job-{number:04d}"
                try:
                    (jobs / job_id).mkdir(parents=True, mode=0o700)
                except FileExistsError:
                    number += 1
                    continue
                except OSError as exc:
                    raise RunDirError.from_os_error(jobs / job_id, exc) from exc
                return job_id, jobs / job_id

    def put(self, *paths: str | os.PathLike[str]) -> None:
        """Copy files and directories (with all they hold) from this machine to the same
        absolute paths on every node, for nodes that do not share its filesystem.

        A file a node already has with the same bytes is left alone (a shared filesystem
        costs nothing); the nodes' copies of what did not exist there before are removed
        by :meth:`stop`. On a local cluster there is nothing to do; on an elastic one, the
        nodes on other machines get the files (through the sshd their agent started).
        """
        self._require_running("put")
        sent = outgoing(paths)
        send = getattr(self._provider, "put", None)
        if send is not None and (sent.dirs or sent.files):
            _raise_for("put", send(sent), "")

    def gather(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Move the files ranks wrote in ``directory`` on the nodes (not in its
        subdirectories) to ``directory`` on this machine; return the paths that arrived.

        Files this machine already has there stay as they are (a name another node sent
        too gets ``.from-HOST`` appended); hidden files are left on the nodes. On a local
        cluster there is nothing to move; on an elastic one, the files come from its nodes on
        other machines.
        """
        self._require_running("gather")
        target = Path(directory).expanduser().absolute()
        fetch = getattr(self._provider, "gather", None)
        if fetch is None:
            return []
        have = sorted(p.name for p in target.iterdir()) if target.is_dir() else []
        stored, failed = fetch(target, have)
        _raise_for("gather", failed, f"; what arrived from the others is in {target}")
        return stored

    def engines(
        self,
        n: int | None = None,
        *,
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
        encrypt: bool | None = None,
    ) -> ipyparallel.Client:
        """Start ``n`` ipyparallel engines as an MPI job on the nodes; return a connected client.

        A controller starts on the head with a fresh key; the engines run under the cluster's
        launcher (one per rank, engine id = MPI rank, ``mpi4py``'s ``COMM_WORLD`` spans them)
        and show in the cluster's jobs. In IPython, ``%%px`` runs on them. They stop with
        :meth:`stop_engines` or :meth:`stop`. Needs ``pip install 'clusterbook[jupyter]'``.

        Parameters
        ----------
        n
            Number of engines (default: all slots).
        timeout
            Seconds to wait for every engine; past it they are stopped and
            :class:`ReadyTimeoutError` is raised (:class:`JobFailedError` if they died).
        env
            Variables for the engines, as for :meth:`mpirun`.
        encrypt
            Encrypt the traffic between engines, controller and client with CurveZMQ
            (besides signing it). Default: when the nodes are other machines (about 0.1 s
            more at start).

        Returns
        -------
        ipyparallel.Client
            Connected to the ``n`` engines.
        """
        self._require_running("engines")
        from clusterbook_widgets.engines import start_engines

        remote = self._provider.remote()
        head = remote.head_addr if remote is not None else None
        return start_engines(self, n, timeout=timeout, env=env, head_addr=head, encrypt=encrypt)

    def stop_engines(self) -> None:
        """Stop every engine and controller :meth:`engines` started (``stop()`` does too)."""
        with self._lock:
            stoppers, self._stoppers = self._stoppers, []
        for stop in reversed(stoppers):
            stop()

    def _on_stop(self, stop: Callable[[], None]) -> None:
        """Have :meth:`stop_engines` and :meth:`stop` call ``stop()`` (services of a job)."""
        with self._lock:
            self._stoppers.append(stop)

    # -- status ---------------------------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """An immutable view of the cluster now (what widgets and ``status()`` render)."""
        with self._lock:
            jobs = list(self._jobs)
            state = self._state
        busy: dict[str, tuple[str, list[int]]] = {}
        for job in jobs:
            if job.done:
                continue
            where = job.plan.nodes  # the nodes the job was launched on
            for rank, i in enumerate(placement(where, job.np)):
                busy.setdefault(where[i].name, (job.id, []))[1].append(rank)
        statuses = getattr(self._provider, "node_statuses", None)
        if statuses is not None:
            base = list(statuses())
        else:
            node_state = {"created": "pending", "running": "ready"}.get(state, "left")
            base = [NodeStatus(n.name, n.host, n.slots, node_state) for n in self.nodes]
        nodes = tuple(
            replace(s, state="running", ranks=tuple(busy[s.name][1]), job=busy[s.name][0])
            if s.name in busy and s.state not in ("lost", "left")
            else s
            for s in base
        )
        return ClusterSnapshot(
            name=self.name,
            kind=self.kind,
            state=state,
            nodes=nodes,
            jobs=tuple(job_status(j) for j in jobs),
            launcher=self._launcher.path if self._launcher else None,
            run_dir=str(self.run_dir),
            uptime=None if self._started is None else time.monotonic() - self._started,
            problem=self._provider.problem(),
        )

    def subscribe(self, callback: Callable[[ClusterSnapshot], None]) -> Callable[[], None]:
        """Call ``callback(snapshot)`` whenever the cluster changes (started, stopped, a job
        started or ended); returns the function that unsubscribes. Callbacks run on the
        thread that made the change and must be quick."""
        return self._subscribers.subscribe(callback)

    def _changed(self) -> None:
        self._fail_jobs_on_lost_nodes()
        if len(self._subscribers):
            self._subscribers.publish(self.snapshot())

    def _fail_jobs_on_lost_nodes(self) -> None:
        """A running job with ranks on a node that was lost cannot finish: stop it, naming the
        node (its agent stops what runs there once it has lost the head for its lease)."""
        # Not under the cluster's lock: this runs on the provider's thread, which start() may
        # be waiting for with the lock held (a copy of the list is atomic).
        running = [j for j in list(self._jobs) if not j.done and j.error is None]
        for job in running:
            lost = self._provider.unreachable([n.name for n in job.plan.nodes], lost_only=True)
            if lost:
                name, why = next(iter(lost.items()))
                host = next(n.host for n in job.plan.nodes if n.name == name)
                job.fail(NodeLostError(f"{why}; the job was stopped.", node=name, host=host))

    def _diagnose(self, names: Sequence[str], result: JobResult | None) -> list[str]:
        """Notes on why a job did not succeed: nodes not heard from, a changed host key."""
        notes = list(self._provider.unreachable(names).values())
        if result is not None:
            notes += ssh_refusals(result.launcher_tail)
        return notes

    def status(self) -> pd.DataFrame:
        """One row per node: node, host, slots, state, ranks, job."""
        return nodes_frame(self.snapshot())

    def __repr__(self) -> str:
        launcher = ""
        if self._launcher is not None:
            launcher = f" {self._launcher.flavour.value} {self._launcher.version}"
        problem = self._provider.problem() if self._state == "running" else None
        return (
            f"<Cluster {self.name!r} {self.kind} {self._state}: {len(self.nodes)} nodes, "
            f"{self.total_slots} slots{launcher}{f' PROBLEM: {problem}' if problem else ''}>"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        """In a notebook, a cluster shows itself as a live widget (the Jupyter layer is
        imported here, on display, never at import)."""
        try:
            from clusterbook_widgets import display_cluster
        except ImportError:  # no Jupyter layer installed: plain repr
            return None
        return display_cluster(self)._repr_mimebundle_(**kwargs)

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


def _raise_for(what: str, failed: Mapping[str, Exception], more: str) -> None:
    if failed:
        lines = "".join(f"\n  {host}: {exc}" for host, exc in failed.items())
        raise ClusterError(f"{what}() failed on {len(failed)} node(s){more}:{lines}")


@atexit.register
def _stop_all() -> None:
    for cluster in list(_LIVE):
        cluster.stop()
