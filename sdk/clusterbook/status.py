"""Immutable snapshots of a cluster, and their table form.

Widgets and the CLI render these; they never reach into a live cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "NODE_DTYPES",
    "NODE_STATES",
    "ClusterSnapshot",
    "JobStatus",
    "NodeStatus",
    "nodes_frame",
    "snapshot_of",
]


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node as it is now. ``state`` is pending, ready, joined, running, set-aside (its
    ranks kept failing: why in ``last_reason``, until when in ``until``), lost or left;
    nodes with an agent also have their rendezvous round, heartbeat age (s), load (1-minute
    load average), memory in use (percent), total memory (bytes) and the agent's pid;
    ``gpus`` is how many GPUs the node has (0: none, or not known yet) and ``gpu_model``
    their model (:attr:`clusterbook.gpus.GPUInfo.model`); the job running there, its
    ``attempt``, ``restarts`` and ``last_reason`` (see :class:`JobStatus`)."""

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
    gpus: int = 0
    gpu_model: str | None = None
    attempt: int | None = None  # of the running job: its attempt,
    restarts: int | None = None  # how many times it was restarted,
    last_reason: str | None = None  # and why the attempt before ended (set aside: why)
    until: float | None = None  # set aside: when its cool-down ends (epoch seconds)


@dataclass(frozen=True, slots=True)
class JobStatus:
    """One job as it is now. ``state`` is running, succeeded, failed, timed out or cancelled;
    ``attempt`` the attempt running (or the last one), ``last_reason`` how the attempt before
    it ended ("rank 1 exited 1", "node node2 lost"; None when it is the first), ``restarts``
    how many attempts were relaunches after a node was lost; ``label`` the name a well-known
    job is shown under ("ipyparallel engines"), if it has one."""

    id: str
    np: int
    argv: tuple[str, ...]
    state: str
    returncode: int | None
    duration: float | None
    failed_ranks: tuple[int, ...] = ()
    attempt: int = 1
    last_reason: str | None = None
    restarts: int = 0
    label: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """A cluster as it is now: its nodes and its jobs; ``problem`` says what is wrong with
    the cluster itself, if anything (its status is stale, say); ``min_nodes`` and
    ``max_nodes`` bound an elastic cluster's size (None for a fixed set of nodes);
    ``time_left`` is when it stops by itself (seconds from now, and the bound: ``life_span``
    or ``idle_timeout``), if it will."""

    name: str
    kind: str
    state: str
    nodes: tuple[NodeStatus, ...]
    jobs: tuple[JobStatus, ...]
    launcher: str | None
    run_dir: str
    uptime: float | None
    problem: str | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    time_left: tuple[float, str] | None = None  # seconds until it stops by itself, and why

    @property
    def total_slots(self) -> int:
        return sum(n.slots for n in self.nodes)


NODE_COLUMNS = (
    "node",
    "host",
    "slots",
    "gpus",
    "gpu_model",
    "state",
    "ranks",
    "job",
    "attempt",
    "restarts",
    "last_reason",
    "until",
    "round",
    "heartbeat_age",
    "load",
    "memory_used_gib",
    "memory_gib",
    "pid",
    "time_left",
)


#: A node's states, in the order a node goes through them (the ``state`` column's categories).
NODE_STATES = ("pending", "ready", "joined", "running", "set-aside", "lost", "left")

#: The dtype of every column of :func:`nodes_frame`: the same whatever the rows (none too).
NODE_DTYPES = {
    "node": "string",
    "host": "string",
    "slots": "int64",
    "gpus": "int64",
    "gpu_model": "string",  # <NA> without GPUs
    "state": "category",
    "ranks": "object",  # a list of ints
    "job": "string",
    "attempt": "Int64",  # of the job running there (<NA>: none)
    "restarts": "Int64",
    "last_reason": "string",  # why its attempt before ended (<NA>: the first), or set aside
    "until": "datetime64[ns, UTC]",  # a node set aside: when its cool-down ends (NaT: not)
    "round": "Int64",
    "heartbeat_age": "timedelta64[ns]",  # NaT: no heartbeat (yet, or any more)
    "load": "Float64",
    "memory_used_gib": "Float64",  # GiB in use on the node (2**30 bytes)
    "memory_gib": "Float64",  # the node's memory, GiB
    "pid": "Int64",
    "time_left": "timedelta64[ns]",  # until the cluster stops by itself (NaT: it will not)
}

#: Bytes in a GiB: the unit of the memory columns (as the widget and the HTML show memory).
GIB = 2**30


def nodes_frame(snapshot: ClusterSnapshot) -> pd.DataFrame:
    """One row per node: node, host, slots, gpus (0 without) and gpu_model (``<NA>``
    without), state (categorical, :data:`NODE_STATES`), ranks (of the running job), job, and
    the running job's attempt, restarts and last_reason (why its attempt before ended, or why
    the node is set aside, ``until`` when), and
    for nodes with an agent round, heartbeat age (a timedelta), load, memory in use and in all
    (GiB) and pid (``<NA>``, ``NaT`` elsewhere), and the time left before the cluster stops by
    itself (``life_span``, ``idle_timeout``; NaT if it will not); dtypes :data:`NODE_DTYPES`."""
    import pandas as pd

    left = None if snapshot.time_left is None else round(snapshot.time_left[0])
    rows = [
        (
            n.name,
            n.host,
            n.slots,
            n.gpus,
            n.gpu_model,
            n.state,
            list(n.ranks),
            n.job or "",
            n.attempt,
            n.restarts,
            n.last_reason,
            n.until,
            n.round,
            n.heartbeat_age,
            n.load,
            None if n.memory is None or n.memory_used is None else n.memory_used / 100 * n.memory,
            n.memory,
            n.pid,
            left,
        )
        for n in snapshot.nodes
    ]
    frame: pd.DataFrame = pd.DataFrame(rows, columns=list(NODE_COLUMNS))
    for column in ("heartbeat_age", "time_left"):  # seconds, None: NaT
        # To the microsecond, as float seconds carry it (not the float's noise in nanoseconds).
        frame[column] = pd.to_timedelta(frame[column].astype("float64"), unit="s").dt.round("us")
    for column in ("memory_used_gib", "memory_gib"):  # bytes
        frame[column] = frame[column].astype("Float64") / GIB
    frame["until"] = pd.to_datetime(frame["until"].astype("float64"), unit="s", utc=True)
    frame = frame.astype({k: v for k, v in NODE_DTYPES.items() if v != "category"})
    frame["state"] = pd.Categorical(frame["state"], categories=NODE_STATES)
    return frame


def snapshot_of(
    *,
    name: str,
    kind: str,
    state: str,
    nodes: Sequence[NodeStatus],
    jobs: Sequence[JobStatus],
    launcher: str | None,
    run_dir: str,
    uptime: float | None,
    problem: str | None,
    bounds: tuple[int, int] | None,
    time_left: tuple[float, str] | None = None,
) -> ClusterSnapshot:
    """A cluster's snapshot from its parts: its nodes (with the ranks of its running jobs:
    :func:`clusterbook.launch.jobstatus.with_running_jobs`) and its jobs' statuses."""
    return ClusterSnapshot(
        name=name,
        kind=kind,
        state=state,
        nodes=tuple(nodes),
        jobs=tuple(jobs),
        launcher=launcher,
        run_dir=run_dir,
        uptime=uptime,
        problem=problem,
        min_nodes=bounds[0] if bounds else None,
        max_nodes=bounds[1] if bounds else None,
        time_left=time_left,
    )
