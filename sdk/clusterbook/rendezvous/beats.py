"""A node's heartbeat thread: one for the handler's life, beating only while a round holds it.

Starting a thread costs more than a whole rendezvous step, so the handler starts this one when
it is made and switches it on and off around rounds, instead of starting one per round.

Switching it on or off wakes nobody when it can be helped: the rounds are what a node waits on,
and every wake-up of this thread then costs the node's rendezvous a thread switch. The thread
always sleeps with a timeout (until its next beat, or at most ``idle`` seconds while off); at
that wake-up it finds out what changed meanwhile. Only a switch on whose first beat falls before
the end of that sleep wakes it early, and :meth:`Heartbeats.close`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

__all__ = ["Heartbeats"]


class Heartbeats:
    """Calls ``beat()`` while on: first after ``first()`` seconds, then after the seconds each
    beat returns. :meth:`start` switches it on (again from ``first()``), :meth:`pause` off
    (waiting out a beat in flight), :meth:`close` ends the thread; :meth:`start` after
    :meth:`close` starts a new one. While off the thread wakes every ``idle`` seconds at most
    (the handler's keep-alive interval: a first beat is then never late)."""

    def __init__(
        self,
        name: str,
        first: Callable[[], float],
        beat: Callable[[], float],
        *,
        idle: float = 1.0,
    ) -> None:
        self._name = name
        self._first = first
        self._beat = beat
        self._idle = idle
        self._cond = threading.Condition()
        self._on = False
        self._closed = False
        self._epoch = 0  # counts switches: a beat loop of an older one stops
        self._beating = False
        self._wakes_at = math.inf  # when the thread's sleep ends (monotonic)
        self._thread = self._spawn()

    def _spawn(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        thread.start()
        return thread

    def start(self) -> None:
        """Beat from now on, the first time after ``first()`` seconds."""
        due = time.monotonic() + self._first()
        with self._cond:
            if self._closed or not self._thread.is_alive():
                self._closed = False
                self._wakes_at = math.inf
                self._thread = self._spawn()
            self._on = True
            self._epoch += 1
            if self._wakes_at > due:
                self._cond.notify_all()

    def pause(self, timeout: float) -> None:
        """Beat no more; wait up to ``timeout`` seconds for a beat in flight to end. (The
        thread is not woken: at the end of its sleep it finds itself switched off.)"""
        with self._cond:
            self._on = False
            self._epoch += 1
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

    def _sleep(self, seconds: float) -> None:
        """Wait on the condition (held) for ``seconds``, or until woken."""
        self._wakes_at = time.monotonic() + seconds
        self._cond.wait(seconds)
        self._wakes_at = math.inf

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not (self._on or self._closed):
                    self._sleep(self._idle)
                if self._closed:
                    return
                epoch = self._epoch
            delay = self._first()
            while True:
                with cond:
                    end = time.monotonic() + delay
                    while not self._closed and self._epoch == epoch:
                        left = end - time.monotonic()
                        if left <= 0:
                            break
                        self._sleep(left)
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
