"""Errors raised by clusterbook.

Every error is a :class:`ClusterError`; its message names the value at fault, the rule it broke
and what to do about it. Errors of third-party libraries are translated at the boundary with
``raise ... from exc``.

::

    ClusterError
    ├── ConfigError (also ValueError)       bad input to a public entry point
    │   ├── LauncherNotFoundError           no mpirun / mpiexec to use
    │   └── ProgramNotFoundError            the program (or script) of a job does not exist
    ├── ClusterStateError                   the call does not fit the cluster's state
    ├── ReadyTimeoutError (also TimeoutError)   wait_ready() gave up
    └── JobError
        ├── JobTimeoutError (also TimeoutError) job.wait(timeout) returned before the job ended
        └── JobFailedError                  JobResult.check() on a failed job
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clusterbook.launch.result import JobResult

__all__ = [
    "ClusterError",
    "ClusterStateError",
    "ConfigError",
    "JobError",
    "JobFailedError",
    "JobTimeoutError",
    "LauncherNotFoundError",
    "ProgramNotFoundError",
    "ReadyTimeoutError",
]


class ClusterError(Exception):
    """Base class of every error clusterbook raises."""


class ConfigError(ClusterError, ValueError):
    """A value given to clusterbook breaks a rule; the message says which and how to fix it."""


class LauncherNotFoundError(ConfigError):
    """No MPI launcher was found; the message says which extra to install."""


class ProgramNotFoundError(ConfigError):
    """The program or script a job should run does not exist."""


class ClusterStateError(ClusterError):
    """The call does not fit the cluster's current state (not started, already stopped)."""


class ReadyTimeoutError(ClusterError, TimeoutError):
    """``wait_ready`` ran out of time; ``reason`` says what was missing."""

    def __init__(self, message: str, *, timeout: float, reason: str) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.reason = reason


class JobError(ClusterError):
    """Base class of errors about a job."""


class JobTimeoutError(JobError, TimeoutError):
    """``job.wait(timeout)`` returned before the job ended; the job keeps running."""

    def __init__(self, message: str, *, timeout: float) -> None:
        super().__init__(message)
        self.timeout = timeout


class JobFailedError(JobError):
    """Raised by ``JobResult.check()`` for a job that did not succeed."""

    def __init__(self, message: str, *, result: JobResult) -> None:
        super().__init__(message)
        self.result = result
