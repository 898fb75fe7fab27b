"""Change notification: callbacks that receive immutable snapshots.

Callbacks run on the thread that made the change (a job's supervisor thread, the caller of
``start()``); a callback that raises is logged and does not stop the others or the cluster.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Subscribers"]

T = TypeVar("T")
_log = logging.getLogger("clusterbook")


class Subscribers(Generic[T]):
    """A set of callbacks to tell about a new ``T``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: dict[int, Callable[[T], None]] = {}
        self._next = 0

    def subscribe(self, callback: Callable[[T], None]) -> Callable[[], None]:
        """Call ``callback(value)`` on every change; returns the function that unsubscribes."""
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        with self._lock:
            key = self._next
            self._next += 1
            self._callbacks[key] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._callbacks.pop(key, None)

        return unsubscribe

    def publish(self, value: T) -> None:
        """Give ``value`` to every callback."""
        with self._lock:
            callbacks = list(self._callbacks.values())
        for callback in callbacks:
            try:
                callback(value)
            except Exception:
                _log.exception("a clusterbook subscriber failed; it stays subscribed")

    def __len__(self) -> int:
        with self._lock:
            return len(self._callbacks)


class Stoppers:
    """Functions to call, newest first, once (each ``run()`` calls those added since the last)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stops: list[Callable[[], None]] = []

    def add(self, stop: Callable[[], None]) -> None:
        with self._lock:
            self._stops.append(stop)

    def run(self) -> None:
        with self._lock:
            stops, self._stops = self._stops, []
        for stop in reversed(stops):
            stop()
