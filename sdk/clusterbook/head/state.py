"""What a head's services need of the cluster they serve: a :class:`HeadState`.

The services (:mod:`clusterbook.head.services`: the record, the keeper, the control server)
work for a head state, never for a ``Cluster``: what runs a cluster in this process (the
cluster layer's ``LocalHead``) is one. It says what the cluster is (:class:`HeadTimes`,
:class:`HeadTerms`, its jobs, its snapshot), is told when to write its record and when to
stop, and does what attached handles ask of it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from clusterbook.lifetime import Lifetime

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from clusterbook.durations import Duration
    from clusterbook.launch.job import Job
    from clusterbook.launch.prepare import JobArgs
    from clusterbook.nodes.commands import NodeRun
    from clusterbook.status import ClusterSnapshot

__all__ = ["HeadState", "HeadTerms", "HeadTimes", "Resizes"]


@dataclass
class HeadTimes:
    """When the cluster was made, started and stopped (epoch seconds), and why it stopped."""

    created: float = field(default_factory=time.time)
    started: float | None = None
    stopped: float | None = None
    stop_reason: str | None = None


@dataclass(frozen=True, slots=True)
class HeadTerms:
    """What the cluster was told of its life: its ``lifetime`` (life span, idle timeout), how
    long its files are kept (``retention``), whether it stops after one job (``one_job``) and
    whether a supervisor runs it (``detached``)."""

    lifetime: Lifetime = field(default_factory=Lifetime)
    retention: float | None = None
    one_job: bool = False
    detached: bool = False


class HeadState(Protocol):
    """A cluster as its head's services see it (see the module's docstring)."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def python(self) -> str: ...
    def job_script(self) -> str: ...
    @property
    def join_command(self) -> str | None: ...
    @property
    def times(self) -> HeadTimes: ...
    @property
    def terms(self) -> HeadTerms: ...
    @property
    def jobs(self) -> Sequence[Job]: ...

    def snapshot(self, *, jobs: bool = True) -> ClusterSnapshot:
        """The cluster now (its record is made of it); ``jobs=False`` leaves its jobs'
        statuses out (the record makes its own entries, and is written at every job's start
        and end: one status a job, a record, would grow with the session's jobs)."""
        ...

    def changed(self, *, record: bool = False) -> None:
        """Tell subscribers and the record (``record``: write it now)."""
        ...

    def stop_for(self, reason: str) -> None:
        """Stop the cluster, for ``reason`` (its life span passed, a handle asked)."""
        ...

    # -- what attached handles ask (:mod:`clusterbook.head.control`) ------------------------

    def mpirun(self, argv: Sequence[str], np: int | None = None, **job: Unpack[JobArgs]) -> Job: ...

    def job(self, job_id: str | None = None) -> Job: ...

    def wait_ready(self, timeout: float = 60, *, progress: bool | None = None) -> None: ...

    def reinstate(self, node: str) -> None: ...

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

    def resource_history(
        self,
        window: float | None = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]: ...

    def node_runs(
        self,
        argv: Sequence[str],
        timeout: float = 60.0,
        nodes: str | Collection[str] | None = None,
    ) -> list[NodeRun]: ...

    def scale(self, nodes: int) -> None:
        """``Cluster.scale`` (a kind whose nodes cannot change refuses it: ConfigError)."""
        ...

    def adapt(
        self, minimum: int, maximum: int, *, interval: Duration = "30s", grace: Duration = "1m"
    ) -> None:
        """``Cluster.adapt``."""
        ...


class Resizes(Protocol):
    """``Cluster.scale`` and ``Cluster.adapt`` (:class:`clusterbook.cluster.resize.Resizer`;
    an attached handle asks its head)."""

    def scale(self, nodes: int) -> None: ...

    def adapt(
        self, minimum: int, maximum: int, *, interval: Duration = "30s", grace: Duration = "1m"
    ) -> None: ...
