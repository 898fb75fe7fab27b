"""One series of a node's resource samples, bounded, in arrays of floats.

A head keeps ten minutes of a sample a second for every node (:mod:`clusterbook.resources`):
at 1,024 nodes that is 600,000 samples. As Python objects (a dataclass of four floats) they
took 75 MB; here a sample is four C doubles, 32 bytes (a value not known is NaN), and a window
is found by bisection instead of a walk.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

__all__ = ["Columns", "Ring", "Sample", "columns_of"]

#: A series as four columns of floats: times, CPU, memory in use, GPU (NaN: not known).
Columns: TypeAlias = "tuple[array[float], array[float], array[float], array[float]]"


@dataclass(frozen=True, slots=True)
class Sample:
    """One report of a node: when (``t``, unix seconds), its CPU use (percent of its cores),
    memory in use (GiB) and GPU use (percent, the mean of its GPUs); None where unknown."""

    t: float
    cpu: float | None
    memory_used_gib: float | None
    gpu: float | None


def _stored(value: float | None) -> float:
    return math.nan if value is None else value


def _read(value: float) -> float | None:
    return None if value != value else value  # NaN: not known


def columns_of(samples: Sequence[Sample]) -> Columns:
    """``samples`` as columns."""
    return (
        array("d", (s.t for s in samples)),
        array("d", (_stored(s.cpu) for s in samples)),
        array("d", (_stored(s.memory_used_gib) for s in samples)),
        array("d", (_stored(s.gpu) for s in samples)),
    )


class Ring:
    """The newest ``keep`` samples at most, oldest first, their times rising."""

    __slots__ = ("_columns", "_keep")

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._columns = (array("d"), array("d"), array("d"), array("d"))  # t, cpu, used, gpu

    def __len__(self) -> int:
        return len(self._columns[0])

    def last(self) -> Sample:
        t, cpu, used, gpu = (c[-1] for c in self._columns)
        return Sample(t, _read(cpu), _read(used), _read(gpu))

    def append(self, sample: Sample, *, replace: bool = False) -> None:
        """Add ``sample`` as the newest (``replace``: instead of the newest)."""
        values = (sample.t, _stored(sample.cpu), _stored(sample.memory_used_gib))
        for column, value in zip(self._columns, (*values, _stored(sample.gpu)), strict=True):
            if replace:
                column[-1] = value
            else:
                column.append(value)
        if len(self) >= 2 * self._keep:  # drop the oldest in bulk: a move per keep samples
            for column in self._columns:
                del column[: len(column) - self._keep]

    def drop_before(self, t: float) -> None:
        """Forget the samples older than ``t``."""
        cut = bisect_left(self._columns[0], t)
        if cut:
            for column in self._columns:
                del column[:cut]

    def columns(self, t: float) -> Columns:
        """The samples at or after ``t`` (at most ``keep``) as columns: copies made in C, no
        object a sample (a whole history is answered this way)."""
        times = self._columns[0]
        start = max(bisect_left(times, t), len(times) - self._keep)
        a, b, c, d = (column[start:] for column in self._columns)
        return a, b, c, d

    def since(self, t: float) -> list[Sample]:
        """The samples at or after ``t`` (at most ``keep``), oldest first."""
        times, cpu, used, gpu = self._columns
        start = max(bisect_left(times, t), len(times) - self._keep)
        return [
            Sample(times[i], _read(cpu[i]), _read(used[i]), _read(gpu[i]))
            for i in range(start, len(times))
        ]
