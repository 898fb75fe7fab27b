"""When a launcher whose ranks all ended well is stopped (:func:`linger`).

A launcher ends within ~0.1 s of its last rank. One that does not is waiting for what holds
a rank's output (a process the rank left in the background), or for the end of a rank it
missed: Open MPI 5.0's daemons (PRRTE 3.0) now and then never report a short-lived rank's end,
and ``prterun`` then waits for good with every line of the job's output printed (~5% of jobs
of ``hostname`` over two nodes here, whether the daemons start over ssh or through the
agents). It is stopped once it has said nothing for :data:`QUIET` seconds since the last rank
ended, and :data:`LINGER` seconds after it at the latest (a process in the background still
writing): the ranks' results are the job's (:func:`stop_at` decides, pure).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["LINGER", "QUIET", "linger", "stop_at"]

#: Seconds a launcher may stay silent after its last rank ended before it is stopped.
QUIET = 1.0
#: Seconds a launcher may outlive its last rank at the most, whatever it still prints.
LINGER = 5.0


def stop_at(ended: float, last_output: float, quiet: float = QUIET, most: float = LINGER) -> float:
    """When (``time.monotonic()``) to stop a launcher whose last rank ended at ``ended`` and
    whose last output came at ``last_output``: ``quiet`` seconds after both, ``most`` seconds
    after the rank's end at the latest."""
    return min(ended + most, max(ended, last_output) + quiet)


def linger(
    ended: float,
    last_output: Callable[[], float],
    gone: threading.Event,
    stop: Callable[[], None],
    *,
    quiet: float = QUIET,
    most: float = LINGER,
) -> None:
    """Wait until :func:`stop_at` says so, then ``stop()``; return at once when ``gone`` is
    set (the launcher ended by itself)."""
    while (left := stop_at(ended, last_output(), quiet, most) - time.monotonic()) > 0:
        if gone.wait(left):
            return
    stop()
