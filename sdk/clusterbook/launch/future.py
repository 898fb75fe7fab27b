"""A job as a future: the ``concurrent.futures.Future`` protocol, once, over a job's end.

:class:`JobFuture` gives a job ``done()``, ``running()``, ``cancel()``, ``cancelled()``,
``result(timeout)``, ``exception(timeout)``, ``add_done_callback(fn)`` and ``await job`` from
three things the job has: its :attr:`~JobFuture.outcome` (its ``JobResult`` once it has ended,
else None), ``wait(timeout)`` and ``_request_cancel()``. A job that runs an argv has its
``JobResult`` as its value (``result()`` raises :class:`~clusterbook.errors.JobFailedError`
for a failed one, as ``JobResult.check()`` does); a job that runs a function
(``Cluster.submit``) is given a reader (:meth:`JobFuture.bind_value`) that turns its end into
its value, the list of what each rank returned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

    from clusterbook.durations import Duration
    from clusterbook.launch.result import JobResult

__all__ = ["JobFuture", "ValueReader"]

_log = logging.getLogger("clusterbook.job")

# reader(outcome): the job's value from its JobResult, or the error result() raises.
ValueReader = Callable[["JobResult"], Any]


class JobFuture:
    """The ``concurrent.futures.Future`` protocol over a job's end (see the module)."""

    id: str
    _future_lock: threading.Lock
    _callbacks: list[Callable[[Any], object]]
    _watching: bool
    _reader: ValueReader | None
    _settled: tuple[bool, Any] | None  # (ok, value or error), once read

    def _init_future(self) -> None:
        self._future_lock = threading.Lock()
        self._callbacks = []
        self._watching = False
        self._reader = None
        self._settled = None

    # -- what the job provides -------------------------------------------------------------

    @property
    def outcome(self) -> JobResult | None:
        """The job's :class:`JobResult` once it has ended (every attempt), else None."""
        raise NotImplementedError

    def wait(self, timeout: Duration | None = None) -> JobResult:
        raise NotImplementedError

    def _request_cancel(self) -> None:
        """Ask for the job to stop (returns once it has ended)."""
        raise NotImplementedError

    # -- the protocol ----------------------------------------------------------------------

    def bind_value(self, reader: ValueReader) -> None:
        """Have :meth:`result` return ``reader(outcome)`` (read once, when first asked),
        instead of the :class:`JobResult`: how a function job gives what its ranks returned.
        ``reader`` raises for a job that failed."""
        with self._future_lock:
            self._reader = reader

    def done(self) -> bool:
        """Whether the job has ended (succeeded, failed, timed out or cancelled)."""
        return self.outcome is not None

    def running(self) -> bool:
        """Whether the job runs now (a job runs from its start until it has ended)."""
        return self.outcome is None

    def cancelled(self) -> bool:
        """Whether the job ended because it was cancelled."""
        outcome = self.outcome
        return outcome is not None and outcome.cancelled

    def cancel(self) -> bool:
        """Stop every process of the job (SIGTERM, then SIGKILL after a grace period; no retry
        follows) and return True once it has ended; False, doing nothing, for a job that had
        already ended (as ``Future.cancel``; a ``Job`` still ends what it kept, ``clean="none"``).
        ``outcome`` then says how it ended."""
        if self.outcome is not None:
            return False
        self._request_cancel()
        return True

    def result(self, timeout: Duration | None = None) -> Any:
        """Wait for the job (``timeout``: for this wait only, as ``wait``) and return its
        value: for a function job (``Cluster.submit``) the list of what each rank returned, by
        rank; for an argv job its :class:`JobResult`. A job that did not succeed raises
        :class:`~clusterbook.errors.JobFailedError` (a raising rank's traceback is its
        ``__cause__``); a wait that runs out, :class:`~clusterbook.errors.JobTimeoutError`."""
        ok, value = self._settle(timeout)
        if not ok:
            raise value
        return value

    def exception(self, timeout: Duration | None = None) -> BaseException | None:
        """Wait for the job as :meth:`result` does and return the error it would raise, or
        None for a job that succeeded."""
        ok, value = self._settle(timeout)
        return None if ok else value

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        """Call ``fn(job)`` once the job has ended: at once (in this thread) when it has, else
        in a thread of the job's. An error in ``fn`` is logged and ignored, as ``Future``
        does."""
        with self._future_lock:
            if self.outcome is None:
                self._callbacks.append(fn)
                if not self._watching:
                    self._watching = True
                    name = f"clusterbook-{self.id}-callbacks"
                    threading.Thread(target=self._watch, name=name, daemon=True).start()
                return
        self._call(fn)

    def __await__(self) -> Generator[Any, None, Any]:
        """``await job``: the job's :meth:`result`, without blocking the event loop."""
        import asyncio  # only where a loop runs: a rank's or an agent's process never needs it

        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()

        def settle(_: object) -> None:
            ok, value = self._settle(None)
            loop.call_soon_threadsafe(_resolve, waiter, ok, value)

        self.add_done_callback(settle)
        return waiter.__await__()

    # -- internals -------------------------------------------------------------------------

    def _settle(self, timeout: Duration | None) -> tuple[bool, Any]:
        """(True, value) or (False, the error :meth:`result` raises), read once."""
        outcome = self.wait(timeout)
        with self._future_lock:
            if self._settled is None:
                self._settled = _read(outcome, self._reader)
            return self._settled

    def _watch(self) -> None:
        self.wait()
        with self._future_lock:
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            self._call(fn)

    def _call(self, fn: Callable[[Any], object]) -> None:
        try:
            fn(self)
        except Exception:
            _log.exception("A done callback of job %s failed.", self.id)


def _read(outcome: JobResult, reader: ValueReader | None) -> tuple[bool, Any]:
    try:
        return True, outcome.check() if reader is None else reader(outcome)
    except Exception as exc:
        return False, exc


def _resolve(waiter: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if waiter.done():  # the awaiting task was cancelled meanwhile
        return
    if ok:
        waiter.set_result(value)
    else:
        waiter.set_exception(value)
