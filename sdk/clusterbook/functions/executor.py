"""``cluster.executor(np=1)``: a ``concurrent.futures.Executor`` whose work runs as function
jobs of a cluster (:mod:`clusterbook.functions.submit`).

Its futures are ``concurrent.futures.Future`` objects, so ``concurrent.futures.wait``,
``as_completed`` and ``asyncio.wrap_future`` take them, and so does any library that takes an
executor. A future's value is rank 0's return value (the MPI convention: gather inside the
function for more). At most ``max_running`` jobs run at once (default: as many as the
cluster's slots hold, at ``np`` ranks each); the others wait in order, and can be cancelled
until they start.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from clusterbook.errors import ClusterStateError, ConfigError
from clusterbook.functions import payload
from clusterbook.functions.submit import start
from clusterbook.functions.values import code_files

if TYPE_CHECKING:
    from typing_extensions import ParamSpec, Unpack

    from clusterbook.cluster.handle import ClusterHandle, JobHandle
    from clusterbook.launch.prepare import JobArgs

    P = ParamSpec("P")

__all__ = ["ClusterExecutor"]

T = TypeVar("T")


class ClusterExecutor(concurrent.futures.Executor):
    """Runs each ``submit(fn, *args, **kwargs)`` as a function job of ``np`` ranks on
    ``cluster`` (see the module); ``job`` are the job options of ``Cluster.mpirun``
    (``timeout``, ``retries``, ``env``, ...) for every job."""

    def __init__(
        self,
        cluster: ClusterHandle,
        np: int = 1,
        *,
        max_running: int | None = None,
        **job: Unpack[JobArgs],
    ) -> None:
        for name, value in (("np", np), ("max_running", max_running)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(f"executor({name}={value!r}): give a whole number of 1 or more.")
        self.cluster, self.np, self._job = cluster, np, job
        slots = sum(node.slots for node in cluster.nodes)
        self.max_running = max_running or max(1, slots // np)
        self._lock = threading.Lock()
        # (future, call, where its code was defined) of the calls not started yet
        self._waiting: collections.deque[
            tuple[concurrent.futures.Future[Any], bytes, dict[str, str]]
        ] = collections.deque()
        self._running = 0
        self._open: set[concurrent.futures.Future[Any]] = set()
        self._jobs: list[JobHandle] = []
        self._shut = False

    @property
    def jobs(self) -> list[JobHandle]:
        """The jobs started so far, in the order they started."""
        with self._lock:
            return list(self._jobs)

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        """Run ``fn(*args, **kwargs)`` as a job of ``np`` ranks; a future of rank 0's value.
        What cannot be pickled is a :class:`~clusterbook.errors.SerializationError`, here."""
        with self._lock:
            if self._shut:
                raise ClusterStateError(
                    "This executor was shut down: cannot submit more; make a new one with "
                    "cluster.executor()."
                )
        call = payload.dumps(fn, args, kwargs)
        files = code_files(fn)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            self._waiting.append((future, call, files))
            self._open.add(future)
        self._pump()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more submits; ``cancel_futures``: cancel those that have not started; ``wait``:
        return once every started job has ended and its future is settled."""
        with self._lock:
            self._shut = True
            dropped = list(self._waiting) if cancel_futures else []
            if cancel_futures:
                self._waiting.clear()
        for future, _, _ in dropped:
            future.cancel()
            self._settled(future, started=False)
        if wait:
            with self._lock:
                left = list(self._open)
            concurrent.futures.wait(left)

    # -- internals -------------------------------------------------------------------------

    def _pump(self) -> None:
        """Start waiting calls while fewer than ``max_running`` run."""
        while True:
            with self._lock:
                if self._running >= self.max_running or not self._waiting:
                    return
                future, call, files = self._waiting.popleft()
                if not future.set_running_or_notify_cancel():  # cancelled while it waited
                    self._open.discard(future)
                    continue
                self._running += 1
            try:
                job = start(self.cluster, call, np=self.np, files=files, **self._job)
            except BaseException as exc:
                future.set_exception(exc)
                self._settled(future, started=True)
                continue
            with self._lock:
                self._jobs.append(job)
            job.add_done_callback(functools.partial(self._ended, future))

    def _ended(self, future: concurrent.futures.Future[Any], job: JobHandle) -> None:
        try:
            future.set_result(job.result()[0])
        except BaseException as exc:
            future.set_exception(exc)
        self._settled(future, started=True)

    def _settled(self, future: concurrent.futures.Future[Any], *, started: bool) -> None:
        with self._lock:
            self._open.discard(future)
            if started:
                self._running -= 1
        self._pump()
