"""What a cluster's head serves besides its nodes: its record, its housekeeping, its requests.

A running cluster's head (the kernel that started it, or a detached cluster's supervisor)
keeps ``cluster.json`` current (:mod:`clusterbook.head.record`, through the
:class:`~clusterbook.head.keeper.Keeper`, which also ends the cluster's life on time) and answers
attached handles (:mod:`clusterbook.head.control`): run a job, cancel one, stop, and the rest of
what a cluster does. :class:`HeadServices` holds both for one running cluster, which it knows
as a :class:`~clusterbook.head.state.HeadState`.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterbook.errors import ClusterStateError, ConfigError
from clusterbook.head.control import Handler
from clusterbook.head.control_server import ControlServer
from clusterbook.head.keeper import Keeper
from clusterbook.head.liveness import own_mark
from clusterbook.head.record import STOP_FILE, ClusterRecord, JobEntry, job_json, write_record
from clusterbook.head.state import HeadState
from clusterbook.launch.jobstatus import job_status
from clusterbook.launch.prepare import JobArgs

if TYPE_CHECKING:
    from clusterbook.head.mirror import Mirror
    from clusterbook.launch.job import Job

__all__ = ["HeadServices", "record_of", "write_record_of"]

_JOB_ARGS = tuple(JobArgs.__annotations__)
_log = logging.getLogger("clusterbook.cluster.facade")


class HeadServices:
    """The record of one cluster's head over its life (copied to its ``mirror``, if any) and,
    while the cluster runs (:meth:`start` to :meth:`close`), its keeper and control server."""

    def __init__(self, head: HeadState) -> None:
        self._head = head
        self.mirror: Mirror | None = None  # copies at work_dir=URL
        self.control: ControlServer | None = None
        self.keeper: Keeper | None = None
        # The entries of jobs that have ended, which do not change: the record is written at
        # every job's start and end, and remaking each entry made that O(jobs) status reads.
        self.ended: dict[str, JobEntry] = {}
        self._ended_json: dict[str, tuple[JobEntry, str]] = {}  # and their JSON, made once

    def job_json(self, entry: JobEntry) -> str:
        """``entry`` as the record writes it: an ended job's made once."""
        if self.ended.get(entry.id) is not entry:
            return job_json(entry)
        made = self._ended_json.get(entry.id)
        if made is None or made[0] is not entry:
            made = self._ended_json[entry.id] = entry, job_json(entry)
        return made[1]

    @property
    def problem(self) -> str | None:
        """What is wrong with the services: the control server stopped."""
        control = self.control
        return control.failure if control is not None else None

    def time_left(self) -> tuple[float, str] | None:
        """Seconds until the keeper stops the cluster, and why, if it will."""
        keeper = self.keeper
        return keeper.time_left() if keeper is not None else None

    def start(self, started: float) -> None:
        """Take requests and keep house: the cluster runs since ``started``."""
        head, terms = self._head, self._head.terms
        # A control server that stops shows in the record now, not at the next change.
        self.control = ControlServer(
            head.run_dir, _handlers(head), on_failure=lambda _: head.changed(record=True)
        )
        self.keeper = Keeper(
            head.run_dir,
            terms.lifetime,
            write=lambda: write_record_of(head, self),
            stop=head.stop_for,
            jobs=lambda: _counts(head.jobs),
            started=started,
            one_job=terms.one_job,
        ).start()

    def changed(self, *, record: bool = False) -> None:
        """Have the keeper write the record: now (``record``), or at its next tick."""
        keeper = self.keeper
        if keeper is not None:
            keeper.write() if record else keeper.changed()

    def write(self, state: str | None = None, reason: str | None = None) -> None:
        """Write the record now (``state`` and ``reason``: what it says instead of the head's
        own); one that cannot be written is logged: the cluster goes on."""
        try:
            write_record_of(self._head, self, state, reason)
        except OSError as exc:
            _log.warning("Could not write the record of cluster %s: %s", self._head.name, exc)

    def close(self) -> None:
        """Stop taking requests and housekeeping, write the last record (stopped), let the
        mirror copy what it holds, and take the stop file away."""
        control, keeper, self.control, self.keeper = self.control, self.keeper, None, None
        if control is not None:
            control.close()
        if keeper is not None:
            keeper.close()
        self.write(state="stopped")
        if self.mirror is not None:
            self.mirror.close()
        (self._head.run_dir / STOP_FILE).unlink(missing_ok=True)


