"""clusterbook: run MPI on a handful of machines from a Jupyter notebook.

>>> import clusterbook as cb
>>> with cb.Cluster.local(workers=2, slots=2) as cluster:           # doctest: +SKIP
...     result = cluster.mpirun(["python", "train.py"], np=4).wait()
"""

from __future__ import annotations

from typing import Any

from clusterbook.cluster import Cluster
from clusterbook.errors import (
    BootstrapError,
    CleanupWarning,
    ClusterError,
    ClusterStateError,
    ConfigError,
    HostKeyChangedError,
    HostKeyUnknownError,
    HostNotFoundError,
    JobError,
    JobFailedError,
    JobTimeoutError,
    LauncherNotFoundError,
    ProgramNotFoundError,
    ReadyTimeoutError,
    RemoteCommandError,
    SSHAuthError,
    SSHConnectError,
    SSHError,
    SSHTimeoutError,
)
from clusterbook.launch.flavour import Launcher, MPIFlavour
from clusterbook.launch.job import Job
from clusterbook.launch.logs import LogRecord
from clusterbook.launch.result import JobResult, RankFailure
from clusterbook.spec import NodeSpec
from clusterbook.status import ClusterSnapshot, JobStatus, NodeStatus

__version__ = "0.1.0"

__all__ = [
    "BootstrapError",
    "CleanupWarning",
    "Cluster",
    "ClusterError",
    "ClusterSnapshot",
    "ClusterStateError",
    "ConfigError",
    "HostKeyChangedError",
    "HostKeyUnknownError",
    "HostNotFoundError",
    "Job",
    "JobError",
    "JobFailedError",
    "JobResult",
    "JobStatus",
    "JobTimeoutError",
    "Launcher",
    "LauncherNotFoundError",
    "LogRecord",
    "MPIFlavour",
    "NodeSpec",
    "NodeStatus",
    "ProgramNotFoundError",
    "RankFailure",
    "ReadyTimeoutError",
    "RemoteCommandError",
    "SSHAuthError",
    "SSHConnectError",
    "SSHError",
    "SSHTimeoutError",
    "load_ipython_extension",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext clusterbook``: load the notebook layer (imported only here)."""
    from clusterbook_widgets import load_ipython_extension as load

    load(ipython)
