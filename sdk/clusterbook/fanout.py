"""The same work for every node at once: threads, results and errors by node."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["parallel"]

T = TypeVar("T")

_MAX_THREADS = 32


def parallel(
    items: Sequence[str], work: Callable[[str], T]
) -> tuple[dict[str, T], dict[str, Exception]]:
    """Run ``work(item)`` for every item in threads; return results and errors by item.

    Plain threads, not an executor: ``concurrent.futures`` refuses new work once the
    interpreter is shutting down, and a cluster's clean-up at exit must still reach every
    node. Each thread runs in a copy of the caller's context (its context variables: how
    messages are worded, for one)."""
    done: dict[str, T] = {}
    failed: dict[str, Exception] = {}
    if not items:
        return done, failed
    todo = iter(list(items))
    lock = threading.Lock()

    def worker() -> None:
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

    threads = [
        threading.Thread(
            target=contextvars.copy_context().run,
            args=(worker,),
            name="clusterbook-fanout",
            daemon=True,
        )
        for _ in range(min(_MAX_THREADS, len(items)))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {i: done[i] for i in items if i in done}, {i: failed[i] for i in items if i in failed}
