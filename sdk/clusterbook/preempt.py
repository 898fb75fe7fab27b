"""What a rank does when its nodes are about to go: :func:`on_preempt`.

A Slurm cluster made with ``signal_before=`` (or ``requeue=True``) has Slurm warn its batch
job before the time limit; the head then sends SIGUSR1 to the launcher of every job with ranks
on that batch job's nodes, which forwards it to the ranks. A rank that registered a function
with :func:`on_preempt` runs it (to write a checkpoint); a job with ``restarts=`` then resumes
from it, on the requeued job's nodes (``CLUSTERBOOK_RESTART`` says which restart it is).

The job's ``timeout`` sends SIGUSR1 too, for Python ranks to dump their stacks before they are
stopped: the function runs then as well (a last checkpoint), and the stacks are still dumped.
A plain ``signal.signal(signal.SIGUSR1, handler)`` works the same way, without the dump.

A warning may come while the rank starts (Slurm sends it up to a minute early). Ranks start
with SIGUSR1 ignored (the rank wrapper's doing): one that comes before Python runs is lost
rather than the rank's end. Once Python runs, the rank hook remembers one that comes before
:func:`on_preempt` is called, which then runs the function at once (a plain handler set later
is not told).
"""

from __future__ import annotations

import faulthandler
import signal
import sys
from collections.abc import Callable
from types import FrameType

__all__ = ["on_preempt"]


def on_preempt(fn: Callable[[], object]) -> Callable[[], object]:
    """Run ``fn()`` in this rank's main thread when SIGUSR1 comes (a Slurm batch job's time
    limit is near, or the job's timeout): write a checkpoint there. Where it came already,
    since the rank started, ``fn()`` runs now. Returns ``fn``, so it can be a decorator. Call
    it from the main thread (Python's rule for signal handlers)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        fn()

    before = signal.signal(signal.SIGUSR1, handler)
    if getattr(before, "came", False) is True:  # the rank hook's: it came as the rank started
        fn()
    return fn
