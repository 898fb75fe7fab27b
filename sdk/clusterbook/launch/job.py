"""An MPI job: its attempts (one, or more when it is retried), its deadline and its end.

The first attempt runs in the job's directory (``RUN_DIR/jobs/job-0001``); a retry runs in
``attempt-2/``, ``attempt-3/``, ... under it, with its own per-rank logs. What to do when an
attempt ends is decided by :func:`~clusterbook.launch.recovery.next_step`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from clusterbook.durations import Duration
from clusterbook.errors import ClusterError, JobTimeoutError
from clusterbook.launch.attempt import Attempt
from clusterbook.launch.command import LaunchPlan
from clusterbook.launch.ending import final_result
from clusterbook.launch.future import JobFuture
from clusterbook.launch.jobdir import attempt_dir, write_result
from clusterbook.launch.logs import LogRecord, records_frame
from clusterbook.launch.recovery import (
    NO_RECOVERY,
    Recovery,
    Stop,
    grown_restart,
    next_step,
    outcome,
    reason,
)
from clusterbook.launch.result import AttemptInfo, JobResult
from clusterbook.spec import validate_timeout
from clusterbook.waiting import wait_until

if TYPE_CHECKING:
    import pandas as pd

    from clusterbook.launch.saved import SavedJob

__all__ = ["Job"]

_log = logging.getLogger("clusterbook.job")

# start(n, directory, restarts, restart): attempt n in directory, restarts so far, is a restart
StartAttempt = Callable[[int, Path, int, bool], Attempt]


class Job(JobFuture):
    """An MPI job started by ``cluster.mpirun``.

    Output of every rank is parsed into records as it arrives, appended to ``rank-N.log`` in
    the attempt's directory, kept in a bounded buffer (:meth:`logs`) and streamed
    (:meth:`stream`). A job with ``retries`` runs again after a failure (see
    :class:`~clusterbook.launch.recovery.Recovery`); ``cancel()`` ends the whole series. A
    future (:class:`~clusterbook.launch.future.JobFuture`): ``result()``, ``await job``, ...
    """

    def __init__(
        self,
        job_id: str,
        directory: Path,
        start: StartAttempt,
        recovery: Recovery = NO_RECOVERY,
        *,
        argv: list[str],
        timeout: float | None,
        on_done: Callable[[JobResult], None] | None = None,
        on_attempt: Callable[[int], None] | None = None,
    ) -> None:
        self._init_future()
        self.id = job_id
        self.directory = directory
        self.argv = list(argv)
        self.label: str | None = None  # the name tables show it under ("ipyparallel engines")
        self.timeout = timeout
        self.recovery = recovery
        self._start = start
        self._on_done = on_done
        self._on_attempt = on_attempt
        self._cond = threading.Condition()
        self._wake = threading.Event()  # ends a delay before a retry
        self._cancelled = False
        self._restarts = 0
        self._joined: str | None = None  # why the current attempt is stopped for a restart
        self._deadline_passed = False
        self._ended: list[AttemptInfo] = []
        self._retry_at: float | None = None  # monotonic time of the next attempt, in a delay
        self._result: JobResult | None = None
        self._done = threading.Event()
        self.started = time.time()
        self._t0 = time.monotonic()
        self._attempts = [start(1, directory, 0, False)]  # raises if it cannot start: nothing ran
        self._timer: threading.Timer | None = None
        if recovery.deadline is not None:
            self._timer = threading.Timer(recovery.deadline, self._at_deadline)
            self._timer.daemon = True
            self._timer.start()
        threading.Thread(target=self._run, name=f"clusterbook-{job_id}-series", daemon=True).start()

    @staticmethod
    def load(directory: str | os.PathLike[str]) -> SavedJob:
        """A job read from its directory (``RUN_DIR/jobs/job-0001``) by any process, any time:
        its logs and result (another directory: :class:`~clusterbook.errors.RecordError`)."""
        from clusterbook.launch.saved import SavedJob

        return SavedJob(directory)

    @property
    def _current(self) -> Attempt:
        with self._cond:
            return self._attempts[-1]

    @property
    def attempt(self) -> int:
        """The number of the attempt running now, or of the last one (1: the first)."""
        return self._current.number

    @property
    def last_reason(self) -> str | None:
        """How the attempt before the current one ended ("rank 3 exited 1"), or None."""
        with self._cond:
            number = self._attempts[-1].number
            return self._ended[number - 2].reason if number > 1 else None

    @property
    def restarts(self) -> int:
        """How many times the job was relaunched on the nodes left after one was lost."""
        return self._restarts

    @property
    def retrying_in(self) -> float | None:
        """Seconds until the next attempt starts while the job waits before a retry, or None."""
        at = self._retry_at
        return None if at is None else max(0.0, at - time.monotonic())

    @property
    def plan(self) -> LaunchPlan:
        """The launch plan of the current attempt."""
        return self._current.plan

    @property
    def np(self) -> int:
        """Ranks of the current attempt."""
        return self._current.np

    @property
    def launcher(self) -> str:
        """The path of the MPI launcher (mpirun / mpiexec) that runs it."""
        return self._current.plan.launcher.path

    @property
    def pid(self) -> int:
        """Process id of the current attempt's launcher (mpirun / mpiexec)."""
        return self._current.pid

    @property
    def ranks_started(self) -> int:
        """How many ranks of the current attempt have reported their start so far."""
        return len(self._current.store.started)

    @property
    def ranks_ended(self) -> int:
        """How many ranks of the current attempt have reported their exit so far."""
        return len(self._current.store.exit_codes)

    @property
    def outcome(self) -> JobResult | None:
        """The :class:`JobResult` once the job has ended (every attempt), else None."""
        return self._result

    @property
    def error(self) -> ClusterError | None:
        """Why clusterbook stopped the current attempt itself (see :meth:`fail`), if it did."""
        return self._current.error

    def wait(self, timeout: Duration | None = None) -> JobResult:
        """Wait for the job to end and return its :class:`JobResult`.

        ``timeout`` bounds this wait only: when it passes, :class:`JobTimeoutError` is raised
        and the job goes on (use the job's own ``timeout=`` to stop it). An interrupt
        (Ctrl-C, a notebook's stop button) cancels the job before it propagates; in a
        notebook, its widgets' buttons act meanwhile (:mod:`clusterbook.waiting`)."""
        limit = validate_timeout(timeout)
        try:
            if not wait_until(self._done.wait, limit):
                raise JobTimeoutError(
                    f"Job {self.id} is still running after waiting {limit:g} s; wait longer, "
                    "or call job.cancel() to stop it.",
                    timeout=limit or 0.0,
                )
        except KeyboardInterrupt:
            self.cancel()
            raise
        assert self._result is not None
        return self._result

    def cancel(self) -> bool:
        """As :meth:`JobFuture.cancel`; what the job kept (``clean="none"``) is ended too."""
        if super().cancel():
            return True
        self.cleanup()
        return False

    def _request_cancel(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after a grace); no retry follows."""
        with self._cond:
            self._cancelled = True
            current = self._attempts[-1]
        self._wake.set()
        current.stop("cancel")
        self._done.wait()
        self.cleanup()

    def restart_if_grown(self, joined: list[str]) -> bool:
        """With ``restart_on_join`` and a restart left: stop the current attempt because the
        nodes ``joined`` the cluster's round, for a restart on the larger one; whether it did."""
        with self._cond:
            busy = self._joined is not None or self._cancelled or self._done.is_set()
            why = grown_restart(self.recovery, joined, restarts=self._restarts, busy=busy)
            if why is None:
                return False
            self._joined, current = why, self._attempts[-1]
        threading.Thread(
            target=current.stop, args=("cancel",), name=f"clusterbook-{self.id}-grown"
        ).start()
        return True

    def cleanup(self) -> None:
        """End the processes a failed job kept stopped for inspection (``clean="none"``,
        ``result.kept``) at once (SIGKILL), and return once gone; a running job goes on."""
        with self._cond:
            attempts = list(self._attempts)
        for attempt in attempts:
            attempt.cleanup()

    def fail(self, error: ClusterError) -> None:
        """Stop the current attempt because of ``error`` (its logs cannot be written, a node it
        runs on was lost, ...): its result is failed with that error. Returns at once."""
        self._current.fail(error)

    def logs(self, rank: int | None = None) -> pd.DataFrame:
        """Output so far as a DataFrame (time, rank, host, stream, line, partial, attempt);
        launcher lines have rank -1; a line over 1 MiB comes in pieces, all but its last
        ``partial``. Older lines than the buffer holds are in the job directory's files."""
        return records_frame(self._records(rank))

    def _records(self, rank: int | None = None) -> list[LogRecord]:
        with self._cond:
            attempts = list(self._attempts)
        records = [r for a in attempts for r in a.store.records()]
        return records if rank is None else [r for r in records if r.rank == rank]

    def stream(self, *, from_start: bool = True) -> Iterator[LogRecord]:
        """Yield output records live, attempt after attempt, until the job has ended and all
        output is read (``from_start=False``: from now on)."""
        with self._cond:
            index = 0 if from_start else len(self._attempts) - 1
        fresh = from_start
        while True:
            with self._cond:
                attempt = self._attempts[index]
            yield from attempt.store.stream(from_start=fresh)
            fresh = True
            with self._cond:
                while len(self._attempts) <= index + 1 and not self.done():
                    self._cond.wait()
                if len(self._attempts) <= index + 1:
                    return
            index += 1

    def _repr_html_(self) -> str:
        """In a notebook: the job's row (state, ranks, time) and its last lines, as they are
        now (a saved notebook keeps them)."""
        from clusterbook.launch.jobstatus import job_status
        from clusterbook.views.html import render_job, render_timeline

        page, r = render_job(job_status(self), self._records()[-20:]), self._result
        return page + (render_timeline(r.rank_times, r.rank_exit_codes) if r else "")

    def __repr__(self) -> str:
        result = self._result
        state = "running" if result is None else ("ok" if result.ok else "failed")
        tried = f" attempt={self.attempt}" if self.attempt > 1 else ""
        return f"<Job {self.id} np={self.np} {state}{tried} argv={self.argv!r}>"

    # -- internals ------------------------------------------------------------------------

    def _at_deadline(self) -> None:
        with self._cond:
            if self._done.is_set():
                return
            self._deadline_passed = True
            current = self._attempts[-1]
        self._wake.set()
        current.stop("timeout")  # Python ranks dump their stacks first

    def _run(self) -> None:
        last: JobResult | None = None
        why: str | None = None
        try:
            while True:
                attempt = self._current
                last = attempt.wait()
                assert last is not None
                kind, words = outcome(last, attempt.error), reason(last, attempt.error)
                with self._cond:
                    if self._joined is not None and kind == "cancelled" and not self._cancelled:
                        kind, words = "node-joined", self._joined  # stopped for a restart
                    self._joined = None
                ranks = tuple(last.failed_ranks)
                ended = AttemptInfo(
                    attempt.number, kind, words, attempt.started, last.duration, ranks
                )
                if attempt.number > 1:
                    write_result(attempt.directory, last)
                with self._cond:
                    self._ended.append(ended)
                    stopped = self._cancelled or self._deadline_passed
                elapsed = time.monotonic() - self._t0
                step = next_step(
                    self.recovery,
                    attempt.number,
                    ended.outcome,
                    elapsed,
                    restarts=self._restarts,
                    cancelled=stopped,
                )
                if isinstance(step, Stop):
                    why = step.why
                    if step.deadline:
                        with self._cond:
                            self._deadline_passed = True
                    return
                attempt.cleanup()  # what it kept (clean="none") goes before the next one
                said = (self.id, ended.reason, step.attempt, step.delay)
                _log.info("Job %s: %s; attempt %d in %g s.", *said)
                self._retry_at = time.monotonic() + step.delay
                try:
                    if self._wake.wait(step.delay):
                        return  # cancelled, or the deadline passed, before the retry
                finally:
                    self._retry_at = None
                restarts = self._restarts + step.restart
                folder = attempt_dir(self.directory, step.attempt)
                try:
                    following = self._start(step.attempt, folder, restarts, step.restart)
                except ClusterError as exc:
                    why = f"Attempt {step.attempt} could not start: {exc}"
                    return
                with self._cond:
                    self._attempts.append(following)
                    self._restarts = restarts
                    stopped = self._cancelled or self._deadline_passed
                    self._cond.notify_all()
                if stopped:  # cancel() or the deadline came while it was starting
                    following.stop("cancel" if self._cancelled else "timeout")
                if self._on_attempt is not None:
                    self._on_attempt(step.attempt)
        except Exception as exc:
            _log.exception("The supervisor of job %s failed.", self.id)
            why = f"{type(exc).__name__}: {exc}"
        finally:
            self._finish(last, why)

    def _finish(self, last: JobResult | None, why: str | None) -> None:
        """Mark the job done with its result, whatever happened before: ``wait()``,
        ``cancel()`` and the cluster's ``stop()`` must return."""
        if self._timer is not None:
            self._timer.cancel()
        attempt = self._current
        if last is None:  # the supervisor failed before the attempt ended
            attempt.stop("cancel")
            last = attempt.wait() or JobResult(self.id, -1, {}, (), 0.0, attempt=attempt.number)
        with self._cond:
            result = final_result(
                last,
                job_id=self.id,
                duration=time.monotonic() - self._t0,
                why=why,
                attempt=attempt.number,
                attempts=tuple(self._ended),
                restarts=self._restarts,
                cancelled=self._cancelled,
                deadline=self._deadline_passed,
            )
        if attempt.store.write_error is None:
            write_result(self.directory, result)
        with self._cond:
            self._result = result
            self._done.set()
            self._cond.notify_all()
        if self._on_done is not None:
            try:
                self._on_done(result)
            except Exception:
                _log.exception("A callback on the end of job %s failed.", self.id)
