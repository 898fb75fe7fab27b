"""Errors raised by clusterbook.

Every error is a :class:`ClusterError`; its message names the value at fault, the rule it broke
and what to do about it. Errors of third-party libraries are translated at the boundary with
``raise ... from exc``.

::

    ClusterError
    ├── ConfigError (also ValueError)       bad input to a public entry point
    │   ├── LauncherNotFoundError           no mpirun / mpiexec to use
    │   ├── ProgramNotFoundError            the program (or script) of a job does not exist
    │   ├── EnvironmentNotFoundError        no scheduler or launcher around this process
    │   ├── WorkerHostError                 this host is a worker of the job, not its leader
    │   ├── ProfileError                    a profile (``profile``, its file ``path``) that
    │   │   │                               does not make a cluster
    │   │   └── UnknownProfileError (also LookupError)  no profile by that name; ``known``
    │   ├── SerializationError              a function, argument or value cannot be pickled
    │   └── UnsafePathError                 a path others could have changed: a shared
    │                                       directory, a link, a path out of its place
    ├── ClusterStateError                   the call does not fit the cluster's state
    ├── NodeLostError                       a node stopped heartbeating (``node``, ``host``)
    ├── LeaderLostError                     a worker host's leader went before it was done
    ├── RunDirError                         a job's files cannot be written (a full disk)
    ├── RecordError                         a cluster.json that is missing or not a record
    ├── UnknownClusterError (also LookupError)  no cluster by that id; lists those there are
    ├── ReadyTimeoutError (also TimeoutError)   wait_ready() gave up
    ├── SSHError                            something about a host's ssh; names the host
    │   ├── SSHConnectError                 refused, unreachable, connection lost
    │   │   └── HostNotFoundError           the host name does not resolve
    │   ├── SSHTimeoutError (also TimeoutError)  no answer, or a command ran over its time
    │   ├── SSHAuthError                    the host refused our key
    │   ├── HostKeyUnknownError             the host's key is in no known_hosts we trust
    │   ├── HostKeyChangedError             the host's key differs from the one on record
    │   ├── RemoteCommandError              a remote command failed (check=True)
    │   └── BootstrapError                  some nodes could not join; ``problems`` by host
    └── JobError
        ├── JobTimeoutError (also TimeoutError) job.wait(timeout) returned before the job ended
        ├── JobFailedError                  JobResult.check() on a failed job
        ├── ItemFailedError                 an item of cluster.map failed (``index``,
        │                                   ``input``, ``remote_traceback``, ``rank``, ``host``)
        ├── SweepFailedError                SweepResult.check(): some items failed (``failed``)
        └── PoolError                       a sweep's pool of ranks could not start or stay up

Warnings: :class:`ColdLaunchWarning` when a warm launch falls back to a cold one on some nodes;
:class:`CleanupWarning` when ``stop()`` could not clean a node (it says what may be
left there); :class:`OversubscriptionWarning` when a job puts more ranks on a host than it has
cores, unasked (``oversubscribe=True`` asks).
"""

from __future__ import annotations

import errno
import os
from typing import Protocol

__all__ = [
    "BootstrapError",
    "CleanupWarning",
    "ClusterError",
    "ClusterStateError",
    "ColdLaunchWarning",
    "ConfigError",
    "EnvironmentNotFoundError",
    "FailedJob",
    "HostKeyChangedError",
    "HostKeyUnknownError",
    "HostNotFoundError",
    "ItemFailedError",
    "JobError",
    "JobFailedError",
    "JobTimeoutError",
    "LauncherNotFoundError",
    "LeaderLostError",
    "NodeLostError",
    "OversubscriptionWarning",
    "PoolError",
    "ProfileError",
    "ProgramNotFoundError",
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
    "UnknownClusterError",
    "UnknownProfileError",
    "UnsafePathError",
    "WorkerHostError",
]


class ClusterError(Exception):
    """Base class of every error clusterbook raises."""


class ConfigError(ClusterError, ValueError):
    """A value given to clusterbook breaks a rule; the message says which and how to fix it."""


class LauncherNotFoundError(ConfigError):
    """No MPI launcher was found; the message says which extra to install."""


class ProgramNotFoundError(ConfigError):
    """The program or script a job should run does not exist."""


