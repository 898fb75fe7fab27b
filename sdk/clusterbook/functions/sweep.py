"""``cluster.map``: one task per item of an iterable, run on the cluster's pool of ranks.

A thread per leased rank takes the next item from the sweep's :class:`Schedule`, sends it, and
reports what came back; the decisions (what next, what a failure leads to) are the schedule's.
Once a rank of the pool has died, its pool takes no more items (the launcher ends the whole job
when one rank dies): the items its ranks held are put back by the schedule's rule once they
come back or are lost, and a new pool starts; a pool that dies
:data:`RESTARTS` times in a row without an item done ends the sweep, naming why.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from clusterbook.errors import ClusterError, ConfigError, SerializationError
from clusterbook.functions.payload import dumps_value
from clusterbook.functions.pool import IDLE_TIMEOUT, Pool, PoolHost, PoolRank
from clusterbook.functions.results import SweepResult, result_of
from clusterbook.functions.schedule import Failure, Kind, Schedule, Task
from clusterbook.functions.tracebacks import placed
from clusterbook.functions.worker import loads
from clusterbook.views.progress import Bar, bar, checked

__all__ = ["RESTARTS", "pool_for", "sweep"]

#: Pools in a row that may die with no item done before a sweep gives its items up.
RESTARTS = 3

_POOLS: dict[str, Pool] = {}  # by cluster id: the pool a cluster's sweeps use now
_POOLS_LOCK = threading.Lock()


def pool_for(host: PoolHost, size: int, *, idle_timeout: float = IDLE_TIMEOUT) -> Pool:
    """The running pool of ``host`` if it has ``size`` ranks or more, else a new one (the old
    one stopped), registered to stop with the cluster."""
    with _POOLS_LOCK:
        pool = _POOLS.get(host.id)
        if pool is not None and not pool.stopped and pool.alive >= size:
            return pool
        if pool is not None:
            pool.stop()
        pool = Pool(host, size, idle_timeout=idle_timeout)
        _POOLS[host.id] = pool
        host.on_stop(pool.stop)
        host.on_stop(lambda: _forget(host.id, pool))
    pool.start()
    return pool


def _forget(cluster: str, pool: Pool) -> None:
    with _POOLS_LOCK:
        if _POOLS.get(cluster) is pool:
            del _POOLS[cluster]


def _checked(fn: object, np: object, max_running: object, retries: object, ordered: object) -> None:
    if not callable(fn):
        raise ConfigError(f"cluster.map takes a function first, got {fn!r}.")
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise ConfigError(f"np must be a whole number of ranks of at least 1, got {np!r}.")
    if max_running is not None and (
        isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1
    ):
        raise ConfigError(
            f"max_running must be a whole number of at least 1 (or None: every slot), got "
            f"{max_running!r}."
        )
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"retries must be a whole number of at least 0, got {retries!r}.")
    if not isinstance(ordered, bool):
        raise ConfigError(f"ordered must be True or False, got {ordered!r}.")


def _pickled_function(fn: Callable[[Any], Any]) -> bytes:
    try:
        return dumps_value(fn)
    except SerializationError as exc:
        cause = exc.__cause__
        raise SerializationError(
            f"cluster.map cannot send {getattr(fn, '__qualname__', fn)!r} to the ranks: it "
            f"cannot be pickled ({type(cause).__name__}: {cause}). Define what it uses inside "
            "it, or at a notebook's top level, rather than holding locks, files or sockets."
        ) from cause


def sweep(
    host: PoolHost,
    fn: Callable[[Any], Any],
    iterable: Iterable[Any],
    *,
    np: int = 1,
    max_running: int | None = None,
    retries: int = 0,
    ordered: bool = True,
    progress: bool | None = None,
) -> SweepResult:
    """Run ``fn(item)`` for every item on ``host``'s pool: see ``Cluster.map``."""
    _checked(fn, np, max_running, retries, ordered)
    progress = checked(progress)
    slots = sum(node.slots for node in host.nodes)
    if max_running is not None and 0 < slots < max_running:
        raise ConfigError(
            f"max_running={max_running} is more than the cluster's {slots} slots: the pool runs "
            f"one item per slot; ask for at most {slots}, or give the cluster more slots."
        )
    size = max_running if max_running is not None else max(slots, 1)
    function = _pickled_function(fn)  # one that cannot be sent is said before anything runs
    if np > 1:  # an MPI job an item: as many at once as the ranks allowed hold
        from clusterbook.functions.sweep_jobs import job_sweep

        return job_sweep(host, fn, iterable, np=np, lanes=max(1, size // np), retries=retries,
                         ordered=ordered, progress=progress)  # fmt: skip
    key = hashlib.sha256(function).hexdigest()[:32]
    total = len(iterable) if hasattr(iterable, "__len__") else None  # type: ignore[arg-type]
    schedule = Schedule(iterable, retries=retries)
    if not schedule.has_more():  # nothing to run: no pool to start
        return result_of(schedule, ordered=ordered)
    with bar(progress, "map", total, "item") as shown:
        _rounds(host, size, schedule, key, function, shown)
        shown.update(schedule.done, total=schedule.count)
    for index, (item, failure, runs) in schedule.failures.items():
        if failure.traceback:  # the frames of fn at its place here, with their source lines
            failure = replace(failure, traceback=placed(failure.traceback, fn))
            schedule.failures[index] = (item, failure, runs)
    return result_of(schedule, ordered=ordered)


def _rounds(
    host: PoolHost, size: int, schedule: Schedule, key: str, function: bytes, shown: Bar
) -> None:
    """Run ``schedule`` to its end on pools of ``host``: one, unless its ranks die. A pool that
    cannot start fails the sweep at its first round (nothing has run: the error says why);
    later (a node lost since, say), it ends the items left with that error, keeping the values
    of the others."""
    barren = 0
    first = True
    while not schedule.finished:
        try:
            pool = pool_for(host, size)
        except ClusterError as exc:
            if first:
                raise
            schedule.give_up(Failure("lost", type(exc).__name__, f"no new pool: {exc}"))
            return
        first = False
        before = schedule.done
        try:
            _drive(pool, pool.lease(size), schedule, key, function, shown)
        finally:
            pool.release()
        if schedule.finished:
            return
        pool.stop()  # every rank gone: the next round starts a new pool
        barren = barren + 1 if schedule.done == before else 0
        if barren >= RESTARTS:
            reason = f"the pool's ranks died {barren} times in a row with no item done"
            schedule.give_up(Failure("lost", "PoolError", reason))


def _drive(
    pool: Pool,
    ranks: list[PoolRank],
    schedule: Schedule,
    key: str,
    function: bytes,
    shown: Bar,
) -> None:
    """Run the schedule on ``ranks`` until it is finished or every one of them has gone (at
    once when there are none: the pool stopped, idle, just as the sweep took it)."""
    cond = threading.Condition()
    broken = threading.Event()  # a rank has died: the launcher is ending the pool's job

    def serve(rank: PoolRank) -> None:
        try:
            while True:
                with cond:
                    task = _next(schedule, cond, broken)
                if task is None:
                    return
                if not _run_one(pool, rank, task, schedule, cond, key, function):
                    broken.set()  # what is put back waits for a new pool: this one is ending
                    return
                with cond:
                    shown.update(schedule.done, total=schedule.count)
        finally:
            with cond:
                cond.notify_all()

    threads = [
        threading.Thread(target=serve, args=(r,), name=f"clusterbook-map-{r.rank}", daemon=True)
        for r in ranks
    ]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)  # a short join keeps Ctrl-C (KeyboardInterrupt) reaching us
    except BaseException:
        pool.stop()  # the ranks' connections close: every thread ends at once
        raise


