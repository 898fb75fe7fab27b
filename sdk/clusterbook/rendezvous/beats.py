"""A node's heartbeat thread: one for the handler's life, beating only while a round holds it.

Starting a thread costs more than a whole rendezvous step, so the handler starts this one when
it is made and switches it on and off around rounds, instead of starting one per round.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Heartbeats"]


class Heartbeats:
    """Calls ``beat()`` while on: first after ``first()`` seconds, then after the seconds each
    beat returns. :meth:`start` switches it on (again from ``first()``), :meth:`pause` off
    (waiting out a beat in flight), :meth:`close` ends the thread; :meth:`start` after
    :meth:`close` starts a new one."""

    def __init__(self, name: str, first: Callable[[], float], beat: Callable[[], float]) -> None:
        self._name = name
        self._first = first
        self._beat = beat
        self._cond = threading.Condition()
        self._on = False
        self._closed = False
        self._epoch = 0  # counts switches: a beat loop of an older one stops
        self._beating = False
        self._thread = self._spawn()

    def _spawn(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        thread.start()
        return thread

    def start(self) -> None:
        """Beat from now on, the first time after ``first()`` seconds."""
        with self._cond:
            if self._closed or not self._thread.is_alive():
                self._closed = False
                self._thread = self._spawn()
            self._on = True
            self._epoch += 1
            self._cond.notify_all()

    def pause(self, timeout: float) -> None:
        """Beat no more; wait up to ``timeout`` seconds for a beat in flight to end."""
        with self._cond:
            self._on = False
            self._epoch += 1
            self._cond.notify_all()
            if threading.current_thread() is not self._thread:
                self._cond.wait_for(lambda: not self._beating, timeout)

    def close(self, timeout: float) -> None:
        """End the thread (waiting up to ``timeout`` seconds for a beat in flight)."""
        with self._cond:
            self._closed = True
            self._on = False
            self._epoch += 1
            self._cond.notify_all()
            thread = self._thread
        if thread is not threading.current_thread():
            thread.join(timeout)

    def _switched(self, epoch: int) -> Callable[[], bool]:
        return lambda: self._closed or self._epoch != epoch

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                cond.wait_for(lambda: self._on or self._closed)
                if self._closed:
                    return
                epoch = self._epoch
            delay = self._first()
            while True:
                with cond:
                    cond.wait_for(self._switched(epoch), delay)
                    if self._closed:
                        return
                    if self._epoch != epoch:
                        break  # switched off, or on again: from the top
                    self._beating = True
                try:
                    delay = self._beat()
                finally:
                    with cond:
                        self._beating = False
                        cond.notify_all()
