"""Immutable snapshots of a cluster, and their table form.

Widgets and the CLI render these; they never reach into a live cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from clusterbook.launch.job import Job

__all__ = ["ClusterSnapshot", "JobStatus", "NodeStatus", "job_status", "nodes_frame"]


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node as it is now. ``state`` is pending, ready, joined, running, lost or left;
    nodes with an agent also have their rendezvous round, heartbeat age (s), load (1-minute
    load average), memory in use (percent), total memory (bytes) and the agent's pid."""

    name: str
    host: str
    slots: int
    state: str
    ranks: tuple[int, ...] = ()
    job: str | None = None
    round: int | None = None
    heartbeat_age: float | None = None
    load: float | None = None
    pid: int | None = None
    memory_used: float | None = None
    memory: int | None = None


@dataclass(frozen=True, slots=True)
class JobStatus:
    """One job as it is now. ``state`` is running, succeeded, failed, timed out or cancelled."""

    id: str
    np: int
    argv: tuple[str, ...]
    state: str
    returncode: int | None
    duration: float | None
    failed_ranks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """A cluster as it is now: its nodes and its jobs; ``problem`` says what is wrong with
    the cluster itself, if anything (its status is stale, say)."""

    name: str
    kind: str
    state: str
    nodes: tuple[NodeStatus, ...]
    jobs: tuple[JobStatus, ...]
    launcher: str | None
    run_dir: str
    uptime: float | None
    problem: str | None = None

    @property
    def total_slots(self) -> int:
        return sum(n.slots for n in self.nodes)


NODE_COLUMNS = (
    "node",
    "host",
    "slots",
    "state",
    "ranks",
    "job",
    "round",
    "heartbeat_age",
    "load",
    "memory_used",
    "memory",
    "pid",
)


def nodes_frame(snapshot: ClusterSnapshot) -> pd.DataFrame:
    """One row per node: node, host, slots, state, ranks (of the running job), job, and for
    nodes with an agent round, heartbeat age (s), load, memory used (%), memory (bytes) and
    pid (None elsewhere)."""
    import pandas as pd

    rows = [
        (
            n.name,
            n.host,
            n.slots,
            n.state,
            list(n.ranks),
            n.job or "",
            n.round,
            n.heartbeat_age,
            n.load,
            n.memory_used,
            n.memory,
            n.pid,
        )
        for n in snapshot.nodes
    ]
    return pd.DataFrame(rows, columns=list(NODE_COLUMNS))


def job_status(job: Job) -> JobStatus:
    """A job's snapshot."""
    r = job.result
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
    )
