"""``cluster.map`` with ``np > 1``: an item of several ranks is an MPI job of its own (through
:func:`~clusterbook.functions.submit.submit`), as many at once as ``lanes``; the same
:class:`~clusterbook.functions.schedule.Schedule` decides what runs next and what a failure
leads to, and the same :class:`~clusterbook.functions.results.SweepResult` comes back. An
item's value is rank 0's return value (the MPI convention, as the executor's futures: gather
inside the function for more). Items of one rank each take the pool instead (:mod:`.sweep`):
they would pay an MPI start each here."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from clusterbook.errors import ClusterError, SerializationError
from clusterbook.functions.pool import PoolHost
from clusterbook.functions.results import SweepResult, result_of
from clusterbook.functions.schedule import Failure, Kind, Schedule, Task
from clusterbook.functions.submit import submit
from clusterbook.functions.values import RemoteTraceback
from clusterbook.views.progress import Bar, bar

__all__ = ["job_sweep"]


def job_sweep(
    host: PoolHost,
    fn: Callable[[Any], Any],
    iterable: Iterable[Any],
    *,
    np: int,
    lanes: int,
    retries: int,
    ordered: bool,
    progress: bool | None,
) -> SweepResult:
    """Run ``fn(item)`` on ``np`` ranks for every item, ``lanes`` jobs at once."""
    total = len(iterable) if hasattr(iterable, "__len__") else None  # type: ignore[arg-type]
    schedule = Schedule(iterable, retries=retries)
    cond = threading.Condition()
    with bar(progress, "map", total, "item") as shown:
        threads = [
            threading.Thread(
                target=_lane,
                args=(host, fn, np, schedule, cond, shown),
                name=f"clusterbook-map-job-{n}",
                daemon=True,
            )
            for n in range(lanes)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        shown.update(schedule.done, total=schedule.count)
    return result_of(schedule, ordered=ordered)


def _lane(
    host: PoolHost,
    fn: Callable[[Any], Any],
    np: int,
    schedule: Schedule,
    cond: threading.Condition,
    shown: Bar,
) -> None:
    """Take items and run each as a job until none is left (nor out, to come back)."""
    while True:
        with cond:
            task = schedule.take()
            while task is None and schedule.out > 0:
                cond.wait(1.0)  # one out may fail and run again
                task = schedule.take()
            if task is None:
                cond.notify_all()
                return
        outcome = _run(host, fn, np, task)
        with cond:
            if isinstance(outcome, Failure):
                schedule.failed(task, outcome)
            else:
                schedule.succeeded(task, outcome[0])
            shown.update(schedule.done, total=schedule.count)
            cond.notify_all()


def _run(host: PoolHost, fn: Callable[[Any], Any], np: int, task: Task) -> tuple[Any] | Failure:
    """Rank 0's value of ``fn(task.item)`` as a job of ``np`` ranks, or why there is none."""
    try:
        values = submit(host, fn, task.item, np=np).result()
    except ClusterError as exc:
        cause = exc.__cause__
        if isinstance(cause, RemoteTraceback):
            return Failure(
                "raised",
                cause.type,
                str(exc).splitlines()[0],
                traceback=cause.text,
                rank=cause.rank,
                host=cause.host,
            )
        # An item that cannot be sent cannot run again either; a job that failed otherwise
        # (a rank killed, a node lost) may: the schedule's rule decides.
        kind: Kind = "unpicklable" if isinstance(exc, SerializationError) else "lost"
        return Failure(kind, type(exc).__name__, str(exc).splitlines()[0])
    return (values[0],)
