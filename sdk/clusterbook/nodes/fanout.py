"""The same work for every node at once: threads, results and errors by node."""

from __future__ import annotations

import contextvars
import functools
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["parallel"]

T = TypeVar("T")

_MAX_THREADS = 32
#: Seconds a worker thread waits for more work before it ends. A cluster's start fans out
#: five or six times in a row; starting a thread costs ~0.2 ms of CPU here, so the threads of
#: the first fan-out serve the next ones instead of 8 new threads a step.
_IDLE = 10.0


class _Worker:
    """A daemon thread that runs the jobs put to it, and waits ``_IDLE`` seconds for more."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.generation = _generation
        self.thread = threading.Thread(target=self._run, name="clusterbook-fanout", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                job = self.jobs.get(timeout=_IDLE)
            except queue.Empty:
                with _lock:
                    if self in _idle:  # nobody took it meanwhile: end
                        _idle.remove(self)
                        return
                    if self.generation != _generation:  # forgotten: nobody can take it
                        return
                continue  # taken just now: its job is on the way
            job()
            with _lock:
                _idle.append(self)


_lock = threading.Lock()
_idle: list[_Worker] = []
_generation = 0


def _forget_workers() -> None:
    """Take no idle thread made so far (a forked child has none of its parent's threads)."""
    global _lock, _generation
    _lock = threading.Lock()
    _idle.clear()
    _generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)


def _workers(count: int) -> list[_Worker]:
    with _lock:
        taken = [_idle.pop() for _ in range(min(count, len(_idle)))]
    return taken + [_Worker() for _ in range(count - len(taken))]


def parallel(
    items: Sequence[str], work: Callable[[str], T]
) -> tuple[dict[str, T], dict[str, Exception]]:
    """Run ``work(item)`` for every item in threads; return results and errors by item.

    Plain threads, not an executor: ``concurrent.futures`` refuses new work once the
    interpreter is shutting down, and a cluster's clean-up at exit must still reach every
    node. The threads of one call serve the next ones for a while (see ``_IDLE``). Each
    runs ``work`` in a copy of the caller's context (its context variables: how messages are
    worded, for one)."""
    done: dict[str, T] = {}
    failed: dict[str, Exception] = {}
    if not items:
        return done, failed
    todo = iter(list(items))
    lock = threading.Lock()
    workers = _workers(min(_MAX_THREADS, len(items)))
    running = len(workers)
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

    for w in workers:
        w.jobs.put(functools.partial(contextvars.copy_context().run, worker))
    finished.wait()
    return {i: done[i] for i in items if i in done}, {i: failed[i] for i in items if i in failed}
