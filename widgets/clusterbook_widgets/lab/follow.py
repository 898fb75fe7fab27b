"""A job's log lines by position, for readers that poll: ``logs?after=N`` answers the lines
from position N on and the next position.

A position is a line's place in the order the server read the lines (arrival order, as
:meth:`~clusterbook.launch.saved.SavedJob.read_new` gives them), which never changes once
given: lines are only appended. The lines are kept in a bounded window (the newest
:data:`KEEP`); a reader behind it gets the window's first line on and is told how many it
missed.
"""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from clusterbook.launch.logs import LogRecord
from clusterbook.launch.result import JobResult
from clusterbook_widgets.lab.listing import lines_json

__all__ = ["KEEP", "PAGE", "LogCursor"]

#: Lines kept per job (older ones are read again from the job's files by the log viewer).
KEEP = 50_000
#: Most lines in one answer.
PAGE = 2_000


class _Job(Protocol):
    @property
    def outcome(self) -> JobResult | None: ...

    def read_new(self, offsets: dict[Path, int]) -> list[LogRecord]: ...


class LogCursor:
    """The lines of one job read so far, by position (see the module's docstring)."""

    def __init__(self, job: _Job, *, keep: int = KEEP) -> None:
        self._job = job
        self._offsets: dict[Path, int] = {}
        self._lines: deque[LogRecord] = deque(maxlen=keep)
        self._total = 0  # lines read in all: the next position
        self._ended = False
        self._lock = threading.Lock()

    def page(self, after: int, limit: int = PAGE) -> dict[str, Any]:
        """The lines from position ``after`` on (at most ``limit``), read from the job's
        files first; ``next`` is where the next request starts, ``missed`` how many lines
        before the first one returned are no longer kept, ``ended`` whether the job has
        ended and every line of it is in."""
        with self._lock:
            if not self._ended:
                ended = self._job.outcome is not None  # before reading: no line is missed
                new = self._job.read_new(self._offsets)
                self._lines.extend(new)
                self._total += len(new)
                self._ended = ended
            first_kept = self._total - len(self._lines)
            start = min(max(after, first_kept), self._total)
            end = min(start + max(limit, 0), self._total)
            chosen = [self._lines[i - first_kept] for i in range(start, end)]
            return {
                "lines": lines_json(chosen, start),
                "next": end,
                "missed": start - min(after, self._total),
                "ended": self._ended and end == self._total,
            }
