"""What ``cluster.map`` gives back: every item's value, or the error that says why it has none.

A :class:`SweepResult` is a sequence of values, in input order (or in the order the items
finished: ``ordered=False``). A failed item keeps its place: reading it (``result[i]``, or
iterating past it) raises its :class:`~clusterbook.errors.ItemFailedError`, which names the item
and carries the remote traceback, so a sweep with failures is never read as a full one by
mistake; ``failed``, ``values`` and ``check()`` give the good values and the errors apart.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterator, Sequence
from typing import Any, overload

from clusterbook.errors import ItemFailedError, SweepFailedError
from clusterbook.functions.schedule import Failure, Schedule

__all__ = ["SweepResult", "item_error", "result_of"]

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80


def item_error(index: int, item: Any, failure: Failure, attempts: int) -> ItemFailedError:
    """The error of item ``index`` (``item``), whose last run ended with ``failure``."""
    where = ""
    if failure.rank is not None:
        where = f" on rank {failure.rank}" + (f" ({failure.host})" if failure.host else "")
    runs = f" after {attempts} runs" if attempts > 1 else ""
    if failure.kind == "raised":
        what = f"raised {failure.type_name}: {failure.message}"
    elif failure.kind == "lost":
        what = f"lost its rank: {failure.message}"
    else:
        what = f"cannot be run: {failure.message}"
    message = f"Item {index} ({_SHORT.repr(item)}) {what}{where}{runs}."
    if failure.traceback:
        message += "\n\nRemote traceback:\n" + failure.traceback.rstrip()
    return ItemFailedError(
        message,
        index=index,
        input=item,
        remote_traceback=failure.traceback,
        exception=failure.exception,
        attempts=attempts,
        rank=failure.rank,
        host=failure.host,
    )


class SweepResult(Sequence[Any]):
    """The outcome of ``cluster.map``: values (or errors) by item.

    ``result[i]`` and iteration give the values in the sweep's order (``indices[i]`` is the
    input place of ``result[i]``; the same when ``ordered=True``); a failed item raises its
    :class:`~clusterbook.errors.ItemFailedError` there. ``failed`` maps the input place of each
    failed item to its error, ``values(default)`` lists every value with ``default`` for the
    failed items, ``ok`` says whether all succeeded, ``check()`` raises
    :class:`~clusterbook.errors.SweepFailedError` naming all failed items if any.
    """

    def __init__(
        self, indices: Sequence[int], values: dict[int, Any], failed: dict[int, ItemFailedError]
    ) -> None:
        self.indices: tuple[int, ...] = tuple(indices)
        self._values = values
        self.failed: dict[int, ItemFailedError] = failed

    @property
    def ok(self) -> bool:
        """True when every item gave a value."""
        return not self.failed

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self._value(j) for j in self.indices[i]]
        return self._value(self.indices[i])

    def __iter__(self) -> Iterator[Any]:
        for index in self.indices:
            yield self._value(index)

    def _value(self, index: int) -> Any:
        if index in self.failed:
            raise self.failed[index]
        return self._values[index]

    def values(self, default: Any = None) -> list[Any]:
        """Every item's value in the sweep's order, ``default`` in place of a failed one."""
        return [self._values.get(i, default) for i in self.indices]

    def check(self) -> SweepResult:
        """This result, if every item succeeded; else :class:`SweepFailedError` naming them."""
        if self.failed:
            first = next(iter(self.failed.values()))
            names = ", ".join(str(i) for i in sorted(self.failed)[:10])
            more = "..." if len(self.failed) > 10 else ""
            raise SweepFailedError(
                f"{len(self.failed)} of {len(self)} items failed (items {names}{more}); "
                f"the values of the others are in the result (.values(), or .failed for the "
                f"errors). The first:\n{first}",
                failed=dict(self.failed),
            )
        return self

    def __repr__(self) -> str:
        text = f"SweepResult({len(self)} items: " + _SHORT.repr(self.values("<failed>"))
        if self.failed:
            text += f", {len(self.failed)} failed: " + ", ".join(
                f"{i} ({e.exception.__class__.__name__ if e.exception else 'error'})"
                for i, e in list(self.failed.items())[:3]
            )
            text += ", ..." if len(self.failed) > 3 else ""
        return text + ")"


def result_of(schedule: Schedule, *, ordered: bool) -> SweepResult:
    """The result of a finished ``schedule``, in input order or in the order items finished."""
    indices = range(schedule.count) if ordered else schedule.finish_order
    failed = {
        index: item_error(index, item, failure, runs)
        for index, (item, failure, runs) in sorted(schedule.failures.items())
    }
    return SweepResult(list(indices), schedule.values, failed)
