"""clusterbook: run MPI on a handful of machines from a Jupyter notebook.

>>> import clusterbook as cb
>>> with cb.Cluster.local(workers=2, slots=2) as cluster:           # doctest: +SKIP
...     result = cluster.mpirun(["python", "train.py"], np=4).wait()
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from clusterbook._lazy import lazy_names
from clusterbook.durations import Duration
from clusterbook.errors import (
    BootstrapError,
    CleanupWarning,
    ClusterError,
    ClusterStateError,
    ColdLaunchWarning,
    ConfigError,
    EnvironmentNotFoundError,
    HostKeyChangedError,
    HostKeyUnknownError,
    HostNotFoundError,
    ItemFailedError,
    JobError,
    JobFailedError,
    JobTimeoutError,
    LauncherNotFoundError,
    LeaderLostError,
    NodeLostError,
    OversubscriptionWarning,
    PoolError,
    ProfileError,
    ProgramNotFoundError,
    ReadyTimeoutError,
    RecordError,
    RemoteCommandError,
    RunDirError,
    SerializationError,
    SSHAuthError,
    SSHConnectError,
    SSHError,
    SSHTimeoutError,
    SweepFailedError,
    UnknownClusterError,
    UnknownProfileError,
    UnsafePathError,
    WorkerHostError,
)
from clusterbook.version import __version__ as __version__

if TYPE_CHECKING:
    import pandas as pd

    from clusterbook.cluster.ephemeral import run
    from clusterbook.cluster.facade import Cluster
    from clusterbook.functions.results import SweepResult
    from clusterbook.gpus import GPUInfo
    from clusterbook.launch.flavour import Launcher, MPIFlavour
    from clusterbook.launch.job import Job
    from clusterbook.launch.logs import LogRecord
    from clusterbook.launch.recovery import Backoff
    from clusterbook.launch.result import AttemptInfo, JobResult, KeptProcess, RankFailure
    from clusterbook.preempt import on_preempt
    from clusterbook.providers.environment.detect import Detected, detect_environment
    from clusterbook.providers.environment.worker import serve_worker
    from clusterbook.spec import NodeSpec
    from clusterbook.status import ClusterSnapshot, JobStatus, NodeStatus

# Imported on first use, so that a process that needs one small part (a node's agent, the
# rank hook) does not pay for all of it: ``import clusterbook.rendezvous.agent`` stays light.
_LAZY = {
    "AttemptInfo": "clusterbook.launch.result",
    "Backoff": "clusterbook.launch.recovery",
    "Cluster": "clusterbook.cluster.facade",
    "ClusterSnapshot": "clusterbook.status",
    "Detected": "clusterbook.providers.environment.detect",
    "detect_environment": "clusterbook.providers.environment.detect",
    "GPUInfo": "clusterbook.gpus",
    "Job": "clusterbook.launch.job",
    "JobResult": "clusterbook.launch.result",
    "JobStatus": "clusterbook.status",
    "KeptProcess": "clusterbook.launch.result",
    "Launcher": "clusterbook.launch.flavour",
    "LogRecord": "clusterbook.launch.logs",
    "MPIFlavour": "clusterbook.launch.flavour",
    "NodeSpec": "clusterbook.spec",
    "NodeStatus": "clusterbook.status",
    "on_preempt": "clusterbook.preempt",  # a rank's checkpoint when its nodes are to go
    "RankFailure": "clusterbook.launch.result",
    "run": "clusterbook.cluster.ephemeral",  # cb.run: start a cluster, one job, tear it down
    "serve_worker": "clusterbook.providers.environment.worker",  # a training job's worker host
    "SweepResult": "clusterbook.functions.results",  # what cluster.map returns
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


__all__ = [
    "AttemptInfo",
    "Backoff",
    "BootstrapError",
    "CleanupWarning",
    "Cluster",
    "ClusterError",
    "ClusterSnapshot",
    "ClusterStateError",
    "ColdLaunchWarning",
    "ConfigError",
    "Detected",
    "Duration",
    "EnvironmentNotFoundError",
    "GPUInfo",
    "HostKeyChangedError",
    "HostKeyUnknownError",
    "HostNotFoundError",
    "ItemFailedError",
    "Job",
    "JobError",
    "JobFailedError",
    "JobResult",
    "JobStatus",
    "JobTimeoutError",
    "KeptProcess",
    "Launcher",
    "LauncherNotFoundError",
    "LeaderLostError",
    "LogRecord",
    "MPIFlavour",
    "NodeLostError",
    "NodeSpec",
    "NodeStatus",
    "OversubscriptionWarning",
    "PoolError",
    "ProfileError",
    "ProgramNotFoundError",
    "RankFailure",
    "ReadyTimeoutError",
    "RecordError",
    "RemoteCommandError",
    "RunDirError",
    "SSHAuthError",
    "SSHConnectError",
    "SSHError",
    "SSHTimeoutError",
    "SerializationError",
    "SweepFailedError",
    "SweepResult",
    "UnknownClusterError",
    "UnknownProfileError",
    "UnsafePathError",
    "WorkerHostError",
    "clusters",
    "detect_environment",
    "load_ipython_extension",
    "on_preempt",
    "profiles",
    "prune",
    "run",
    "serve_worker",
]


def clusters() -> pd.DataFrame:
    """The clusters this user has (their directories under the run root): one row each,
    running ones first, newest first; ``state`` says ``stale`` for a cluster whose head
    process is gone, ``damaged`` for an unreadable record (see
    :data:`clusterbook.head.catalog.CLUSTER_DTYPES`)."""
    from clusterbook.head.catalog import clusters_frame

    return clusters_frame()


def profiles(config_dir: str | os.PathLike[str] | None = None) -> dict[str, dict[str, Any]]:
    """The cluster profiles in ``profiles.toml`` of ``config_dir`` (default:
    ``$CLUSTERBOOK_CONFIG``, else ``$XDG_CONFIG_HOME/clusterbook``, else
    ``~/.config/clusterbook``): each profile's name and what it holds (``kind`` and its
    options), in the file's order; none when there is no such file. ``Cluster.from_profile(name)``
    makes the cluster of one."""
    from clusterbook.config import read_profiles

    return {name: dict(p.spec) for name, p in read_profiles(config_dir).by_name.items()}


def prune(older_than: Duration | None = None, *, dry_run: bool = False) -> list[str]:
    """Remove the directories of clusters stopped, and of jobs ended, more than
    ``older_than`` ago (``"7d"``; default: each cluster's own ``retention``); never a live
    cluster's or a running job's. Returns what was removed (``dry_run``: what would be)."""
    from clusterbook.durations import optional_duration
    from clusterbook.head.catalog import prune as prune_dirs

    keep = optional_duration(older_than, "older_than")
    return [str(r.path) for r in prune_dirs(older_than=keep, dry_run=dry_run)]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext clusterbook``: load the installed Jupyter layer (found through the
    ``clusterbook.jupyter`` entry points, see :mod:`clusterbook.cluster.display`)."""
    from clusterbook.cluster.display import load_ipython_extension as load

    load(ipython)
