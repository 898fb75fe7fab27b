"""A running job as snapshots show it: its :class:`~clusterbook.status.JobStatus`, and the ranks it
runs on each node. Pure: a job in, values out; the snapshots themselves know no job."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from clusterbook.launch.command import LaunchPlan, placement
from clusterbook.launch.result import JobResult
from clusterbook.status import JobStatus, NodeStatus

__all__ = ["RunningJob", "job_status", "with_running_jobs"]


class RunningJob(Protocol):
    """What a status is made of: a :class:`clusterbook.launch.job.Job` has it all (a
    protocol, as the job's own HTML shows its status: no import circle)."""

    @property
    def id(self) -> str: ...
    @property
    def np(self) -> int: ...
    @property
    def argv(self) -> list[str]: ...
    def done(self) -> bool: ...
    @property
    def outcome(self) -> JobResult | None: ...
    @property
    def plan(self) -> LaunchPlan: ...
    @property
    def attempt(self) -> int: ...
    @property
    def last_reason(self) -> str | None: ...
    @property
    def restarts(self) -> int: ...
    @property
    def label(self) -> str | None: ...


def job_status(job: RunningJob) -> JobStatus:
    """A job's snapshot."""
    r = job.outcome
    if r is None:
        state = "running"
    elif r.ok:
        state = "succeeded"
    elif r.timed_out:
        state = "timed out"
    elif r.cancelled:
        state = "cancelled"
    else:
        state = "failed"
    return JobStatus(
        id=job.id,
        np=job.np,
        argv=tuple(job.argv),
        state=state,
        returncode=None if r is None else r.returncode,
        duration=None if r is None else r.duration,
        failed_ranks=() if r is None else tuple(r.failed_ranks),
        attempt=job.attempt,
        last_reason=job.last_reason,
        restarts=job.restarts,
        label=job.label,
    )


def with_running_jobs(
    statuses: Sequence[NodeStatus], jobs: Sequence[RunningJob]
) -> tuple[NodeStatus, ...]:
    """``statuses`` with the ranks of the running ``jobs`` on each node (``running``; a node
    lost or gone stays so, whatever ran there)."""
    busy: dict[str, tuple[RunningJob, list[int]]] = {}
    for job in jobs:
        if job.done():
            continue
        where = job.plan.nodes  # the nodes the job's current attempt was launched on
        for rank, i in enumerate(placement(where, job.np)):
            busy.setdefault(where[i].name, (job, []))[1].append(rank)
    out = []
    for s in statuses:
        if s.name not in busy or s.state in ("lost", "left"):
            out.append(s)
            continue
        job, ranks = busy[s.name]
        out.append(
            replace(
                s,
                state="running",
                ranks=tuple(ranks),
                job=job.id,
                attempt=job.attempt,
                restarts=job.restarts,
                last_reason=job.last_reason,
            )
        )
    return tuple(out)
