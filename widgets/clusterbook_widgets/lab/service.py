"""What the REST API does, without HTTP: the clusters of this user as ``clusterbook ls``
finds them, a cluster's jobs and log lines, stopping one, its resource history, the profiles
and a new detached cluster of one.

A cluster's jobs and logs are read from its directory (a stopped cluster's too); stopping and
the resource history ask its head, through a handle attached once and kept while the cluster
runs: a sidebar polling every second must not attach every second. Every call is blocking
(files, the control socket): the routes run them on threads of their own.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from clusterbook.errors import ClusterError, ClusterStateError, ConfigError, UnknownClusterError
from clusterbook.head.catalog import Found, ordered, scan
from clusterbook.launch.saved import SavedJob
from clusterbook.names import is_cluster_id
from clusterbook_widgets.lab.follow import PAGE, LogCursor
from clusterbook_widgets.lab.listing import cluster_json, jobs_json

__all__ = ["ClusterService", "Handle", "UnknownJobError"]

#: Jobs whose log positions are kept (the least recently read go first).
_CURSORS = 64


class UnknownJobError(ClusterError, LookupError):
    """A cluster has no job of that id."""


class Handle(Protocol):
    """What the service asks of an attached cluster."""

    def stop(self, timeout: float = 30.0) -> None: ...

    def resource_history(self, window: float | None = None) -> dict[str, Any]: ...

    def close(self) -> None: ...


Attach = Callable[[str], Handle]


def _attach(directory: str) -> Handle:
    from clusterbook.cluster.remote.attached import AttachedCluster

    return AttachedCluster.attach(directory)


def _start_profile(name: str) -> str:
    """Start the cluster of profile ``name`` detached (as ``Cluster.from_profile(name,
    detached=True).start()``); its id."""
    from clusterbook.cluster.facade import Cluster

    cluster = Cluster.from_profile(name, detached=True).start()
    return cluster.id


class ClusterService:
    """The API's operations (see the module's docstring). ``root``: the run root (default
    the user's); ``attach`` and ``start_profile`` are how a cluster is attached to and a
    profile's cluster started (tests pass their own)."""

    def __init__(
        self,
        *,
        root: Path | None = None,
        attach: Attach = _attach,
        start_profile: Callable[[str], str] = _start_profile,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._root = root
        self._attach = attach
        self._start_profile = start_profile
        self._clock = clock
        self._handles: dict[str, Handle] = {}
        self._cursors: OrderedDict[tuple[str, str], LogCursor] = OrderedDict()
        self._lock = threading.Lock()

    # -- reading directories -------------------------------------------------------------

    def clusters(self) -> list[dict[str, Any]]:
        """Every cluster of this user, running ones first, newest first."""
        now = self._clock()
        return [cluster_json(found, now) for found in ordered(list(scan(self._root)))]

    def _found(self, cluster_id: str) -> Found:
        if is_cluster_id(cluster_id):
            for found in scan(self._root):
                if found.id == cluster_id and found.record is not None:
                    return found
        raise UnknownClusterError(
            f"No cluster {cluster_id!r}: it is not the id of a cluster of this user "
            "(GET /clusterbook/api/clusters lists them; clusterbook ls too).",
            known=tuple(f.id for f in scan(self._root)),
        )

    def jobs(self, cluster_id: str) -> list[dict[str, Any]]:
        """The cluster's jobs, newest first."""
        record = self._found(cluster_id).record
        assert record is not None
        return jobs_json(record)

    def logs(self, cluster_id: str, job_id: str, after: int, limit: int = PAGE) -> dict[str, Any]:
        """Job ``job_id``'s lines from position ``after`` on (see :class:`LogCursor`)."""
        if after < 0 or limit < 1:
            raise ConfigError(
                f"after={after}, limit={limit}: after is a position (0 or more) and limit "
                "a number of lines (1 or more); give after=0 for the first line."
            )
        key = (cluster_id, job_id)
        with self._lock:
            cursor = self._cursors.get(key)
            if cursor is not None:
                self._cursors.move_to_end(key)
        if cursor is None:
            cursor = LogCursor(self._job(cluster_id, job_id))
            with self._lock:
                cursor = self._cursors.setdefault(key, cursor)
                while len(self._cursors) > _CURSORS:
                    self._cursors.popitem(last=False)
        return cursor.page(after, min(limit, PAGE))

    def _job(self, cluster_id: str, job_id: str) -> SavedJob:
        record = self._found(cluster_id).record
        assert record is not None
        for entry in record.jobs:
            if entry.id == job_id:
                return SavedJob(entry.directory)
        known = ", ".join(entry.id for entry in record.jobs) or "none yet"
        raise UnknownJobError(f"Cluster {cluster_id} has no job {job_id!r}; its jobs: {known}.")

    # -- asking heads ----------------------------------------------------------------------

    def handle(self, cluster_id: str) -> Handle:
        """The cluster's attached handle, attached once while it runs."""
        found = self._found(cluster_id)
        assert found.record is not None
        if not found.record.live or found.stale:
            self._forget(cluster_id)
            state = "stale: its head is gone" if found.stale else found.record.state
            raise ClusterStateError(
                f"Cluster {cluster_id} is {state}, not running; there is nothing to ask its head."
            )
        with self._lock:
            handle = self._handles.get(cluster_id)
        if handle is None:
            handle = self._attach(str(found.path))
            with self._lock:
                kept = self._handles.setdefault(cluster_id, handle)
            if kept is not handle:
                handle.close()
                handle = kept
        return handle

    def _forget(self, cluster_id: str) -> None:
        with self._lock:
            handle = self._handles.pop(cluster_id, None)
        if handle is not None:
            handle.close()

    def stop(self, cluster_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """Stop the cluster (its head stops its jobs and nodes); the cluster as it is then."""
        self.handle(cluster_id).stop(timeout=timeout)
        self._forget(cluster_id)
        return cluster_json(self._found(cluster_id), self._clock())

    def resources(self, cluster_id: str, window: float | None = None) -> dict[str, Any]:
        """The head's resource history of the cluster's nodes (the last ``window`` s)."""
        if window is not None and not window > 0:
            raise ConfigError(
                f"window={window}: give a number of seconds above 0, or none for the whole "
                "history the head keeps."
            )
        return self.handle(cluster_id).resource_history(window)

    # -- profiles --------------------------------------------------------------------------

    def profiles(self) -> dict[str, Any]:
        """The user's profiles: their names and kinds, and the file they are in."""
        from clusterbook.config import read_profiles

        found = read_profiles()
        listed = [{"name": p.name, "kind": p.kind} for p in found.by_name.values()]
        return {"path": str(found.path), "exists": found.exists, "profiles": listed}

    def new(self, profile: object) -> dict[str, Any]:
        """Start profile ``profile``'s cluster detached; the cluster as it is then."""
        if not isinstance(profile, str) or not profile:
            raise ConfigError(
                f"profile={profile!r}: give the name of a profile (GET "
                '/clusterbook/api/profiles lists them), like {"profile": "laptop"}.'
            )
        return cluster_json(self._found(self._start_profile(profile)), self._clock())

    def close(self) -> None:
        """Let go of every attached handle (the clusters run on)."""
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
        for handle in handles:
            handle.close()
