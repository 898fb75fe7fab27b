"""The jobs a head runs in this process: :class:`LocalJobs`.

Each job starts on the provider's nodes with the hooks that tie it to its cluster (where an
attempt runs, how a lost node is named, what a failure stops); the jobs are found by id and
stopped with the cluster; and a change of the nodes is what their policy answers: a job with
ranks on a node that was lost fails, a job that asked for it is restarted on a grown round.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from clusterbook.cluster.handle import job_by_id
from clusterbook.errors import ClusterError, ConfigError
from clusterbook.launch.job import Job
from clusterbook.launch.jobdir import job_number
from clusterbook.launch.logstore import LogBudget
from clusterbook.launch.nodes import (
    fail_on_lost_nodes,
    lost_node,
    nodes_for_attempt,
    restart_grown_jobs,
    usable_nodes,
    warn_ranks,
)
from clusterbook.launch.prepare import JobHooks, JobRequest, diagnose, prepare
from clusterbook.launch.setaside import (
    Bench,
    SetAsidePolicy,
    failed_nodes,
    idle_drops,
    with_aside,
)
from clusterbook.providers.base import Provider, node_source
from clusterbook.status import NodeStatus

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from clusterbook.cluster.options import ClusterOptions
    from clusterbook.launch.flavour import Launcher
    from clusterbook.launch.prepare import JobArgs

__all__ = ["LocalJobs"]

#: Seconds between two looks for nodes lost while idle: each reads every node's status, and
#: the nodes change at every heartbeat (a change in between gets a look when they are up).
LOOK_EVERY = 0.5


class LocalJobs:
    """The jobs of the cluster whose nodes ``provider`` gives (see the module's docstring).

    ``recorded`` is called when a job started an attempt or ended (the record must say so
    now); ``running`` says whether the cluster still runs (a restart waits for nodes only
    then). ``bench`` counts the nodes' failures and sets aside those that keep failing
    (:mod:`clusterbook.launch.setaside`): no job's later attempt runs there."""

    def __init__(
        self,
        provider: Provider,
        recorded: Callable[[], None],
        running: Callable[[], bool],
        bench: Bench | None = None,
    ) -> None:
        self._provider = provider
        self.bench = bench or Bench(SetAsidePolicy(), time.time)
        self._recorded = recorded
        self._running = running
        self._jobs: list[Job] = []
        self._logs = LogBudget()  # what the jobs' log buffers hold together
        self._starting = threading.Lock()  # one at a time: each its own number
        self._warned: set[tuple[str, int]] = set()  # (job, attempt) told of their nodes' end
        self._counted: dict[str, int] = {}  # each node's losses, as the last look saw them
        self._looking = threading.Lock()  # one look at a time: each drop counted once
        self._next_look = 0.0  # time.monotonic() of the next look
        self._trailing: threading.Timer | None = None  # the look after the last change
        self._stopped = False  # stop_all() ran: no look any more

    def all(self) -> list[Job]:
        """Every job, oldest first. Without a lock (a copy of a list is atomic): the jobs'
        own threads ask for it, through the cluster's snapshots, while one starts."""
        return list(self._jobs)

    def start(
        self,
        argv: Sequence[str],
        np: int | None,
        options: ClusterOptions,
        launcher: Launcher,
        *,
        label: str | None = None,
        **job: Unpack[JobArgs],
    ) -> Job:
        """Start a job (``Cluster.mpirun``) of the cluster of ``options`` (its id, name,
        interpreter, run directory, environment); ``label``: the name it is shown under."""
        provider, name, bench = self._provider, options.name, self.bench
        source = replace(node_source(provider), aside=lambda: bench.aside())
        nodes = usable_nodes(name, source)
        request = JobRequest.make(argv, np, slots=sum(n.slots for n in nodes), **job)
        names = [n.name for n in nodes]
        hooks = JobHooks(
            on_failure=provider.reach.stop_job,
            on_done=lambda _: self._recorded(),
            diagnose=lambda result: diagnose(provider.watch.unreachable(names), result),
            where=lambda restart: nodes_for_attempt(
                name, source, restart=restart, running=self._running, wait=provider.restart_wait
            ),
            on_attempt=lambda _: self._recorded(),
            lost=lambda nodes: lost_node(nodes, provider.watch.unreachable, ended=True),
            free_port=provider.reach.free_port,
            hold=provider.reach.hold_job,
            ended=lambda plan, result, error: self._ended(
                failed_nodes(plan.nodes, plan.np, result, error)
            ),
        )
        with self._starting:
            started = prepare(
                request,
                cluster=options.id,
                nodes=nodes,
                remote=provider.reach.remote(),
                python=options.python,
                launcher=launcher,
                env=options.env,
                run_dir=options.run_dir,
                last_job=job_number(self._jobs[-1].id) if self._jobs else 0,
                hooks=hooks,
                logs=self._logs,
                forward_env=options.forward_env,
            )
            started.label = label
            self._jobs.append(started)
        return started

    def _ended(self, failed: dict[str, str], *, idle: bool = False) -> None:
        """An attempt ended (``idle``: nodes were lost with none): count its failures; a node
        set aside is news."""
        if not idle and self.bench.policy.failures:  # no look counts drops otherwise
            losses = self._provider.watch.losses()
            with self._looking:  # a node lost under the attempt, counted: no idle drop too
                self._counted |= {n: losses[n] for n in failed if n in losses}
        if self.bench.note(failed, [n.name for n in self._provider.nodes]):
            self._recorded()

    def node_statuses(self) -> list[NodeStatus]:
        """The provider's nodes as its watch sees them, those set aside said so."""
        return with_aside(self._provider.watch.node_statuses(), self.bench.aside())

    def reinstate(self, cluster: str, node: str) -> bool:
        """Bring ``node``, set aside for failing, back into jobs now; whether it was aside.
        A node the cluster does not have is a :class:`ConfigError` naming those it has."""
        known = [s.name for s in self._provider.watch.node_statuses()]
        if node not in known:
            raise ConfigError(
                f"Cluster {cluster!r} has no node {node!r} to reinstate; its nodes are "
                f"{', '.join(map(repr, known)) or 'none yet'} (the node column of "
                "cluster.status())."
            )
        return self.bench.reinstate(node)

    def find(self, cluster_id: str, job_id: str | None = None) -> Job:
        """A job by id (``job-0001``), or the newest one."""
        return job_by_id(self.all(), cluster_id, job_id)

    def nodes_changed(self) -> None:
        """The jobs' policy, when the nodes changed: a running job with ranks on a node that
        was lost cannot finish and fails, naming it; one that asked (``restart_on_join``) is
        restarted on a round that grew, while the cluster runs."""
        jobs = self.all()
        self._count_idle_drops()
        fail_on_lost_nodes(jobs, self._provider.watch.unreachable)
        if self._running():
            restart_grown_jobs(jobs, lambda: self._provider.nodes)
        if warned := self._provider.preempting():
            self._warned |= warn_ranks(jobs, warned, self._warned)

    def _count_idle_drops(self) -> None:
        """Count a failure against each node lost since the last look with no running
        attempt on it (an agent that keeps dropping sets its node aside, as failing ranks
        do); a node lost under an attempt is counted by the attempt's end. At most one look
        each ``LOOK_EVERY`` seconds; a change in between gets the next one."""
        if not self.bench.policy.failures:
            return  # never set aside: no need to read every node's status
        with self._looking:
            now = time.monotonic()
            if self._stopped:
                return
            if now < self._next_look:
                if self._trailing is None:
                    self._trailing = threading.Timer(self._next_look - now, self._look_again)
                    self._trailing.daemon = True
                    self._trailing.start()
                return
            self._next_look = now + LOOK_EVERY
            busy = {n.name for j in self.all() if not j.done() for n in j.plan.nodes}
            dropped, self._counted = idle_drops(self._provider.watch.losses(), self._counted, busy)
        if dropped:
            self._ended(dropped, idle=True)

    def _look_again(self) -> None:
        with self._looking:
            self._trailing = None
        with contextlib.suppress(ClusterError):  # the cluster stopped meanwhile
            self._count_idle_drops()

    def stop_all(self) -> None:
        """Cancel the jobs that run, and end what a failed one kept (``clean="none"``); no
        look for nodes lost while idle comes after."""
        with self._looking:
            trailing, self._trailing, self._stopped = self._trailing, None, True
        if trailing is not None:
            trailing.cancel()
        for job in self.all():
            if not job.done():
                job.cancel()
            job.cleanup()
