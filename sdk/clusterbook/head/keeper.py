"""The head's housekeeping: a thread that keeps the cluster's record current and ends its life.

Every ``interval`` (0.2 s) it writes the record if something changed, looks for the stop file
and asks :func:`~clusterbook.lifetime.decide` whether the life span or the idle timeout has
passed (or an ephemeral cluster's job has ended); it logs a warning a minute before a timed
stop. Stopping runs on a thread of its own: the cluster's ``stop()`` closes the keeper, which
must not wait for itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from clusterbook.head.record import STOP_FILE
from clusterbook.lifetime import Lifetime, decide

__all__ = ["Keeper"]

_log = logging.getLogger("clusterbook.cluster.facade")


class Keeper:
    """Housekeeping of one running cluster (see the module's docstring)."""

    def __init__(
        self,
        directory: Path,
        lifetime: Lifetime,
        *,
        write: Callable[[], None],
        stop: Callable[[str], None],
        jobs: Callable[[], tuple[int, int]],
        started: float,
        one_job: bool = False,
        clock: Callable[[], float] = time.time,
        interval: float = 0.2,
    ) -> None:
        self._stop_file = directory / STOP_FILE
        self._lifetime = lifetime
        self._write = write
        self._stop = stop
        self._jobs = jobs
        self._one_job = one_job
        self._clock = clock
        self._interval = interval
        self.started = started
        self.idle_since: float | None = started
        self._warned = False
        self._dirty = threading.Event()
        self._writing = threading.Lock()  # a record made earlier never replaces a later one
        self._closed = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="clusterbook-keeper", daemon=True)

    def start(self) -> Keeper:
        self.write()
        self._thread.start()
        return self

    def changed(self) -> None:
        """Something in the record changed: write it on the next tick."""
        self._dirty.set()

    def write(self) -> None:
        """Write the record now."""
        try:
            with self._writing:
                self._dirty.clear()
                self._write()
        except OSError as exc:
            _log.warning("Could not write the cluster's record: %s", exc)

    def time_left(self) -> tuple[float, str] | None:
        """Seconds until a timed stop, and which bound it is, if one is set."""
        end = self._lifetime.deadline(self.started, self.idle_since)
        return None if end is None else (end[0] - self._clock(), end[1])

    def close(self) -> None:
        """Stop the thread (from any thread but its own, it waits for it)."""
        self._closed.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def tick(self) -> None:
        """One round of housekeeping (the thread's loop body; tests call it directly)."""
        now = self._clock()
        running, ended = self._jobs()
        busy = running > 0
        if busy:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since, self._warned = now, False
            self._dirty.set()
        decision = decide(
            self._lifetime,
            now=now,
            started=self.started,
            idle_since=self.idle_since,
            stop_file=self._stop_file.exists(),
            warned=self._warned,
            one_job_done=self._one_job and ended > 0 and not busy,
        )
        if decision.warn:
            self._warned = True
            _log.warning("The cluster %s", decision.warn)
        if self._dirty.is_set():
            self.write()
        if decision.stop and not self._stopping:
            self._stopping = True
            threading.Thread(
                target=self._stop, args=(decision.stop,), name="clusterbook-stop", daemon=True
            ).start()

    def _run(self) -> None:
        while not self._closed.wait(self._interval):
            try:
                self.tick()
            except Exception:
                _log.exception("Housekeeping of the cluster failed.")
