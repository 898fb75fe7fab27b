"""What a sweep hands out next and what becomes of an item that failed: pure decisions, no
threads, no sockets, no clock (the pool's threads ask under their lock).

An item is taken from the input lazily, only when a rank is free for it, so a sweep over a long
generator holds the items in flight, not the whole input. An item whose function raised runs
again up to ``retries`` times. An item whose rank died under it (the rank was killed, its node
lost, its process ran out of memory) runs again up to ``retries + 1`` times: when a rank dies,
the MPI launcher ends the pool's other ranks too, whose items did nothing wrong, so a rank's
death must not fail them even with ``retries=0``; an item that kills every rank it runs on still
ends, failed, naming the rank and host it last died on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Failure", "Schedule", "Task", "idle_expired"]

Kind = Literal["raised", "lost", "unpicklable"]


@dataclass(frozen=True)
class Task:
    """One run of one item: its place in the input, which try this is (0: the first), the item."""

    index: int
    attempt: int
    item: Any


@dataclass(frozen=True)
class Failure:
    """Why a run of an item did not give a value.

    ``kind``: ``"raised"`` (the function raised: ``type_name``, ``message`` and the remote
    ``traceback``, and the exception itself when it could be pickled), ``"lost"`` (the rank
    died under it), ``"unpicklable"`` (the item or the value cannot be pickled: running it again
    cannot help). ``rank`` and ``host``: where it ran, when known.
    """

    kind: Kind
    type_name: str
    message: str
    traceback: str = ""
    rank: int | None = None
    host: str | None = None
    exception: BaseException | None = None


class Schedule:
    """The items of one sweep: those to hand out, those out, their values and failures.

    ``take()`` gives the next run (an item to run again first, then the input's next) or None
    when nothing is left to hand out now; ``succeeded`` and ``failed`` say how a run ended;
    ``finished`` is True once every item has a value or a final failure.
    """

    def __init__(self, items: Iterable[Any], *, retries: int) -> None:
        self._items: Iterator[Any] = iter(items)
        self._exhausted = False
        self._ahead: tuple[Any] | None = None  # an item read ahead by has_more()
        self._again: deque[Task] = deque()
        self._out: dict[int, Task] = {}
        self._raised: dict[int, int] = {}
        self._lost: dict[int, int] = {}
        self.retries = retries
        self.count = 0  # items taken from the input so far
        self.values: dict[int, Any] = {}
        self.failures: dict[int, tuple[Any, Failure, int]] = {}  # index: item, last, runs
        self.finish_order: list[int] = []

    def take(self) -> Task | None:
        """The next run to hand to a free rank, or None (nothing to hand out now)."""
        if self._again:
            task = self._again.popleft()
        elif not self.has_more():
            return None
        else:
            assert self._ahead is not None
            (item,), self._ahead = self._ahead, None
            task = Task(self.count, 0, item)
            self.count += 1
        self._out[task.index] = task
        return task

    def has_more(self) -> bool:
        """Whether there is a run to hand out now (an item of the input is read ahead to
        know, and handed out next)."""
        if self._again or self._ahead is not None:
            return True
        if self._exhausted:
            return False
        try:
            self._ahead = (next(self._items),)
        except StopIteration:
            self._exhausted = True
            return False
        return True

    def succeeded(self, task: Task, value: Any) -> None:
        """``task`` gave ``value``."""
        del self._out[task.index]
        self.values[task.index] = value
        self.finish_order.append(task.index)

    def failed(self, task: Task, failure: Failure) -> bool:
        """``task`` failed; True when it will run again (:meth:`take` gives it first)."""
        del self._out[task.index]
        if failure.kind == "raised":
            runs = self._raised[task.index] = self._raised.get(task.index, 0) + 1
            again = runs <= self.retries
        elif failure.kind == "lost":
            runs = self._lost[task.index] = self._lost.get(task.index, 0) + 1
            again = runs <= self.retries + 1
        else:
            again = False
        if again:
            self._again.append(Task(task.index, task.attempt + 1, task.item))
            return True
        self.failures[task.index] = (task.item, failure, task.attempt + 1)
        self.finish_order.append(task.index)
        return False

    @property
    def out(self) -> int:
        """Runs handed out and not yet back."""
        return len(self._out)

    @property
    def done(self) -> int:
        """Items with a value or a final failure."""
        return len(self.finish_order)

    @property
    def finished(self) -> bool:
        """Every item of the input has a value or a final failure."""
        return self._exhausted and not self._again and not self._out

    def give_up(self, failure: Failure) -> None:
        """End every item not yet done with ``failure`` (the pool cannot run them)."""
        for task in [*self._out.values(), *self._again]:
            self.failures[task.index] = (task.item, failure, task.attempt + 1)
            self.finish_order.append(task.index)
        self._out.clear()
        self._again.clear()
        ahead, self._ahead = self._ahead, None
        for item in [*(ahead or ()), *self._items]:
            self.failures[self.count] = (item, failure, 0)
            self.finish_order.append(self.count)
            self.count += 1
        self._exhausted = True


def idle_expired(last_used: float, now: float, idle_timeout: float, busy: bool) -> bool:
    """Whether a pool unused since ``last_used`` stops at ``now``: never while a sweep uses it."""
    return not busy and now - last_used >= idle_timeout
