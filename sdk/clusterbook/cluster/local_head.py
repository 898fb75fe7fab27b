"""What runs a cluster when this process is its head: :class:`LocalHead`.

It holds the provider (where the nodes come from), the jobs (:mod:`clusterbook.cluster.local_jobs`),
the head's services (:mod:`clusterbook.head.services`, which know it as a
:class:`~clusterbook.head.state.HeadState`) and the cluster's life (created, starting, running,
stopping, stopped). A ``Cluster`` delegates to it; a detached cluster's supervisor runs one. The
provider tells it when the nodes change (:meth:`LocalHead.nodes_changed`): the jobs' policy runs
there; :meth:`LocalHead.changed` only tells the subscribers and the record.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterbook.cluster import display
from clusterbook.cluster.local_jobs import LocalJobs
from clusterbook.cluster.on_nodes import NodeCalls
from clusterbook.cluster.options import ClusterOptions
from clusterbook.cluster.resize import Resizer, Resizing
from clusterbook.durations import Duration
from clusterbook.errors import ClusterStateError, ConfigError
from clusterbook.events import Stoppers, Subscribers
from clusterbook.head import catalog
from clusterbook.head.mirror import Mirror
from clusterbook.head.services import HeadServices
from clusterbook.head.state import HeadTerms, HeadTimes
from clusterbook.launch.flavour import Launcher, find_launcher
from clusterbook.launch.guard import guard
from clusterbook.launch.job import Job
from clusterbook.launch.jobstatus import job_status, with_running_jobs
from clusterbook.launch.setaside import Bench
from clusterbook.lifetime import Lifetime
from clusterbook.paths import cluster_dir
from clusterbook.providers.base import Provider, StartContext
from clusterbook.resources import ResourceFrames
from clusterbook.spec import NodeSpec, validate_timeout
from clusterbook.status import ClusterSnapshot, nodes_frame, snapshot_of
from clusterbook.views.progress import NodeWatch, bar, checked

if TYPE_CHECKING:
    import ipyparallel
    import pandas as pd
    from typing_extensions import Unpack

    from clusterbook.cluster.handle import Head
    from clusterbook.launch.prepare import JobArgs
    from clusterbook.resources import Only

__all__ = ["LocalHead"]

_LIVE: weakref.WeakSet[LocalHead] = weakref.WeakSet()  # stopped when the interpreter exits
_UP = ("ready", "joined", "running")
_log = logging.getLogger("clusterbook.cluster.facade")


class LocalHead(NodeCalls, ResourceFrames, Resizing):
    """A cluster run by this process (see the module's docstring). ``spec`` is what a detached
    cluster's supervisor makes it again from; ``supervised``: this process is that supervisor."""

    def __init__(
        self,
        provider: Provider,
        options: ClusterOptions,
        *,
        spec: Mapping[str, Any] | None = None,
        supervised: bool = False,
    ) -> None:
        self.provider = provider
        self.options = options
        self.spec = None if spec is None else dict(spec)
        self.kind = provider.kind
        self.name = options.name
        self.python = options.python
        self.times = HeadTimes()
        self.terms = HeadTerms(
            Lifetime(options.life_span, options.idle_timeout),
            options.retention,
            one_job=options.ephemeral,
            detached=supervised,
        )
        self._supervised = supervised
        self._state = "created"
        self._started: float | None = None  # monotonic, for the uptime
        self._services = HeadServices(self)
        self._launcher: Launcher | None = None
        self._jobs = LocalJobs(
            provider,
            lambda: self.changed(record=True),
            lambda: self._state == "running",
            Bench(options.set_aside, time.time),
        )
        self._resize = Resizer(provider, self._jobs.all)
        self._lock = threading.RLock()
        self._subscribers: Subscribers[ClusterSnapshot] = Subscribers()
        self._stoppers = Stoppers()
        self._watch = NodeWatch(lambda: sum(s.state in _UP for s in provider.watch.node_statuses()))

    # -- what it is ------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self.options.id

    @property
    def run_dir(self) -> Path:
        return self.options.run_dir

    @property
    def state(self) -> str:
        return self._state

    @property
    def join_command(self) -> str | None:
        return self.provider.join_command

    def job_script(self) -> str:
        """The batch script its provider submits (``Cluster.job_script``)."""
        return self.provider.job_script(self.python, self.id, self.run_dir, self.launcher)

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        if self._state == "created":
            return self.provider.planned or self.provider.nodes
        return self.provider.nodes

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            opts = self.options
            self._launcher = find_launcher(self.python, opts.launcher, opts.mpi)
        return self._launcher

    @property
    def jobs(self) -> list[Job]:
        return self._jobs.all()

    @property
    def time_left(self) -> float | None:
        left = self._services.time_left()
        return None if left is None else max(0.0, left[0])

    # -- its life ------------------------------------------------------------------------

    def start(self, *, progress: bool | None = None) -> Head:
        """Start the cluster here; a detached one starts its supervisor instead, and the
        handle on that supervisor is returned (the head from now on)."""
        progress = checked(progress)
        with self._lock:
            if self._state == "running":
                return self
            if self._state == "stopped":
                raise ClusterStateError(
                    f"Cluster {self.name!r} was stopped; make a new cluster to run again."
                )
            if self.options.detached and not self._supervised:
                return self._start_detached()
            self._start_here(progress)
        self.changed()
        threading.Thread(
            target=catalog.prune_quietly, name="clusterbook-prune", daemon=True
        ).start()
        return self

    def _start_here(self, progress: bool | None) -> None:
        launcher = self.launcher
        self._claim_run_dir()
        if self.options.work_dir is not None and self._services.mirror is None:
            self._services.mirror = Mirror(self.options.work_dir, self.options.work_dir_options)
        total = len(self.provider.watch.node_statuses()) or None
        self._state = "starting"
        self._services.write()
        guard.watch_dir(str(cluster_dir(self.id)))  # its token and keys, if we die running
        try:
            with self._watch.showing(bar(progress, f"starting {self.name}", total, "node")):
                ctx = StartContext(
                    self.id,
                    self.python,
                    launcher,
                    self.options.env,
                    self.nodes_changed,
                    self._watch.changed,
                    run_dir=self.run_dir,
                )
                self.provider.start(ctx)
        except BaseException as exc:
            self._state = "created"
            self._services.write(state="stopped", reason=f"could not start: {exc}")
            raise
        self._started = time.monotonic()
        self.times.started = time.time()
        self._state = "running"
        if not self._supervised:
            _LIVE.add(self)
        self._services.start(self.times.started)

    def _start_detached(self) -> Head:
        """Start this cluster's supervisor process; the handle on it."""
        from clusterbook.cluster.remote.attached import AttachedCluster
        from clusterbook.head.supervisor import launch_supervisor

        if self.spec is None:
            raise ConfigError(
                "A detached cluster must be made by Cluster.local, ssh, elastic or from_spec "
                "(its supervisor makes it again from that spec)."
            )
        self._claim_run_dir()
        # Its name too: the supervisor makes the cluster again, and one cluster has one name.
        spec = {**self.spec, "run_dir": str(self.run_dir), "detached": False, "name": self.name}
        spec["life_span"] = self.options.life_span
        launch_supervisor(spec, self.id, self.run_dir)
        return AttachedCluster.attach(str(self.run_dir))

    def _claim_run_dir(self) -> None:
        opts = self.options
        got, run_dir = catalog.claim(opts.id, opts.run_dir, opts.own_run_dir)
        self.options = replace(opts, id=got, run_dir=run_dir)

    def stop(self, *, reason: str | None = None) -> None:
        """Stop every job and release the nodes. Safe to call more than once."""
        self._stop(reason or "stop() was called", told=False)

    def stop_for(self, reason: str) -> None:
        """Stop for ``reason`` (the life span passed, a handle asked), saying so in the log."""
        self._stop(reason, told=True)

    def _stop(self, reason: str, *, told: bool) -> None:
        with self._lock:
            if self._state != "running":
                if self._state == "created":
                    self._state = "stopped"
                return
            self._state = "stopping"
            self.times.stop_reason = reason
        if told:
            _log.warning("Stopping cluster %s: %s.", self.name, reason)
        self._services.write()
        try:
            self._resize.close()
            self.stop_engines()
            self._jobs.stop_all()
        finally:
            try:
                self.provider.stop()
            finally:
                self._release()

    def _release(self) -> None:
        """What stop() does once the nodes are released, whatever happened before."""
        self.times.stopped = time.time()
        self._services.close()
        guard.release_dir(str(cluster_dir(self.id)))  # empty once the provider cleaned it
        # Stopped once all of it is done: whoever waits for it finds it all done.
        with self._lock:
            self._state = "stopped"
            _LIVE.discard(self)
        self.changed()

    def wait_ready(self, timeout: Duration = 60, *, progress: bool | None = None) -> None:
        limit = validate_timeout(timeout)
        self._require_running("wait_ready")
        if limit is None:
            return
        if gone := self.provider.lost_for_good():
            raise ClusterStateError(gone)
        total = (self.provider.bounds or (len(self.nodes),))[0] or None
        with self._watch.showing(bar(progress, "waiting for nodes", total, "node")):
            self.provider.watch.wait_ready(limit)

    def _resizer(self, what: str) -> Resizer:
        """What ``Cluster.scale`` and ``Cluster.adapt`` act through, once the cluster runs
        here (:mod:`clusterbook.cluster.resize`)."""
        self._require_running(what, here=True)
        return self._resize

    # -- jobs and files ------------------------------------------------------------------

    def mpirun(
        self,
        argv: Sequence[str],
        np: int | None = None,
        *,
        label: str | None = None,
        **job: Unpack[JobArgs],
    ) -> Job:
        """Start a job (``Cluster.mpirun``); ``label``: the name it is shown under."""
        self._require_running("mpirun")
        started = self._jobs.start(argv, np, self.options, self.launcher, label=label, **job)
        self.changed(record=True)
        return started

    def job(self, job_id: str | None = None) -> Job:
        """A job by id (``job-0001``), or the newest one."""
        return self._jobs.find(self.id, job_id)

    def reinstate(self, node: str) -> None:
        """Bring ``node``, set aside for failing, back into jobs now (``Cluster.reinstate``)."""
        if self._jobs.reinstate(self.name, node):
            self.changed(record=True)

    def engines(self, n: int | None = None, **how: Any) -> ipyparallel.Client:
        """Engines on the nodes (``Cluster.engines``: ``how`` is an ``EngineArgs``)."""
        self._require_running("engines")
        from clusterbook.engines import start_engines

        remote = self.provider.reach.remote()
        head = (remote.head_addr or None) if remote is not None else None
        return start_engines(self, n, head_addr=head, **how)

    def on_stop(self, stop: Callable[[], None]) -> None:
        """Have :meth:`stop_engines` and :meth:`stop` call ``stop()``."""
        self._stoppers.add(stop)

    def stop_engines(self) -> None:
        self._stoppers.run()

    # -- status --------------------------------------------------------------------------

    def snapshot(self, *, jobs: bool = True) -> ClusterSnapshot:
        # Not under the lock: the provider's threads ask for snapshots (through subscribers)
        # while start() holds it waiting for them.
        every, state = self._jobs.all(), self._state
        left = self._services.time_left() if state == "running" else None
        return snapshot_of(
            name=self.name,
            kind=self.kind,
            state=state,
            nodes=with_running_jobs(self._jobs.node_statuses(), every),
            jobs=[job_status(j) for j in every] if jobs else [],
            launcher=self._launcher.path if self._launcher else None,
            run_dir=str(self.run_dir),
            uptime=None if self._started is None else time.monotonic() - self._started,
            problem=self._problem(),
            bounds=self.provider.bounds,
            time_left=left,
        )

    def _problem(self) -> str | None:
        """What is wrong now: nodes lost for good first (what mpirun and wait_ready say too),
        else with the nodes (the provider's view), and with the head's services."""
        nodes = self.provider.lost_for_good() or self.provider.watch.problem()
        found = (nodes, self._resize.problem, self._services.problem)
        return " ".join(p for p in found if p) or None

    def status(self) -> pd.DataFrame:
        return nodes_frame(self.snapshot())

    def resource_history(
        self, window: Duration | None = None, **only: Unpack[Only]
    ) -> dict[str, Any]:
        return self.provider.watch.resource_history(window, **only)

    def subscribe(self, callback: Callable[[ClusterSnapshot], None]) -> Callable[[], None]:
        return self._subscribers.subscribe(callback)

    def nodes_changed(self) -> None:
        """What the provider calls when its nodes change (any thread): the jobs' policy
        (:meth:`LocalJobs.nodes_changed`), then the news."""
        # Not under the lock: start() may be waiting for this thread with the lock held.
        self._jobs.nodes_changed()
        self.changed()

    def changed(self, *, record: bool = False) -> None:
        """Tell the bar, the subscribers and the record (``record``: now, not at the keeper's
        next tick: a job's start or end, which another process must see even if this one
        dies next)."""
        self._watch.changed()
        self._services.changed(record=record)
        if len(self._subscribers):
            self._subscribers.publish(self.snapshot())

    def __repr__(self) -> str:
        problem = self._problem() if self._state == "running" else None
        return display.head_repr(self, self._launcher, problem)

    def _require_running(self, what: str, *, here: bool = False) -> None:
        if here and self.options.detached and not self._supervised:  # its supervisor runs it
            raise ClusterStateError(f"A detached cluster can {what}() in its supervisor only.")
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
    for head in list(_LIVE):
        head.stop()
