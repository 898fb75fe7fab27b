"""One run of an MPI job: the launcher process, its output readers, its timeout and its end.

A :class:`~clusterbook.launch.job.Job` is one attempt, or several when it is retried or
restarted; each attempt has its own directory, logs and result.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from clusterbook.errors import ClusterError, NodeLostError
from clusterbook.launch import keep
from clusterbook.launch import proc as procs
from clusterbook.launch.command import LaunchCommand, LaunchPlan, placement
from clusterbook.launch.ending import attempt_result, name_kept, ranks_first
from clusterbook.launch.guard import guard, kill_tagged
from clusterbook.launch.jobdir import write_attempt_files
from clusterbook.launch.linger import LINGER, QUIET, linger
from clusterbook.launch.logstore import LogStore
from clusterbook.launch.readers import start_readers
from clusterbook.launch.result import JobResult, KeptProcess
from clusterbook.spec import NodeSpec

__all__ = ["Attempt"]

_log = logging.getLogger("clusterbook.job")


class Attempt:
    """One run of job ``job_id`` (``number``: 1 for the first).

    Output of every rank is parsed into records as it arrives, appended to ``rank-N.log`` in
    :attr:`directory`, kept in a bounded buffer and streamed (the store's). Starting it starts
    the launcher; :meth:`wait` returns its result once it has ended. With ``keep``
    (``clean="none"``), the first rank failure stops every process of the attempt instead,
    on this machine and, through ``hold_far`` (the provider's ``hold_job``), on the nodes of
    other machines, until :meth:`cleanup` (see :mod:`clusterbook.launch.keep`).
    """

    def __init__(
        self,
        job_id: str,
        number: int,
        plan: LaunchPlan,
        command: LaunchCommand,
        directory: Path,
        store: LogStore,
        *,
        base_env: dict[str, str],
        cwd: str | None,
        timeout: float | None,
        grace: float = 3.0,
        stack_grace: float = 1.0,
        failure_grace: float = 2.0,
        on_failure: Callable[[str], None] | None = None,
        diagnose: Callable[[JobResult | None], list[str]] | None = None,
        lost: Callable[[tuple[NodeSpec, ...]], NodeLostError | None] | None = None,
        loss_grace: float = 3.5,
        keep: bool = False,
        hold_far: Callable[[str, Mapping[str, int]], tuple[KeptProcess, ...]] | None = None,
        on_end: Callable[[LaunchPlan, JobResult, ClusterError | None], None] | None = None,
    ) -> None:
        self.id = job_id
        self.number = number
        self.plan = plan
        self.directory = directory
        self.np = plan.np
        self.argv = list(plan.argv)
        self.timeout = timeout
        self._store = store
        self._grace = grace
        self._stack_grace = stack_grace
        self._failure_grace = failure_grace
        self._on_failure = on_failure
        self._diagnose = diagnose
        self._lost = lost
        self._on_end = on_end
        self._loss_grace = loss_grace
        self._notes: list[str] = []
        self._lock = threading.Lock()
        # "timeout" | "cancel" | "failure" | "error" | "lingered" (every rank had ended)
        self._stop_reason: str | None = None
        self._error: ClusterError | None = None  # why clusterbook stopped the job itself
        self._stopped_at_exit_count: int | None = None
        self._done = threading.Event()
        self._exited = threading.Event()  # the launcher has exited
        self._result: JobResult | None = None
        self._keep = keep
        self._hold_far = hold_far if plan.remote is not None else None
        self._holding = False  # the attempt's processes are kept stopped (see _hold)
        self._cleaned = False
        self._kept: tuple[KeptProcess, ...] = ()

        write_attempt_files(directory, job_id, number, plan, command, store.hosts)
        store.on_exit(self._on_rank_exit)
        store.on_write_error(self.fail)
        self.started = time.time()
        self._t0 = time.monotonic()
        self._token = plan.job_token
        guard.watch(self._token)
        self._proc = procs.spawn(command.argv, env=command.environment(base_env), cwd=cwd)
        self._readers = start_readers(
            self._proc,
            plan,
            store,
            self._exited,
            guarded=self._guarded,
            name=f"clusterbook-{job_id}-io",
        )
        self._timer: threading.Timer | None = None
        if timeout is not None:
            self._timer = threading.Timer(timeout, self._guarded(self._stop), args=("timeout",))
            self._timer.daemon = True
            self._timer.start()
        threading.Thread(target=self._supervise, name=f"clusterbook-{job_id}", daemon=True).start()

    # -- what the job asks of its attempt --------------------------------------------------

    @property
    def store(self) -> LogStore:
        """Where this attempt's output goes (files, buffer, live readers)."""
        return self._store

    @property
    def pid(self) -> int:
        """Process id of the launcher (mpirun / mpiexec)."""
        return self._proc.pid

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def result(self) -> JobResult | None:
        """The result once the attempt has ended, else None."""
        return self._result

    @property
    def error(self) -> ClusterError | None:
        """Why clusterbook stopped the attempt itself (see :meth:`fail`), if it did."""
        return self._error

    def wait(self, timeout: float | None = None) -> JobResult | None:
        """The result, once the attempt has ended within ``timeout`` seconds; else None."""
        self._done.wait(timeout)
        return self._result

    def stop(self, reason: str) -> None:
        """Stop every process of the attempt (SIGTERM, then SIGKILL after a grace period);
        ``reason``: "cancel" or "timeout" (Python ranks dump their stacks first). Returns
        once the launcher has exited."""
        self._stop(reason)

    def fail(self, error: ClusterError) -> None:
        """Stop the attempt because of ``error`` (its logs cannot be written, a node it runs
        on was lost, ...): its result is failed with that error. Returns at once."""
        with self._lock:
            if self._error is None and not self._done.is_set():
                self._error = error
        threading.Thread(
            target=self._guarded(self._stop), args=("error",), name=f"clusterbook-{self.id}-fail"
        ).start()

    def cleanup(self) -> list[int]:
        """End the processes the attempt kept stopped (``clean="none"``), all at once; return
        their pids (none when it kept none). Returns once they are gone."""
        with self._lock:
            holding = self._holding
        if not holding:
            return []
        self._done.wait()  # a hold under way ends first (within seconds)
        with self._lock:
            if self._cleaned:
                return []
            self._cleaned = True
        pids = keep.end_kept(self._token)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)  # the launcher, stopped with the rest
        guard.release(self._token)
        if self._hold_far is not None and self._on_failure is not None:
            try:
                self._on_failure(self._token)  # what was kept on the nodes of other machines
            except Exception:
                _log.exception("Ending what job %s kept on the nodes failed.", self.id)
        return pids

    # -- internals ------------------------------------------------------------------------

    def _guarded(self, target: Callable[..., None]) -> Callable[..., None]:
        """``target`` for a thread of this job: an exception in it fails the job with a
        clear error (a dead reader would leave the launcher blocked on a full pipe)."""

        def run(*args: object) -> None:
            try:
                target(*args)
            except Exception as exc:
                _log.exception("Thread %s of job %s failed.", target.__name__, self.id)
                error = exc if isinstance(exc, ClusterError) else None
                self.fail(error or ClusterError(f"{type(exc).__name__}: {exc}"))

        return run

    def _on_rank_exit(self, rank: int, code: int) -> None:
        codes = self._store.exit_codes
        if len(codes) >= self.np and not any(codes.values()):  # the last rank ended, all well
            stop = functools.partial(self._stop, "lingered")
            args = (time.monotonic(), self._store.last_output, self._exited, stop)
            threading.Thread(target=self._guarded(linger), args=args, daemon=True).start()
        elif code != 0 and self._keep:
            threading.Thread(
                target=self._guarded(self._hold), args=(rank,), name=f"clusterbook-{self.id}-keep"
            ).start()
        elif code != 0 and self._failure_grace is not None:
            # Launchers end the job when a rank fails; make sure of it even when one doesn't
            # (a rank stuck in MPI_Finalize, say).
            t = threading.Timer(self._failure_grace, self._guarded(self._stop), args=("failure",))
            t.daemon = True
            t.start()

    def _stop(self, reason: str) -> None:
        with self._lock:
            if self._stop_reason is not None or self._proc.poll() is not None:
                return
            self._stop_reason = reason
            self._stopped_at_exit_count = len(self._store.exit_order)
        if reason == "timeout":
            self._notes += self._find_out(None)
            # Python ranks dump every thread's stack on SIGUSR1 (the rank hook); the launcher
            # forwards the signal to them.
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=self._stack_grace)
        # Stopped for an error (a node lost): the launcher cannot tear down what it cannot
        # reach, so it gets less time to try; nor one whose ranks all ended long ago.
        grace = min(self._grace, 1.0) if reason in ("error", "lingered") else self._grace
        procs.kill_tree(self._proc, grace, self._token)

    def _hold(self, rank: int) -> None:
        """Keep the attempt's processes, stopped where they are, for inspection: ``rank``
        failed and stopped itself (or its wrapper did), so the launcher has not seen it."""
        with self._lock:
            if self._stop_reason is not None or self._proc.poll() is not None:
                return
            self._stop_reason = "failure"
            self._holding = True
            self._stopped_at_exit_count = len(self._store.exit_order)
        code = -int(signal.SIGSTOP)  # the launcher's state, as a returncode
        try:
            pid = self._store.pids.get(rank)
            nodes = self.plan.nodes
            node_of = {r: nodes[i] for r, i in enumerate(placement(nodes, self.np))}
            far = {r for r, n in node_of.items() if self._hold_far and not n.here}
            kept_far: tuple[KeptProcess, ...] = ()
            if self._hold_far is not None:
                failing = {node_of[rank].name: pid} if rank in far and pid is not None else {}
                try:  # the nodes of other machines first: this machine's launcher holds on
                    kept_far = name_kept(self._hold_far(self._token, failing), node_of, self._store)
                except Exception:
                    _log.exception("Keeping job %s on the nodes failed.", self.id)
            pipes = (self._proc.stdout, self._proc.stderr)
            here = {r: p for r, p in self._store.pids.items() if r not in far}
            kept_here = keep.hold(self._token, pid, pipes, here, far=rank in far)
            self._kept = ranks_first(kept_here + kept_far)
            if self._timer is not None:
                self._timer.cancel()
            polled = self._proc.poll()
            code = code if polled is None else polled
        finally:
            self._finish(code)

    def _find_out(self, result: JobResult | None) -> list[str]:
        """What ``diagnose`` says about the job (``result``: once it has ended)."""
        if self._diagnose is None:
            return []
        try:
            return list(self._diagnose(result))
        except Exception:
            _log.exception("Diagnosing job %s failed.", self.id)
            return []

    def _supervise(self) -> None:
        returncode: int | None = None
        holding = False
        try:
            returncode = self._proc.wait()
            with self._lock:
                holding = self._holding
            if holding:  # ended by cleanup(), or by itself: the hold makes the result
                return
            self._exited.set()
            for t in self._readers:
                # A process that outlived the launcher may still hold its pipes open; its
                # output is not waited for forever.
                t.join(timeout=5.0)
            if self._timer is not None:
                self._timer.cancel()
            codes = self._store.exit_codes
            unreported = len(codes) < self.np
            unexplained = not any(codes.values()) and self._stop_reason is None
            if unreported and unexplained and self._error is None:
                # Ranks that never said how they ended, and none that failed: their node may
                # be gone (Open MPI's mpirun can even exit 0 when a node's daemon dies). Wait
                # for the head to know.
                self._error = self._loss()
            # Whatever a rank left behind (a daemonized child, say) goes with the job; on
            # remote nodes too when the job did not end cleanly.
            kill_tagged([self._token], self._grace)
            if (returncode != 0 or unreported) and self._on_failure is not None:
                try:
                    self._on_failure(self._token)
                except Exception:
                    _log.exception("Stopping job %s on the nodes failed.", self.id)
        except Exception as exc:
            _log.exception("The supervisor of job %s failed.", self.id)
            if self._error is None:
                self._error = ClusterError(f"{type(exc).__name__}: {exc}")
        finally:
            if not holding:
                self._finish(returncode)

    def _loss(self) -> NodeLostError | None:
        """The loss of a node of this attempt, if the head learns of one within the grace."""
        if self._lost is None:
            return None
        give_up = time.monotonic() + self._loss_grace
        while (error := self._lost(self.plan.nodes)) is None and time.monotonic() < give_up:
            time.sleep(0.05)
        return error

    def _finish(self, returncode: int | None) -> None:
        """Mark the job done with its result, whatever happened before: ``wait()``,
        ``cancel()`` and the cluster's ``stop()`` must return."""
        duration = time.monotonic() - self._t0
        try:
            if not self._holding:  # kept processes die with us until cleanup()
                guard.release(self._token)
        except Exception:
            _log.exception("Releasing job %s from the guard failed.", self.id)
        self._exited.set()
        self._store.close()
        if self._store.write_error is not None and self._error is None:
            self._error = self._store.write_error
        polled = self._proc.poll() if returncode is None else returncode
        code = polled if polled is not None else -1  # -1: the launcher's end was not seen
        if self._stop_reason == "lingered":  # its ranks' end is the job's
            code = 0
            self._notes.append(
                "The launcher was still running after the last rank ended (silent for "
                f"{QUIET:g} s, or for {LINGER:g} s in all: a process a rank left in the "
                "background holding its output, or a rank's end it missed): stopped."
            )
            _log.warning("Job %s: %s", self.id, self._notes[-1])
        try:
            self._result = attempt_result(
                self._store,
                self.id,
                self.number,
                self.np,
                code,
                duration,
                stop_reason=self._stop_reason,
                stopped_at=self._stopped_at_exit_count,
                error=self._error,
                kept=self._kept,
            )
            if not self._result.ok:
                said = [*self._notes, self._result.error or ""]
                notes = [n for n in self._find_out(self._result) if not any(n in t for t in said)]
                self._notes += notes
            if self._notes:
                self._result = replace(self._result, notes=tuple(self._notes))
        except Exception as exc:
            _log.exception("Making the result of job %s failed.", self.id)
            self._result = JobResult(
                self.id,
                code,
                {},
                (),
                duration,
                error=f"{type(exc).__name__}: {exc}",
                attempt=self.number,
                kept=self._kept,
            )
        if self._on_end is not None:  # before the job sees the end: its next attempt's nodes
            try:
                self._on_end(self.plan, self._result, self._error)
            except Exception:
                _log.exception("A callback on the end of job %s's attempt failed.", self.id)
        self._done.set()
