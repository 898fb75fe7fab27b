"""The protocols of a cluster and a job, which the layers above the cluster take.

The engines, the widgets, the magics and the CLI use a cluster and its jobs through these, never
through a concrete class: a :class:`ClusterHandle` is a cluster this process runs
(``clusterbook.Cluster``) or one another process runs (``Cluster.attach``'s handle), a
:class:`JobHandle` a job running here (``clusterbook.Job``) or one read from its directory
(``Job.load``'s). :class:`Head` is what a ``Cluster`` delegates to: the head that runs it in this
process, or the handle on the supervisor that runs a detached one. ``clusterbook.cluster.facade``
checks that each class satisfies its protocol (mypy, strict).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from clusterbook.durations import Duration
from clusterbook.errors import ClusterStateError

if TYPE_CHECKING:
    import pandas as pd
    from typing_extensions import Unpack

    from clusterbook.launch.job import Job
    from clusterbook.launch.logs import LogRecord
    from clusterbook.launch.prepare import JobArgs
    from clusterbook.launch.result import JobResult
    from clusterbook.launch.saved import SavedJob
    from clusterbook.spec import NodeSpec
    from clusterbook.status import ClusterSnapshot

__all__ = ["ClusterHandle", "Head", "JobHandle", "job_by_id"]


class JobHandle(Protocol):
    """A job: its logs (per rank, followed live), its end and its result; a future
    (``concurrent.futures.Future``'s protocol, ``await job``)."""

    @property
    def id(self) -> str: ...
    @property
    def np(self) -> int: ...
    @property
    def argv(self) -> list[str]: ...
    @property
    def directory(self) -> Path: ...
    @property
    def started(self) -> float: ...
    @property
    def launcher(self) -> str:
        """The path of the MPI launcher that runs it."""
        ...

    @property
    def outcome(self) -> JobResult | None:
        """Its :class:`JobResult` once it has ended, else None."""
        ...

    @property
    def ranks_ended(self) -> int: ...

    def wait(self, timeout: Duration | None = None) -> JobResult: ...
    def done(self) -> bool: ...
    def running(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def cancel(self) -> bool: ...
    def result(self, timeout: Duration | None = None) -> Any: ...
    def exception(self, timeout: Duration | None = None) -> BaseException | None: ...
    def add_done_callback(self, fn: Callable[[Any], object]) -> None: ...
    def bind_value(self, reader: Callable[[JobResult], Any]) -> None: ...
    def __await__(self) -> Generator[Any, None, Any]: ...
    def logs(self, rank: int | None = None) -> pd.DataFrame: ...
    def stream(self, *, from_start: bool = True) -> Iterator[LogRecord]: ...


class ClusterHandle(Protocol):
    """A cluster: what it is and holds now, its jobs, and what can be asked of it."""

    @property
    def name(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def nodes(self) -> tuple[NodeSpec, ...]: ...
    @property
    def join_command(self) -> str | None: ...
    @property
    def time_left(self) -> float | None: ...
    @property
    def jobs(self) -> Sequence[JobHandle]: ...

    def snapshot(self) -> ClusterSnapshot: ...
    def subscribe(self, callback: Callable[[ClusterSnapshot], None]) -> Callable[[], None]: ...
    def status(self) -> pd.DataFrame: ...
    def resource_history(
        self,
        window: Duration | None = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]:
        """Each node's CPU, memory and GPU use, JSON-ready (:mod:`clusterbook.resources`)."""
        ...

    def resources(self, window: Duration | None = None) -> pd.DataFrame: ...
    def job(self, job_id: str | None = None) -> JobHandle: ...

    def mpirun(
        self, argv: Sequence[str], np: int | None = None, **job: Unpack[JobArgs]
    ) -> JobHandle: ...

    def put(
        self,
        *paths: str | os.PathLike[str],
        progress: bool | None = None,
        dest: str | os.PathLike[str] | None = None,
    ) -> None: ...

    def write(
        self,
        path: str | os.PathLike[str],
        data: bytes | str,
        nodes: str | Collection[str] | None = None,
        *,
        mode: int = 0o644,
    ) -> None: ...

    def gather(
        self, directory: str | os.PathLike[str], *, progress: bool | None = None
    ) -> list[Path]: ...

    def scale(self, nodes: int) -> None: ...
    def adapt(
        self, minimum: int, maximum: int, *, interval: Duration = "30s", grace: Duration = "1m"
    ) -> None: ...

    def run_on_nodes(
        self,
        argv: Sequence[str],
        timeout: Duration = 60.0,
        nodes: str | Collection[str] | None = None,
    ) -> pd.DataFrame: ...
    def wait_ready(self, timeout: Duration = 60, *, progress: bool | None = None) -> None: ...
    def reinstate(self, node: str) -> None: ...
    def stop(self) -> None: ...


class Head(ClusterHandle, Protocol):
    """What a ``Cluster`` delegates to: the head that runs it in this process, until a
    detached cluster's ``start()`` swaps it for the handle on its supervisor."""

    @property
    def jobs(self) -> Sequence[Job | SavedJob]: ...

    def job(self, job_id: str | None = None) -> Job | SavedJob: ...

    def mpirun(
        self, argv: Sequence[str], np: int | None = None, **job: Unpack[JobArgs]
    ) -> Job | SavedJob: ...

    def start(self, *, progress: bool | None = None) -> Head:
        """Start the cluster; the head that runs it from now on (itself, or the handle on a
        detached cluster's supervisor)."""
        ...

    def stop(self, *, reason: str | None = None) -> None:
        """Stop the cluster (``reason``: what its record says, if not the head's own)."""
        ...

    def engines(self, n: int | None = None, **how: Any) -> Any:
        """ipyparallel engines on the cluster (``Cluster.engines``), or why there are none."""
        ...

    def job_script(self) -> str:
        """The batch script a Slurm cluster submits (``Cluster.job_script``)."""
        ...


J = TypeVar("J", bound=JobHandle)


def job_by_id(jobs: Sequence[J], cluster_id: str, job_id: str | None = None) -> J:
    """Job ``job_id`` (``job-0001``) of cluster ``cluster_id``'s ``jobs``, or the newest one;
    a :class:`ClusterStateError` naming the jobs there are when it is none of them."""
    if not jobs:
        raise ClusterStateError(f"Cluster {cluster_id} has run no job yet.")
    if job_id is None:
        return jobs[-1]
    for job in jobs:
        if job.id == job_id:
            return job
    known = ", ".join(j.id for j in jobs)
    raise ClusterStateError(f"Cluster {cluster_id} has no job {job_id!r}; its jobs: {known}.")
