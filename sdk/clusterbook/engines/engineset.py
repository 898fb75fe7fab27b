"""One ``cluster.engines()`` call's processes: the controller on the head, the engines' job and
the client, which stop together (:class:`EngineSet`)."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clusterbook.cluster.handle import JobHandle
from clusterbook.errors import ClusterError, JobFailedError, ReadyTimeoutError
from clusterbook.launch import proc as procs
from clusterbook.launch.guard import ENV as JOB_ENV
from clusterbook.launch.guard import guard

if TYPE_CHECKING:
    import ipyparallel

__all__ = ["Controller", "EngineSet"]

_LOG_TAIL = 12
_log = logging.getLogger("clusterbook")


@dataclass
class Controller:
    """The controller process on the head, tagged as a job so the guard reaps it."""

    proc: subprocess.Popen[bytes]
    token: str
    log: Path

    @classmethod
    def spawn(cls, argv: list[str], directory: Path, token: str, env: dict[str, str]) -> Controller:
        log = directory / "controller.log"
        guard.watch(token)
        with os.fdopen(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
            proc = subprocess.Popen(
                argv,
                env={**os.environ, **env, JOB_ENV: token},
                cwd=directory,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                umask=0o077,
            )
        return cls(proc, token, log)

    def tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()[-_LOG_TAIL:]
        except OSError:
            return ""
        return "\n".join(f"    {line}" for line in lines)

    def stop(self, grace: float) -> None:
        procs.kill_tree(self.proc, grace, self.token)
        guard.release(self.token)


class EngineSet:
    """One ``cluster.engines()`` call: its controller, its engines job and its client.

    :func:`start_engines` makes these. :meth:`stop` (or the cluster's ``stop_engines()`` /
    ``stop()``) ends all three; when the engines job ends by itself (its ranks exited, or it
    was cancelled from the widget) the controller is stopped too.
    """

    def __init__(self, n: int, directory: Path, controller: Controller) -> None:
        self.n = n
        self.directory = directory
        self._controller = controller
        self.job: JobHandle | None = None
        self.client: ipyparallel.Client | None = None
        self._lock = threading.Lock()
        self._released = False
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def watch(self) -> None:
        """Release the controller once the engines job has ended (on a daemon thread)."""
        job = self.job
        assert job is not None

        def release_at_end() -> None:
            try:
                job.wait()
                self._release()
            except Exception:  # a dead thread would leave the controller running unseen
                _log.exception("clusterbook could not stop the controller of %s", job.id)

        threading.Thread(
            target=release_at_end, name=f"clusterbook-{job.id}-engines", daemon=True
        ).start()

    def stop(self, grace: float = 3.0) -> None:
        """Cancel the engines job, stop the controller (SIGTERM, SIGKILL after ``grace`` s),
        close the client and remove the connection files. Safe to call more than once.

        The job is cancelled rather than asked to shut down through the client: ipyparallel
        9 engines end a requested shutdown with an error, which aborts the MPI job."""
        if self._stopped:
            return
        self._stopped = True
        try:  # whatever happens here, cluster.stop() goes on with the rest
            if self.job is not None and not self.job.done():
                self.job.cancel()
            self._release(grace)
        except Exception:
            _log.exception("clusterbook could not stop the ipyparallel engines cleanly")
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close(linger=0)

    def _release(self, grace: float = 3.0) -> None:
        with self._lock:  # held throughout: a second caller returns once it is all done
            if self._released:
                return
            self._released = True
            self._controller.stop(grace)
            for path in (self.directory / "security").glob("*.json"):
                with contextlib.suppress(OSError):
                    path.unlink()

    def check_alive(self) -> None:
        """Raise if the engines job or the controller ended before the engines were ready."""
        job, controller = self.job, self._controller
        if job is not None and job.done():
            result = job.wait()
            raise JobFailedError(
                f"The ipyparallel engines ({job.id}) ended before they were all ready.\n"
                f"{result.summary()}\nThe controller said:\n{controller.tail()}",
                result=result,
            )
        if controller.proc.poll() is not None:
            raise ClusterError(
                f"The ipyparallel controller exited with code {controller.proc.returncode} "
                f"before the engines were ready; it said:\n{controller.tail()}\n"
                f"(log: {controller.log})"
            )

    def not_ready(self, limit: float, reason: str) -> ReadyTimeoutError:
        """The error of engines not ready after ``limit`` seconds, for ``reason``."""
        job = self.job
        where = f" (engines job {job.id}: see job.logs() or {job.directory})" if job else ""
        return ReadyTimeoutError(
            f"ipyparallel engines were not ready after {limit:g} s: {reason}{where}. Pass a "
            f"longer timeout, or look at the controller's log:\n{self._controller.tail()}",
            timeout=limit,
            reason=reason,
        )

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running"
        job = self.job.id if self.job is not None else "-"
        return f"<EngineSet {job} n={self.n} {state}>"