def _next(schedule: Schedule, cond: threading.Condition, broken: threading.Event) -> Task | None:
    """The next task for a free rank (waiting while others may still put one back), or None:
    none left, or the pool is ending (a rank of it died)."""
    while not broken.is_set():
        task = schedule.take()
        if task is not None or schedule.out == 0:
            return task
        cond.wait(1.0)
    return None


def _run_one(
    pool: Pool,
    rank: PoolRank,
    task: Task,
    schedule: Schedule,
    cond: threading.Condition,
    key: str,
    function: bytes,
) -> bool:
    """Run ``task`` on ``rank`` and tell the schedule; False when the rank has gone."""
    try:
        argument = dumps_value(task.item)
    except SerializationError as error:
        exc = error.__cause__
        failure = Failure("unpicklable", type(exc).__name__, f"the item cannot be pickled: {exc}")
        with cond:
            schedule.failed(task, failure)
            cond.notify_all()
        return True
    try:
        answer = rank.run(key, function, task.index, argument)
    except (OSError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        pool.drop(rank)
        lost = Failure(
            "lost",
            "RankLost",
            f"rank {rank.rank} on {rank.host} (pid {rank.pid}) went: {exc}",
            rank=rank.rank,
            host=rank.host,
        )
        with cond:
            schedule.failed(task, lost)
            cond.notify_all()
        return False
    with cond:
        _record(schedule, task, answer, rank)
        cond.notify_all()
    return True


def _record(schedule: Schedule, task: Task, answer: tuple[Any, ...], rank: PoolRank) -> None:
    """Tell the schedule what ``rank`` answered for ``task``."""
    if answer[0] == "ok":
        try:
            schedule.succeeded(task, loads(answer[2]))
        except Exception as exc:
            schedule.failed(
                task,
                Failure(
                    "unpicklable",
                    type(exc).__name__,
                    f"its value cannot be unpickled here: {exc}",
                    rank=rank.rank,
                    host=rank.host,
                ),
            )
        return
    _, _, type_name, message, traceback, carried = answer
    exception = None
    if carried is not None:
        try:
            exception = loads(carried)
        except Exception:
            exception = None
    kind: Kind = "unpicklable" if type_name == "PicklingError" and not traceback else "raised"
    schedule.failed(
        task,
        Failure(kind, type_name, message, traceback, rank.rank, rank.host, exception),
    )
