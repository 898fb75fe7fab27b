"""The same work for every node at once: threads, results and errors by node."""

from __future__ import annotations

import contextvars
import functools
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["IDLE", "SHARED", "Workers", "parallel"]

T = TypeVar("T")

_MAX_THREADS = 32
#: Seconds a worker thread waits for more work before it ends. A cluster's start fans out
#: five or six times in a row; starting a thread costs ~0.2 ms of CPU here, so the threads of
#: the first fan-out serve the next ones instead of 8 new threads a step.
IDLE = 10.0


class Workers:
    """Threads kept between fan-outs: each waits ``idle`` seconds for more work, then ends.
    A forked child takes none of them (:meth:`forget`): it has none of its parent's threads."""

    def __init__(self, idle: float = IDLE) -> None:
        self.idle = idle
        self._lock = threading.Lock()
        self._waiting: list[_Worker] = []
        self._generation = 0

    def take(self, count: int) -> list[_Worker]:
        """``count`` threads: those waiting for work first, then new ones."""
        with self._lock:
            taken = [self._waiting.pop() for _ in range(min(count, len(self._waiting)))]
        return taken + [_Worker(self) for _ in range(count - len(taken))]

    def waiting(self) -> int:
        """How many threads wait for work now."""
        with self._lock:
            return len(self._waiting)

    def forget(self) -> None:
        """Take no thread made so far."""
        self._lock = threading.Lock()  # a thread of the parent may have held it at the fork
        self._waiting.clear()
        self._generation += 1


class _Worker:
    """A daemon thread that runs the jobs put to it, and waits a while for more."""

    def __init__(self, pool: Workers) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.pool = pool
        self.generation = pool._generation
        self.thread = threading.Thread(target=self._run, name="clusterbook-fanout", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        pool = self.pool
        while True:
            try:
                job = self.jobs.get(timeout=pool.idle)
            except queue.Empty:
                with pool._lock:
                    if self in pool._waiting:  # nobody took it meanwhile: end
                        pool._waiting.remove(self)
                        return
                    if self.generation != pool._generation:  # forgotten: nobody can take it
                        return
                continue  # taken just now: its job is on the way
            job()
            with pool._lock:
                pool._waiting.append(self)


#: The threads every fan-out shares unless it is given others.
SHARED = Workers()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=SHARED.forget)


def parallel(
    items: Sequence[str], work: Callable[[str], T], *, workers: Workers = SHARED
) -> tuple[dict[str, T], dict[str, Exception]]:
    """Run ``work(item)`` for every item in threads; return results and errors by item.

    Plain threads, not an executor: ``concurrent.futures`` refuses new work once the
    interpreter is shutting down, and a cluster's clean-up at exit must still reach every
    node. The threads of one call serve the next ones for a while (``workers``). Each
    runs ``work`` in a copy of the caller's context (its context variables: how messages are
    worded, for one)."""
    done: dict[str, T] = {}
    failed: dict[str, Exception] = {}
    if not items:
        return done, failed
    todo = iter(list(items))
    lock = threading.Lock()
    threads = workers.take(min(_MAX_THREADS, len(items)))
    running = len(threads)
    finished = threading.Event()

    def worker() -> None:
        nonlocal running
        try:
            while True:
                with lock:
                    item = next(todo, None)
                if item is None:
                    return
                try:
                    result = work(item)
                except Exception as exc:  # gathered, re-raised as one BootstrapError
                    failed[item] = exc
                else:
                    done[item] = result
        finally:
            with lock:
                running -= 1
                if running == 0:
                    finished.set()

    for w in threads:
        w.jobs.put(functools.partial(contextvars.copy_context().run, worker))
    finished.wait()
    return {i: done[i] for i in items if i in done}, {i: failed[i] for i in items if i in failed}
