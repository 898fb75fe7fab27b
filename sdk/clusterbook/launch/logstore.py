"""Where a job's output goes: per-rank files written as records arrive, a bounded buffer and
live readers (:class:`LogStore`), and the bound the buffers of a cluster's jobs share
(:class:`LogBudget`).

Files (see :mod:`clusterbook.launch.logs` for their lines) are flushed as lines arrive, so a
dead kernel or a killed rank leaves every line that arrived readable. Lines that arrived
together are stored together: one time (when they arrived), one write, one wake-up of the
readers, one entry in the buffer (:mod:`clusterbook.launch.logbuffer`; their records are made
when read). When a file cannot be written (a full disk), the store stops writing, keeps what comes
in memory (bounded) and tells its listener, which stops the job with that error.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from clusterbook.errors import RunDirError
from clusterbook.launch.logbuffer import RecordBuffer, records_of
from clusterbook.launch.logs import LAUNCHER_RANK, LogRecord, format_log_lines, read_log_file
from clusterbook.launch.rankwrap import MARK, parse_marker

__all__ = ["LogBudget", "LogStore"]

_TAIL_CHARS = 2000  # of each line kept for failure reports
_NONE: frozenset[int] = frozenset()
_FIRST = frozenset({0})


class LogBudget:
    """What the log buffers of a cluster's jobs may hold in memory together: at most
    ``max_records`` records and ``max_bytes`` characters of text. Past that, the buffers of
    ended jobs are let go, oldest first; their lines are read back from their files when
    asked for. (Each job's own buffer is bounded too, running or not.)"""

    def __init__(self, max_records: int = 200_000, max_bytes: int = 128 << 20) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._stores: list[LogStore] = []
        self._lock = threading.Lock()

    def add(self, store: LogStore) -> None:
        with self._lock:
            self._stores.append(store)

    def settle(self) -> None:
        """Let go of the buffers of ended jobs, oldest first, until the rest fit."""
        with self._lock:
            records = sum(s.held[0] for s in self._stores)
            size = sum(s.held[1] for s in self._stores)
            for store in list(self._stores):
                if records <= self.max_records and size <= self.max_bytes:
                    break
                if store.closed:
                    held = store.held
                    store.release()
                    records, size = records - held[0], size - held[1]
                    self._stores.remove(store)

    @property
    def held(self) -> tuple[int, int]:
        """Records and characters the buffers hold now."""
        with self._lock:
            stores = list(self._stores)
        return sum(s.held[0] for s in stores), sum(s.held[1] for s in stores)


class LogStore:
    """Where a job's output goes: files, a bounded in-memory buffer, and live readers.

    Also keeps what the rank wrapper reports (host, pid, exit code per rank) and the last lines
    of every rank, so a failure report has them even when the buffer has moved on. The buffer
    holds at most ``max_records`` records and ``max_bytes`` characters of text.
    """

    def __init__(
        self,
        directory: Path,
        hosts: dict[int, str],
        *,
        launcher_host: str,
        attempt: int = 1,
        max_records: int = 100_000,
        max_bytes: int = 64 << 20,
        tail_lines: int = 40,
        clock: Callable[[], float] = time.time,
        budget: LogBudget | None = None,
    ) -> None:
        self.directory = directory
        self.hosts = dict(hosts)
        self.pids: dict[int, int] = {}
        self.exit_codes: dict[int, int] = {}
        self.exit_order: list[int] = []
        # When each rank's start and exit were reported (epoch seconds): its timeline.
        self.started: dict[int, float] = {}
        self.ended: dict[int, float] = {}
        self.write_error: RunDirError | None = None
        self._last_output = time.monotonic()
        self._launcher_host = launcher_host
        self.attempt = attempt
        self._clock = clock
        self._buffer = RecordBuffer(max_records, max_bytes)
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._tails: dict[int, deque[str]] = {}
        self._tail_lines = tail_lines
        self._files: dict[int, IO[str]] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._exit_listeners: list[Callable[[int, int], None]] = []
        self._error_listeners: list[Callable[[RunDirError], None]] = []
        self._released = False  # the buffer was let go (see LogBudget): read the files
        self._budget = budget
        if budget is not None:
            budget.add(self)

    # -- writing ---------------------------------------------------------------------------

    def on_exit(self, callback: Callable[[int, int], None]) -> None:
        """Call ``callback(rank, code)`` when a rank reports its exit."""
        self._exit_listeners.append(callback)

    def on_write_error(self, callback: Callable[[RunDirError], None]) -> None:
        """Call ``callback(error)`` once, when a file cannot be written (records go on in
        memory)."""
        self._error_listeners.append(callback)

    def add(self, rank: int | None, stream: str | None, text: str, partial: bool = False) -> None:
        """Record a line of ``rank`` (None: the launcher) on ``stream``; ``partial``: a
        piece of a longer line, which goes on in the next record."""
        self.add_lines(rank, stream, [text], _FIRST if partial else _NONE)

    def add_lines(
        self,
        rank: int | None,
        stream: str | None,
        texts: list[str],
        partial: frozenset[int] = frozenset(),
    ) -> None:
        """Record lines of ``rank`` (None: the launcher) on ``stream`` that arrived together:
        one time, one write to the file, one wake-up of the readers. ``partial``: the
        indexes of pieces of longer lines, which go on in the next record."""
        rank = LAUNCHER_RANK if rank is None else rank
        stream = stream or "stderr"
        exited: list[tuple[int, int]] = []
        if stream == "stderr" and rank != LAUNCHER_RANK and any(MARK in t for t in texts):
            texts, partial = self._markers(rank, texts, partial, exited)
        if texts:
            self._store(rank, stream, texts, partial)
        for code in exited:
            self._notify_exit(*code)

    def _markers(
        self, rank: int, texts: list[str], partial: frozenset[int], exited: list[tuple[int, int]]
    ) -> tuple[list[str], frozenset[int]]:
        """``texts`` without the rank wrapper's markers (what they report is kept: the rank's
        host, pid, start, exit code) nor the lines that held nothing else."""
        kept: list[str] = []
        kept_partial: set[int] = set()
        for i, text in enumerate(texts):
            if i not in partial:
                text, marker = parse_marker(text)
                if marker is not None:
                    if marker.kind == "start":
                        self.hosts[rank] = marker.host or self.hosts.get(rank, "?")
                        self.started.setdefault(rank, self._clock())
                        if marker.pid is not None:
                            self.pids[rank] = marker.pid
                    elif rank not in self.exit_codes and marker.code is not None:
                        self.exit_codes[rank] = marker.code
                        self.exit_order.append(rank)
                        self.ended[rank] = self._clock()
                        exited.append((rank, marker.code))
                    if not text:
                        continue
            else:
                kept_partial.add(len(kept))
            kept.append(text)
        return kept, frozenset(kept_partial)

    def last_output(self) -> float:
        """When (``time.monotonic()``) the last output came (the store's making, before any)."""
        return self._last_output

    def _store(self, rank: int, stream: str, texts: list[str], partial: frozenset[int]) -> None:
        now = self._clock()
        self._last_output = time.monotonic()
        host = self._launcher_host if rank == LAUNCHER_RANK else self.hosts.get(rank, "?")
        failed = None
        with self._cond:
            if self._closed:
                return
            if self.write_error is None:
                failed = self._write(rank, stream, now, texts, partial)
            # Kept as the batch it is: its records are made when read (see logbuffer).
            self._buffer.add(now, rank, host, stream, texts, partial, self.attempt)
            tail = self._tails.get(rank)
            if tail is None:
                tail = self._tails[rank] = deque(maxlen=self._tail_lines)
            tail.extend(
                t if len(t) <= _TAIL_CHARS else t[: _TAIL_CHARS - 1] + "\u2026"
                for t in texts[-self._tail_lines :]
            )
            self._cond.notify_all()
        if failed is not None:
            for listener in self._error_listeners:
                listener(failed)
        if self._budget is not None:
            self._budget.settle()

    def _notify_exit(self, rank: int, code: int) -> None:
        for callback in self._exit_listeners:
            callback(rank, code)

    def _write(
        self, rank: int, stream: str, now: float, texts: list[str], partial: frozenset[int]
    ) -> RunDirError | None:
        """Append lines to their rank's file, in one write, flushed; on failure, stop
        writing and return the error."""
        name = "launcher.log" if rank == LAUNCHER_RANK else f"rank-{rank}.log"
        data = format_log_lines(now, stream, texts, partial)
        try:
            f = self._files.get(rank)
            if f is None:
                f = self._files[rank] = open(  # noqa: SIM115 - closed in close()
                    self.directory / name,
                    "a",
                    encoding="utf-8",
                    errors="replace",
                    newline="\n",
                )
            f.write(data)
            f.flush()
        except OSError as exc:
            self.write_error = RunDirError.from_os_error(self.directory / name, exc)
            self._close_files()
            return self.write_error
        return None

    def _close_files(self) -> None:
        for f in self._files.values():
            try:
                f.close()
            except OSError as exc:  # the last buffered bytes did not fit either
                if self.write_error is None:
                    self.write_error = RunDirError.from_os_error(Path(f.name), exc)
        self._files.clear()

    def close(self) -> None:
        """Stop accepting records, close the files and wake every live reader."""
        with self._cond:
            self._closed = True
            self._close_files()
            self._cond.notify_all()

    # -- reading ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def held(self) -> tuple[int, int]:
        """Records and characters the buffer holds now."""
        return self._buffer.count, self._buffer.size

    def release(self) -> None:
        """Let go of the buffer of an ended job: :meth:`records` reads the files instead."""
        with self._cond:
            if not self._closed:
                return
            self._released = True
            self._buffer.clear()

    def records(self) -> list[LogRecord]:
        """The records still in the buffer, oldest first (once the buffer was let go, the
        newest the buffer would hold, read from the files)."""
        with self._cond:
            released = self._released
            batches = self._buffer.since(0)
        return self._from_files() if released else records_of(batches)

    def _from_files(self) -> list[LogRecord]:
        found: list[LogRecord] = []
        for path in sorted(self.directory.glob("*.log")):
            name = path.name.removesuffix(".log")
            if name == "launcher":
                rank, host = LAUNCHER_RANK, self._launcher_host
            elif name.startswith("rank-") and name[5:].isdigit():
                rank = int(name[5:])
                host = self.hosts.get(rank, "?")
            else:
                continue
            try:
                found += read_log_file(path, rank, host, self.attempt)
            except OSError:
                continue
        found.sort(key=lambda r: r.time)  # stable: each file's order stays
        kept: deque[LogRecord] = deque()
        size = 0
        for record in reversed(found):
            if len(kept) >= self._max_records or (
                kept and size + len(record.line) > self._max_bytes
            ):
                break
            kept.appendleft(record)
            size += len(record.line)
        return list(kept)

    def tail(self, rank: int) -> list[str]:
        """The last lines ``rank`` wrote (stdout and stderr)."""
        with self._cond:
            return list(self._tails.get(rank, ()))

    def stream(self, *, from_start: bool = True) -> Iterator[LogRecord]:
        """Yield records as they arrive until the store is closed.

        Records that fall out of the bounded buffer before a slow reader gets to them are
        skipped here (they are in the files).
        """
        with self._cond:
            released = self._released
            cursor = self._buffer.seq - (self._buffer.count if from_start else 0)
        if released:  # an ended job's, from its files
            if from_start:
                yield from self._from_files()
            return
        while True:
            with self._cond:
                while cursor >= self._buffer.seq and not self._closed:
                    self._cond.wait()
                batches = self._buffer.since(cursor)  # from the oldest kept, if it moved on
                cursor = self._buffer.seq
                done = self._closed
            batch = records_of(batches)  # made outside the lock: the writer goes on
            yield from batch
            if done and not batch:
                return

    def wait_closed(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._closed, timeout)