class EnvironmentNotFoundError(ConfigError):
    """``Cluster.from_environment``: no scheduler or launcher environment is around this
    process; the message says what was looked for."""


class WorkerHostError(ConfigError):
    """``Cluster.from_environment`` on one of the job's workers: the cluster is built on its
    leader (SageMaker's first host, an MPIJob's launcher pod)."""


class ProfileError(ConfigError):
    """A cluster profile that does not make a cluster: a profiles file that is not TOML or not
    laid out as profiles, or a profile with a key or value its kind does not take. ``profile``
    names it (None: the file as a whole), ``path`` its file."""

    def __init__(
        self, message: str, *, path: os.PathLike[str] | str, profile: str | None = None
    ) -> None:
        super().__init__(message)
        self.path = os.fspath(path)
        self.profile = profile


class UnknownProfileError(ProfileError, LookupError):
    """No profile has the name asked for; ``known`` lists the names there are."""

    def __init__(
        self, message: str, *, path: os.PathLike[str] | str, profile: str, known: tuple[str, ...]
    ) -> None:
        super().__init__(message, path=path, profile=profile)
        self.known = known


class SerializationError(ConfigError):
    """``Cluster.submit``: the function or an argument cannot be pickled to send it to the
    ranks, or a rank's return value cannot be pickled to send it back; the message names it."""


class UnsafePathError(ConfigError):
    """A path another user could have changed, which clusterbook refuses to use: a cluster's
    directory (or its record, or a directory above it) that is not this user's or that others
    can write; a link or a special file where clusterbook's own file should be; a path outside
    the directory it must be in. ``path`` names it; ``owner`` and ``mode`` are what it has,
    where that is what is wrong (else None)."""

    def __init__(
        self,
        message: str,
        *,
        path: os.PathLike[str] | str,
        owner: int | None = None,
        mode: int | None = None,
    ) -> None:
        super().__init__(message)
        self.path = os.fspath(path)
        self.owner = owner
        self.mode = mode


class ClusterStateError(ClusterError):
    """The call does not fit the cluster's current state (not started, already stopped)."""


class NodeLostError(ClusterError):
    """A node stopped heartbeating, or its agent's connection broke, while it was needed."""

    def __init__(self, message: str, *, node: str, host: str) -> None:
        super().__init__(message)
        self.node = node
        self.host = host


class LeaderLostError(ClusterError):
    """``clusterbook worker serve`` (``cb.serve_worker``): the job's leader went, or never
    came, before it said it was done with this host; ``leader`` names it."""

    def __init__(self, message: str, *, leader: str | None) -> None:
        super().__init__(message)
        self.leader = leader


