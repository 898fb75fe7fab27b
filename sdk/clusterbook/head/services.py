"""What a cluster's head serves besides its nodes: its record, its housekeeping, its requests.

A running cluster's head (the kernel that started it, or a detached cluster's supervisor)
keeps ``cluster.json`` current (:mod:`clusterbook.head.record`, through the
:class:`~clusterbook.head.keeper.Keeper`, which also ends the cluster's life on time) and answers
attached handles (:mod:`clusterbook.head.control`): run a job, cancel one, stop, and the rest of
what a cluster does. :class:`HeadServices` holds both for one :class:`~clusterbook.Cluster`.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterbook.errors import ClusterStateError, ConfigError
from clusterbook.head.control import Handler
from clusterbook.head.control_server import ControlServer
from clusterbook.head.keeper import Keeper
from clusterbook.head.liveness import own_mark
from clusterbook.head.record import ClusterRecord, JobEntry, write_record
from clusterbook.launch.jobstatus import job_status
from clusterbook.launch.prepare import JobArgs
from clusterbook.lifetime import Lifetime

if TYPE_CHECKING:
    from clusterbook.cluster.facade import Cluster
    from clusterbook.launch.job import Job

__all__ = ["HeadServices", "record_of"]

_JOB_ARGS = tuple(JobArgs.__annotations__)


class HeadServices:
    """The record, the keeper and the control server of one running cluster."""

    def __init__(self, cluster: Cluster, *, started: float) -> None:
        opts = cluster._options
        self._cluster = cluster
        # A control server that stops shows in the record now, not at the next change.
        self.control = ControlServer(
            cluster.run_dir, _handlers(cluster), on_failure=lambda _: cluster._changed(record=True)
        )
        self.keeper = Keeper(
            cluster.run_dir,
            Lifetime(opts.life_span, opts.idle_timeout),
            write=lambda: write_record_of(cluster),
            stop=cluster._stop_for,
            jobs=lambda: _counts(list(cluster._jobs)),
            started=started,
            one_job=opts.ephemeral,
        )

    @property
    def problem(self) -> str | None:
        """What is wrong with the services: the control server stopped."""
        return self.control.failure

    def start(self) -> HeadServices:
        self.keeper.start()
        return self

    def close(self) -> None:
        """Stop taking requests and housekeeping (the caller writes the last record)."""
        self.control.close()
        self.keeper.close()


def record_of(
    cluster: Cluster, state: str | None = None, reason: str | None = None
) -> ClusterRecord:
    """``cluster`` as its record tells other processes."""
    snap = cluster.snapshot()
    opts, services = cluster._options, cluster._services
    started, program = own_mark()
    return ClusterRecord(
        id=cluster.id,
        name=cluster.name,
        kind=cluster.kind,
        state=state or cluster.state,
        directory=str(cluster.run_dir),
        created=cluster._created,
        started=cluster._started_at,
        stopped=cluster._stopped_at,
        stop_reason=reason or cluster._stop_reason,
        life_span=opts.life_span,
        idle_timeout=opts.idle_timeout,
        retention=opts.retention,
        idle_since=services.keeper.idle_since if services else None,
        detached=cluster._supervised,
        head_pid=os.getpid(),
        head_host=socket.gethostname(),
        head_started=started,
        head_program=program,
        address=services.control.address if services else None,
        python=cluster.python,
        launcher=snap.launcher,
        nodes=snap.nodes,
        jobs=tuple(_entry(job) for job in list(cluster._jobs)),
        problem=snap.problem,
        min_nodes=snap.min_nodes,
        max_nodes=snap.max_nodes,
        updated=time.time(),
        extra={"join_command": cluster.join_command} if cluster.join_command else {},
    )


def write_record_of(cluster: Cluster, state: str | None = None, reason: str | None = None) -> None:
    """Write ``cluster``'s record, and have its mirror (``work_dir=URL``) copy it and the
    jobs that have ended."""
    record = record_of(cluster, state, reason)
    write_record(record)
    mirror = cluster._mirror
    if mirror is not None:
        mirror.record(record.to_json())
        for job in record.jobs:
            if job.state != "running":
                mirror.job(Path(job.directory))


def _counts(jobs: list[Job]) -> tuple[int, int]:
    """How many ``jobs`` run, and how many have ended."""
    running = sum(not j.done for j in jobs)
    return running, len(jobs) - running


def _entry(job: Job) -> JobEntry:
    result, status = job.result, job_status(job)
    return JobEntry(
        id=job.id,
        state=status.state,
        directory=str(job.directory),
        np=job.np,
        argv=tuple(job.argv),
        started=job.started,
        ended=None if result is None else job.started + result.duration,
        returncode=status.returncode,
        failed_ranks=status.failed_ranks,
        token=job.plan.job_token,
        attempt=status.attempt,
        last_reason=status.last_reason,
        restarts=status.restarts,
    )


# -- requests of attached handles -----------------------------------------------------------


def _handlers(cluster: Cluster) -> dict[str, Handler]:
    def mpirun(request: Mapping[str, Any]) -> Mapping[str, Any]:
        job_args = request.get("job") or {}
        if not isinstance(job_args, dict) or set(job_args) - set(_JOB_ARGS):
            raise ConfigError(f"mpirun takes {', '.join(_JOB_ARGS)} besides argv and np.")
        job = cluster.mpirun(request.get("argv"), request.get("np"), **job_args)  # type: ignore[arg-type]
        return {"id": job.id, "directory": str(job.directory)}

    def cancel(request: Mapping[str, Any]) -> Mapping[str, Any]:
        job = _job(cluster, request.get("job"))
        threading.Thread(target=job.cancel, name=f"clusterbook-cancel-{job.id}").start()
        return {}

    def stop(request: Mapping[str, Any]) -> Mapping[str, Any]:
        reason = str(request.get("reason") or "stopped by an attached handle")
        threading.Thread(target=cluster._stop_for, args=(reason,), name="clusterbook-stop").start()
        return {}

    def wait_ready(request: Mapping[str, Any]) -> Mapping[str, Any]:
        cluster.wait_ready(float(request.get("timeout", 60)), progress=False)
        # Now, not at the keeper's next tick: the asker reads the nodes from the record next.
        cluster._changed(record=True)
        return {}

    def put(request: Mapping[str, Any]) -> Mapping[str, Any]:
        cluster.put(*request.get("paths", ()), progress=False)
        return {}

    def gather(request: Mapping[str, Any]) -> Mapping[str, Any]:
        paths = cluster.gather(str(request.get("directory")), progress=False)
        return {"paths": [str(p) for p in paths]}

    def run_on_nodes(request: Mapping[str, Any]) -> Mapping[str, Any]:
        cluster._require_running("run_on_nodes")
        argv, timeout = request.get("argv"), float(request.get("timeout", 60))
        runs = cluster._provider.run_on_nodes(argv, timeout)  # type: ignore[arg-type]
        return {"rows": [asdict(r) for r in runs]}

    return {
        "mpirun": mpirun,
        "cancel": cancel,
        "stop": stop,
        "wait_ready": wait_ready,
        "put": put,
        "gather": gather,
        "run_on_nodes": run_on_nodes,
    }


def _job(cluster: Cluster, job_id: object) -> Job:
    jobs = list(cluster._jobs)
    for job in jobs:
        if job.id == job_id:
            return job
    known = ", ".join(j.id for j in jobs) or "none"
    raise ClusterStateError(f"Cluster {cluster.id} has no job {job_id!r}; its jobs: {known}.")