def record_of(
    head: HeadState,
    services: HeadServices | None,
    state: str | None = None,
    reason: str | None = None,
) -> ClusterRecord:
    """The cluster of ``head`` as its record tells other processes (``services``: those that
    run now, if any: its keeper's idle clock, its control server's address)."""
    snap = head.snapshot(jobs=False)  # its entries are made below, an ended job's once
    times, terms = head.times, head.terms
    started, program = own_mark()
    return ClusterRecord(
        id=head.id,
        name=head.name,
        kind=head.kind,
        state=state or head.state,
        directory=str(head.run_dir),
        created=times.created,
        started=times.started,
        stopped=times.stopped,
        stop_reason=reason or times.stop_reason,
        life_span=terms.lifetime.life_span,
        idle_timeout=terms.lifetime.idle_timeout,
        retention=terms.retention,
        idle_since=services.keeper.idle_since if services and services.keeper else None,
        detached=terms.detached,
        head_pid=os.getpid(),
        head_host=socket.gethostname(),
        head_started=started,
        head_program=program,
        address=services.control.address if services and services.control else None,
        python=head.python,
        launcher=snap.launcher,
        nodes=snap.nodes,
        jobs=_entries(head.jobs, services.ended if services is not None else {}),
        problem=snap.problem,
        min_nodes=snap.min_nodes,
        max_nodes=snap.max_nodes,
        updated=time.time(),
        extra={"join_command": head.join_command} if head.join_command else {},
    )


def write_record_of(
    head: HeadState,
    services: HeadServices | None,
    state: str | None = None,
    reason: str | None = None,
) -> None:
    """Write the record of ``head``'s cluster, and have its mirror (``work_dir=URL``) copy it
    and the jobs that have ended."""
    record = record_of(head, services, state, reason)
    text = record.to_json(services.job_json if services is not None else None)
    write_record(record, text)
    mirror = services.mirror if services is not None else None
    if mirror is not None:
        mirror.record(text)
        for job in record.jobs:
            if job.state != "running":
                mirror.job(Path(job.directory))


def _counts(jobs: Sequence[Job]) -> tuple[int, int]:
    """How many ``jobs`` run, and how many have ended."""
    running = sum(not j.done() for j in jobs)
    return running, len(jobs) - running


def _entries(jobs: Sequence[Job], ended: dict[str, JobEntry]) -> tuple[JobEntry, ...]:
    """The record's entries of ``jobs``: those that have ended from ``ended``, where the new
    ones are kept."""
    out = []
    for job in jobs:
        entry = ended.get(job.id)
        if entry is None or entry.directory != str(job.directory):  # not that job's
            done = job.outcome is not None  # before its status: what is read then is final
            entry = _entry(job)
            if done:
                ended[job.id] = entry
        out.append(entry)
    return tuple(out)


def _entry(job: Job) -> JobEntry:
    result, status = job.outcome, job_status(job)
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
        label=status.label,
    )


# -- requests of attached handles -----------------------------------------------------------