class RunDirError(ClusterError):
    """A file under the cluster's run directory could not be written; ``path`` names it."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path

    @classmethod
    def from_os_error(cls, path: os.PathLike[str] | str, exc: OSError) -> RunDirError:
        """The error for ``exc``, raised writing ``path``: what happened and what to do."""
        reason = exc.strerror or str(exc)
        fix = (
            "free space there" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "make it writable"
        )
        return cls(
            f"Cannot write {os.fspath(path)}: {reason.lower()}. {fix.capitalize()}, or give "
            "the cluster another run_dir=.",
            path=os.fspath(path),
        )


class RecordError(ClusterError):
    """A cluster's record (``cluster.json``) is missing, unreadable or not a record; ``path``
    names it."""

    def __init__(self, message: str, *, path: os.PathLike[str] | str) -> None:
        super().__init__(message)
        self.path = os.fspath(path)


class UnknownClusterError(ClusterError, LookupError):
    """No cluster has the id (or name) asked for; ``known`` lists the ids there are."""

    def __init__(self, message: str, *, known: tuple[str, ...]) -> None:
        super().__init__(message)
        self.known = known


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


class FailedJob(Protocol):
    """What a :class:`JobFailedError` carries: the :class:`~clusterbook.JobResult` of the job
    (described here by what it offers, so that this module imports nothing of the launcher)."""

    @property
    def job_id(self) -> str: ...
    @property
    def returncode(self) -> int: ...
    @property
    def duration(self) -> float: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def cancelled(self) -> bool: ...
    @property
    def ok(self) -> bool: ...
    @property
    def failed_ranks(self) -> list[int]: ...
    @property
    def state(self) -> str: ...
    def summary(self) -> str: ...


class JobFailedError(JobError):
    """Raised by ``JobResult.check()`` for a job that did not succeed; ``result`` is that
    :class:`~clusterbook.JobResult`."""

    def __init__(self, message: str, *, result: FailedJob) -> None:
        super().__init__(message)
        self.result = result


class ItemFailedError(JobError):
    """An item of ``cluster.map`` gave no value: its function raised (``remote_traceback`` is
    the traceback on the rank, ``exception`` the exception itself when it could be pickled), its
    rank died under it, or it or its value cannot be pickled. ``index`` is its place in the
    input, ``input`` the item, ``attempts`` how many times it ran, ``rank`` and ``host`` where
    it last ran (None when unknown)."""

    def __init__(
        self,
        message: str,
        *,
        index: int,
        input: object,
        remote_traceback: str = "",
        exception: BaseException | None = None,
        attempts: int = 1,
        rank: int | None = None,
        host: str | None = None,
    ) -> None:
        super().__init__(message)
        self.index = index
        self.input = input
        self.remote_traceback = remote_traceback
        self.exception = exception
        self.attempts = attempts
        self.rank = rank
        self.host = host


class SweepFailedError(JobError):
    """Raised by ``SweepResult.check()`` when some items failed; ``failed`` maps each failed
    item's index to its :class:`ItemFailedError` (the values of the others stay in the
    result)."""

    def __init__(self, message: str, *, failed: dict[int, ItemFailedError]) -> None:
        super().__init__(message)
        self.failed = failed


class PoolError(JobError):
    """A sweep's pool of ranks could not start (its job ended, or its ranks did not connect
    back in time) or kept dying before it ran anything."""


class SSHError(ClusterError):
    """Something went wrong talking to ``host`` over ssh."""

    def __init__(self, message: str, *, host: str) -> None:
        super().__init__(message)
        self.host = host


class SSHConnectError(SSHError):
    """The host could not be reached: its name does not resolve, or it refused or dropped us."""


class HostNotFoundError(SSHConnectError):
    """The host name does not resolve (waiting will not help)."""


class SSHTimeoutError(SSHError, TimeoutError):
    """The host did not answer in time, or a remote command ran over its time."""


class SSHAuthError(SSHError):
    """The host refused our key."""


class HostKeyUnknownError(SSHError):
    """The host's key is in no known_hosts we trust; ``fingerprint`` is the key it showed."""

    def __init__(self, message: str, *, host: str, fingerprint: str) -> None:
        super().__init__(message, host=host)
        self.fingerprint = fingerprint


class HostKeyChangedError(SSHError):
    """The host showed a key other than the one on record: refused under every policy."""

    def __init__(self, message: str, *, host: str, fingerprint: str) -> None:
        super().__init__(message, host=host)
        self.fingerprint = fingerprint


class RemoteCommandError(SSHError):
    """A remote command exited non-zero (raised by ``run(..., check=True)``)."""

    def __init__(self, message: str, *, host: str, returncode: int, stderr: str) -> None:
        super().__init__(message, host=host)
        self.returncode = returncode
        self.stderr = stderr


class BootstrapError(SSHError):
    """Some nodes failed the bootstrap; ``problems`` maps each such host to what is wrong."""

    def __init__(self, problems: dict[str, list[str]]) -> None:
        lines = [f"{len(problems)} node(s) cannot join the cluster:"]
        for host, items in problems.items():
            lines.extend(f"  {host}: {item}" for item in items)
        super().__init__("\n".join(lines), host=next(iter(problems), ""))
        self.problems = problems


class CleanupWarning(UserWarning):
    """``stop()`` could not remove everything from some nodes; the message says what and where."""


class ColdLaunchWarning(UserWarning):
    """A warm cluster's job (``launch="warm"``) logs in to some nodes anew, as a cold launch
    does: the message names them and why (their kept connection ended or could not be made)."""


class OversubscriptionWarning(UserWarning):
    """A job puts more ranks on a host than the cores it may use (CPU affinity, cgroup quota),
    without ``oversubscribe=True``: the message names the hosts, ranks, cores and the fix."""
