"""Test doubles the widgets' tests inject (never patch in): a clock that moves when told."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable


class ManualScheduler:
    """A clock that moves only when told; due calls run on the thread that moves it."""

    def __init__(self) -> None:
        self.time = 0.0
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._queue: list[list] = []  # [due, seq, fn, cancelled]

    def now(self) -> float:
        return self.time

    def call_later(self, delay: float, fn: Callable[[], None]) -> Callable[[], None]:
        entry = [self.time + delay, next(self._seq), fn, False]
        with self._lock:
            self._queue.append(entry)

        def cancel() -> None:
            entry[3] = True

        return cancel

    @property
    def pending(self) -> int:
        with self._lock:
            return sum(1 for e in self._queue if not e[3])

    def advance(self, seconds: float = 0.0) -> None:
        end = self.time + seconds
        while True:
            with self._lock:
                due = [e for e in self._queue if not e[3] and e[0] <= end]
                if not due:
                    break
                entry = min(due, key=lambda e: (e[0], e[1]))
                self._queue.remove(entry)
            self.time = max(self.time, entry[0])
            entry[2]()
        self.time = end