def _handlers(head: HeadState) -> dict[str, Handler]:
    def mpirun(request: Mapping[str, Any]) -> Mapping[str, Any]:
        job_args = request.get("job") or {}
        if not isinstance(job_args, dict) or set(job_args) - set(_JOB_ARGS):
            raise ConfigError(f"mpirun takes {', '.join(_JOB_ARGS)} besides argv and np.")
        job = head.mpirun(request.get("argv"), request.get("np"), **job_args)  # type: ignore[arg-type]
        return {"id": job.id, "directory": str(job.directory)}

    def cancel(request: Mapping[str, Any]) -> Mapping[str, Any]:
        job = head.job(_job_id(head, request.get("job")))
        threading.Thread(target=job.cancel, name=f"clusterbook-cancel-{job.id}").start()
        return {}

    def stop(request: Mapping[str, Any]) -> Mapping[str, Any]:
        reason = str(request.get("reason") or "stopped by an attached handle")
        threading.Thread(target=head.stop_for, args=(reason,), name="clusterbook-stop").start()
        return {}

    def wait_ready(request: Mapping[str, Any]) -> Mapping[str, Any]:
        head.wait_ready(float(request.get("timeout", 60)), progress=False)
        # Now, not at the keeper's next tick: the asker reads the nodes from the record next.
        head.changed(record=True)
        return {}

    def reinstate(request: Mapping[str, Any]) -> Mapping[str, Any]:
        head.reinstate(str(request.get("node")))
        return {}

    def job_script(request: Mapping[str, Any]) -> Mapping[str, Any]:
        return {"script": head.job_script()}

    def resource_history(request: Mapping[str, Any]) -> Mapping[str, Any]:
        window, nodes, points = request.get("window"), request.get("nodes"), request.get("points")
        return head.resource_history(window, nodes=nodes, points=points)

    def scale(request: Mapping[str, Any]) -> Mapping[str, Any]:
        head.scale(request.get("nodes"))  # type: ignore[arg-type]
        head.changed(record=True)  # the pending rows, before the asker reads the record
        return {}

    def adapt(request: Mapping[str, Any]) -> Mapping[str, Any]:
        minimum, maximum = request.get("minimum"), request.get("maximum")
        interval, grace = request.get("interval", "30s"), request.get("grace", "1m")
        head.adapt(minimum, maximum, interval=interval, grace=grace)  # type: ignore[arg-type]
        return {}

    return {
        "mpirun": mpirun,
        "cancel": cancel,
        "stop": stop,
        "wait_ready": wait_ready,
        "reinstate": reinstate,
        "job_script": job_script,
        **_node_handlers(head),
        "resource_history": resource_history,
        "scale": scale,
        "adapt": adapt,
    }


def _node_handlers(head: HeadState) -> dict[str, Handler]:
    """The requests that put, write, gather and run on the nodes."""

    def put(request: Mapping[str, Any]) -> Mapping[str, Any]:
        head.put(*request.get("paths", ()), progress=False, dest=request.get("dest"))
        return {}

    def write(request: Mapping[str, Any]) -> Mapping[str, Any]:
        data = request.get("data")
        if not isinstance(data, str):
            raise ConfigError("write takes its data as base64 text.")
        try:
            decoded = base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise ConfigError(f"write's data is not base64 ({exc}).") from exc
        nodes, mode = request.get("nodes"), request.get("mode", 0o644)
        head.write(str(request.get("path")), decoded, nodes, mode=mode)
        return {}

    def gather(request: Mapping[str, Any]) -> Mapping[str, Any]:
        paths = head.gather(str(request.get("directory")), progress=False)
        return {"paths": [str(p) for p in paths]}

    def run_on_nodes(request: Mapping[str, Any]) -> Mapping[str, Any]:
        argv, timeout = request.get("argv"), float(request.get("timeout", 60))
        runs = head.node_runs(argv, timeout, request.get("nodes"))  # type: ignore[arg-type]
        return {"rows": [asdict(r) for r in runs]}

    return {"put": put, "write": write, "gather": gather, "run_on_nodes": run_on_nodes}


def _job_id(head: HeadState, job_id: object) -> str:
    """``job_id`` as a request gave it: a job's id (never "the newest": a cancel names one)."""
    if not isinstance(job_id, str):
        known = ", ".join(j.id for j in head.jobs) or "none"
        raise ClusterStateError(f"Cluster {head.id} has no job {job_id!r}; its jobs: {known}.")
    return job_id
