"""``submit`` and ``executor`` as methods of a cluster: the one definition that ``Cluster`` and
an attached handle (``Cluster.attach``) both take, for any class that is a
:class:`~clusterbook.cluster.handle.ClusterHandle`; and ``map``, for a cluster whose head runs
in this process (:class:`~clusterbook.functions.pool.PoolHost`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from clusterbook.functions.executor import ClusterExecutor
from clusterbook.functions.submit import submit

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from clusterbook.cluster.handle import ClusterHandle, JobHandle
    from clusterbook.functions.pool import PoolHost
    from clusterbook.functions.results import SweepResult
    from clusterbook.launch.prepare import JobArgs

__all__ = ["FunctionMethods", "SweepMethods"]


class FunctionMethods:
    """What a cluster does with Python functions (see :mod:`clusterbook.functions`)."""

    def submit(
        self: ClusterHandle,
        fn: Callable[..., Any],
        /,
        *args: Any,
        np: int | None = None,
        **job: Unpack[JobArgs],
    ) -> JobHandle:
        """Run ``fn(*args)`` on ``np`` ranks (default: all slots) and return the running job:
        ``job.result()`` is the list of what each rank returned, by rank.

        ``fn`` and ``args`` travel pickled with cloudpickle (lambdas, closures and what a
        notebook defines work; what cannot be pickled is a :class:`SerializationError` naming
        it, before any rank starts); mpi4py is there for ``fn`` to use. The other arguments
        are ``mpirun``'s (``timeout``, ``retries``, ``env``, ...). A rank that raises fails
        the job: ``result()`` raises :class:`JobFailedError` with the rank's traceback as its
        cause (:mod:`clusterbook.functions.submit`).
        """
        return submit(self, fn, *args, np=np, **job)

    def executor(self: ClusterHandle, np: int = 1, **job: Any) -> ClusterExecutor:
        """A ``concurrent.futures.Executor`` on the cluster: each ``submit(fn, *args)`` runs as
        a job of ``np`` ranks, and its future's value is rank 0's return value; at most
        ``max_running`` at once (default: as many as the slots hold). ``job``: the options of
        ``mpirun`` for every job (:mod:`clusterbook.functions.executor`)."""
        return ClusterExecutor(self, np, **job)


class SweepMethods:
    """Sweeps of a cluster whose head runs in this process (see :mod:`.sweep`)."""

    def map(
        self: PoolHost,
        fn: Callable[[Any], Any],
        iterable: Iterable[Any],
        *,
        np: int = 1,
        max_running: int | None = None,
        retries: int = 0,
        ordered: bool = True,
        progress: bool | None = None,
    ) -> SweepResult:
        """Run ``fn(item)`` for every item, as many at once as ``max_running`` (default: every
        slot), on a pool of ranks that stays up between sweeps (stopped with the cluster or
        after 10 idle minutes); ``retries`` runs a failed item again. Returns a
        :class:`~clusterbook.functions.results.SweepResult`: the values in input order (or as
        they finished: ``ordered=False``), a failed item's ``ItemFailedError`` in its place."""
        from clusterbook.functions.sweep import sweep

        return sweep(self, fn, iterable, np=np, max_running=max_running, retries=retries,
                     ordered=ordered, progress=progress)  # fmt: skip
