"""Waits that leave a notebook's buttons working: while a cell blocks in ``job.wait()``,
``job.result()`` or ``%%mpirun``, the widgets' clicks are handled as they come.

A notebook's kernel reads widget clicks (comm messages) on the thread that runs the cell, so
a cell blocked in a wait would hold every click until it ends, and a **Stop job** button could
never stop the job the cell waits for. Where the Jupyter layer says this thread runs a
notebook's cell (the ``busy`` entry point of :mod:`clusterbook.jupyter`), a wait here wakes
every :data:`PUMP_INTERVAL` seconds to have it handle the clicks that came meanwhile; what it
waits for still ends the wait at once, since each step waits on that thing itself, not in a
sleep. Elsewhere (a script, a thread, no Jupyter layer) a wait is the plain wait it always
was.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar, cast

from clusterbook.jupyter import Pump, notebook_pump

__all__ = ["ASK", "PUMP_INTERVAL", "Ready", "each", "pause", "wait_until"]

_log = logging.getLogger("clusterbook")

T = TypeVar("T")

#: Seconds between two looks at the notebook's clicks: a click acts within this.
PUMP_INTERVAL = 0.05

#: Items :func:`each` takes at once when they are there already.
_BATCH = 1000

#: ready(seconds): wait at most that long (None: without bound) for the thing; whether it came.
Ready = Callable[[float | None], bool]


class _Ask:
    """The default of ``pump=``: ask the Jupyter layer for this thread's pump."""

    def __repr__(self) -> str:
        return "ASK"


ASK = _Ask()


def _pump_of(pump: Pump | _Ask | None) -> Pump | None:
    return notebook_pump() if isinstance(pump, _Ask) else pump


def wait_until(
    ready: Ready,
    timeout: float | None,
    *,
    pump: Pump | _Ask | None = ASK,
    interval: float = PUMP_INTERVAL,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Wait for ``ready`` for at most ``timeout`` seconds (None: until it comes); return
    whether it came.

    With a pump (by default, the Jupyter layer's while this thread runs a notebook's cell),
    ``ready`` is asked ``interval`` seconds at a time and the pump runs in between; a pump
    that fails is logged and not run again in this wait, which goes on without it. An
    interrupt (``KeyboardInterrupt``) goes through at once, from the wait or the pump.
    """
    found = _pump_of(pump)
    if found is None:
        return ready(timeout)
    deadline = None if timeout is None else clock() + timeout
    while True:
        left = None if deadline is None else max(0.0, deadline - clock())
        if found is None:
            return ready(left)
        if ready(interval if left is None else min(interval, left)):
            return True
        if deadline is not None and clock() >= deadline:
            return False
        try:
            found()
        except Exception:
            # A broken pump costs the buttons, never the wait.
            _log.exception("clusterbook could not handle the notebook's clicks while waiting")
            found = None


def pause(
    seconds: float,
    *,
    pump: Pump | _Ask | None = ASK,
    interval: float = PUMP_INTERVAL,
) -> None:
    """Sleep ``seconds`` (a poll's step), handling the notebook's clicks meanwhile as
    :func:`wait_until` does."""
    wait_until(threading.Event().wait, seconds, pump=pump, interval=interval)


def each(
    items: Iterable[T],
    *,
    pump: Pump | _Ask | None = ASK,
    interval: float = PUMP_INTERVAL,
) -> Iterator[T]:
    """``items`` one by one, handling the notebook's clicks while the next is awaited.

    Without a pump this is ``iter(items)``. With one, a thread of its own takes the items
    (each ``next()`` may block, as a job's ``stream()`` does until a line comes) and this
    thread waits for them as :func:`wait_until` does; an error of ``items`` is raised here.
    Once the caller stops (the iterator is closed, or an error or interrupt leaves it), the
    thread stops at the next item."""
    found = _pump_of(pump)
    if found is None:
        yield from items
        return
    box: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
    stop = threading.Event()

    def take() -> None:
        try:
            for item in items:
                box.put(("item", item))
                if stop.is_set():
                    return
            box.put(("end", None))
        except BaseException as exc:  # handed to the caller's thread, raised there
            box.put(("error", exc))

    threading.Thread(target=take, name="clusterbook-each", daemon=True).start()
    got: deque[tuple[str, object]] = deque()

    def ready(seconds: float | None) -> bool:
        try:
            got.append(box.get(timeout=seconds))
        except queue.Empty:
            return False
        return True

    try:
        while True:
            if not got:
                wait_until(ready, None, pump=found, interval=interval)
                # What came meanwhile, at once: a wait per item would cost a fast stream.
                with contextlib.suppress(queue.Empty):
                    while len(got) < _BATCH:
                        got.append(box.get_nowait())
            kind, value = got.popleft()
            if kind == "end":
                return
            if kind == "error":
                assert isinstance(value, BaseException)
                raise value
            yield cast(T, value)  # an item of ``items``, as put
    finally:
        stop.set()
