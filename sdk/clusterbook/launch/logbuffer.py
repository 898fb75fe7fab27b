"""The bounded in-memory buffer of a job's records, kept as the batches they arrived in.

A rank that prints a million lines gives the head a million lines to keep, and most of them
are never read record by record (they are in the files; the buffer keeps the newest for
``job.logs()`` and live readers). So the buffer holds each batch (the lines one read
completed: one time, rank, host, stream) as it came, and makes its :class:`LogRecord`\\ s only
when they are read: storing costs a few operations a batch, not an object a line. The bound
(records and characters) lets go of the oldest batches whole, and cuts the oldest one short
when only part of it must go.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from itertools import accumulate
from typing import NamedTuple

from clusterbook.launch.logs import LogRecord

__all__ = ["Batch", "RecordBuffer"]

_make = tuple.__new__  # a LogRecord from its fields without NamedTuple's Python-level __new__


class Batch(NamedTuple):
    """Lines of one rank on one stream that arrived together: the records they stand for."""

    seq: int  # the number of the first record (records ever added before it)
    time: float
    rank: int
    host: str
    stream: str
    texts: list[str]
    partial: frozenset[int]
    attempt: int
    size: int  # characters of text

    def records(self) -> list[LogRecord]:
        """The records of this batch's lines."""
        now, rank, host, stream = self.time, self.rank, self.host, self.stream
        attempt, partial = self.attempt, self.partial
        if partial:
            return [
                _make(LogRecord, (now, rank, host, stream, t, i in partial, attempt))
                for i, t in enumerate(self.texts)
            ]
        return [_make(LogRecord, (now, rank, host, stream, t, False, attempt)) for t in self.texts]

    def cut(self, count: int) -> Batch:
        """This batch without its first ``count`` records."""
        texts = self.texts[count:]
        partial = frozenset(i - count for i in self.partial if i >= count)
        size = self.size - sum(map(len, self.texts[:count]))
        return self._replace(seq=self.seq + count, texts=texts, partial=partial, size=size)


class RecordBuffer:
    """The newest records, at most ``max_records`` of them and ``max_bytes`` characters of
    text (always the newest record, however long); not thread-safe (the store locks it)."""

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._batches: deque[Batch] = deque()
        self.count = 0  # records held
        self.size = 0  # characters held
        self.seq = 0  # records ever added

    def add(
        self,
        now: float,
        rank: int,
        host: str,
        stream: str,
        texts: list[str],
        partial: frozenset[int],
        attempt: int,
    ) -> None:
        """Keep lines that arrived together (``texts`` is kept, not copied), then let go of
        the oldest records past the bound."""
        size = sum(map(len, texts))
        self._batches.append(
            Batch(self.seq, now, rank, host, stream, texts, partial, attempt, size)
        )
        self.seq += len(texts)
        self.count += len(texts)
        self.size += size
        self._trim()

    def _trim(self) -> None:
        batches = self._batches
        while batches:
            excess = self.count - self._max_records
            over = self.size - self._max_bytes
            if excess <= 0 and (over <= 0 or self.count <= 1):
                return
            oldest = batches[0]
            n = len(oldest.texts)
            drop = max(excess, 0)
            if over > oldest.size:
                drop = n
            elif over > 0:  # the fewest oldest lines whose text makes up what is over
                drop = max(drop, bisect_left(list(accumulate(map(len, oldest.texts))), over) + 1)
            if n == self.count:  # the newest record stays, however long
                drop = min(drop, n - 1)
            if drop <= 0:
                return
            if drop >= n:
                batches.popleft()
                self.count -= n
                self.size -= oldest.size
                continue
            rest = oldest.cut(drop)
            batches[0] = rest
            self.count -= drop
            self.size -= oldest.size - rest.size

    def clear(self) -> None:
        """Let go of every record (the count of records ever added stays)."""
        self._batches = deque()
        self.count = 0
        self.size = 0

    def since(self, cursor: int) -> list[Batch]:
        """The batches holding records number ``cursor`` on, the first cut to start there."""
        found: list[Batch] = []
        for batch in reversed(self._batches):
            if batch.seq + len(batch.texts) <= cursor:
                break
            found.append(batch)
        found.reverse()
        if found and found[0].seq < cursor:
            found[0] = found[0].cut(cursor - found[0].seq)
        return found


def records_of(batches: list[Batch]) -> list[LogRecord]:
    """The records of ``batches``, in order."""
    out: list[LogRecord] = []
    for batch in batches:
        out += batch.records()
    return out
