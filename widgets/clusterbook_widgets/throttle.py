"""Coalesce bursts of values into at most one call per interval.

Snapshots and log lines can arrive thousands of times a second; a widget should update about
ten times a second whatever the rate. :class:`Throttle` keeps only the latest value pushed and
delivers it on the leading edge (at once when the interval since the last call has passed) and
on the trailing edge (when it ends), so the last value is never lost.

Time and timers come from a :class:`Scheduler`; the default one uses the monotonic clock and
daemon :class:`threading.Timer` threads, and tests inject a manual one to step time themselves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from clusterbook.durations import Duration, duration

__all__ = ["Scheduler", "ThreadScheduler", "Throttle"]

T = TypeVar("T")
_log = logging.getLogger("clusterbook")


class Scheduler(Protocol):
    """Where a throttle gets time and timers from."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    def call_later(self, delay: float, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn()`` once after ``delay`` seconds, on some thread; return a function that
        cancels the call if it has not started yet."""
        ...


class ThreadScheduler:
    """The real scheduler: :func:`time.monotonic` and daemon :class:`threading.Timer` threads."""

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Callable[[], None]:
        timer = threading.Timer(delay, fn)
        timer.daemon = True
        timer.name = "clusterbook-throttle"
        timer.start()
        return timer.cancel


class Throttle(Generic[T]):
    """Call ``call(latest)`` at most once per ``interval`` seconds, however fast values come.

    :meth:`push` may be called from any thread and never blocks on ``call``. Calls never
    overlap, run on the scheduler's thread, and a call that raises is logged and does not stop
    later ones.

    Parameters
    ----------
    interval
        Minimum seconds between the starts of two calls (0.1: at most 10 calls a second).
    call
        What to call with the latest value.
    scheduler
        Clock and timers (default: :class:`ThreadScheduler`).
    """

    def __init__(
        self,
        interval: Duration = 0.1,
        call: Callable[[T], None] | None = None,
        *,
        scheduler: Scheduler | None = None,
    ) -> None:
        seconds = duration(interval, "interval", zero=True)
        if not callable(call):
            raise TypeError(f"call must be callable, got {call!r}")
        self.interval = seconds
        self._call = call
        self._scheduler: Scheduler = scheduler or ThreadScheduler()
        self._lock = threading.Lock()
        self._calling = threading.RLock()  # calls never overlap, even with flush()
        self._value: T | None = None
        self._pending = False
        self._busy = False  # a call is scheduled or running
        self._cancel: Callable[[], None] | None = None
        self._last: float | None = None  # when the last call started
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def push(self, value: T) -> None:
        """Make ``value`` the one to deliver next (replacing any value not yet delivered)."""
        with self._lock:
            if self._closed:
                return
            self._value, self._pending = value, True
            if self._busy:
                return  # the scheduled or running call picks the latest value up
            self._busy = True
            delay = self._delay()
        self._schedule(delay)

    def flush(self) -> None:
        """Deliver the pending value now, on this thread (nothing happens if none is)."""
        with self._calling:
            with self._lock:
                if self._closed or not self._pending:
                    return
                value = self._take()
            self._invoke(value)

    def close(self) -> None:
        """Drop any pending value and cancel the scheduled call; later pushes are ignored."""
        with self._lock:
            self._closed = True
            self._pending = False
            self._value = None
            cancel, self._cancel = self._cancel, None
        if cancel is not None:
            cancel()

    # -- internals ------------------------------------------------------------------------

    def _delay(self) -> float:
        if self._last is None:
            return 0.0
        return max(0.0, self._last + self.interval - self._scheduler.now())

    def _schedule(self, delay: float) -> None:
        cancel = self._scheduler.call_later(delay, self._fire)
        with self._lock:
            if self._busy and not self._closed:
                self._cancel = cancel

    def _take(self) -> T:
        value = self._value
        self._value, self._pending = None, False
        self._last = self._scheduler.now()
        return value  # type: ignore[return-value]

    def _fire(self) -> None:
        with self._calling:
            with self._lock:
                self._cancel = None
                if self._closed:
                    return
                if not self._pending:
                    self._busy = False
                    return
                # flush() may have delivered since this call was scheduled: keep the interval.
                due = self._delay() == 0
                value = self._take() if due else None
            if due:
                self._invoke(value)  # type: ignore[arg-type]
        with self._lock:
            if self._closed:
                return
            if not self._pending:
                self._busy = False
                return
            delay = self._delay()
        # Values pushed while the call ran go out on the trailing edge.
        self._schedule(delay)

    def _invoke(self, value: T) -> None:
        try:
            self._call(value)
        except Exception:
            _log.exception("a throttled clusterbook update failed")
