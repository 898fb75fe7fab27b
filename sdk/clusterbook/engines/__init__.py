"""ipyparallel engines as an MPI job of a cluster, with their controller on the head.

ipyparallel (``pip install 'clusterbook[jupyter]'``) is imported when engines are started,
never before.

``cluster.engines(n)`` lands here. Start-up runs the controller and the engines side by side
instead of one after the other: the connection files (a fresh per-engine-set key, ports chosen
here) are written first, the controller is told to reuse them, and the engines are started at
once under the cluster's own launcher (``cluster.mpirun``), so they get the per-rank logs, the
process guard, the MPI tuning and SSH nodes like any job. An engine's first registration
message waits in its socket until the controller listens.

Secrets: the connection files are created 0600 in the run directory's 0700 ``ipyparallel/``
and removed when the engines stop. Engines receive the connection information in the
environment variable ipyparallel reads (``IPP_CONNECTION_INFO``), passed by name through the
launcher (never on a command line) and removed from ``os.environ`` before any user code runs,
so ``%px !env`` cannot show it. Nothing returned or rendered here contains the key.

When the nodes are other machines, traffic between engines, controller and client is
encrypted with CurveZMQ (a fresh key pair per engine set; the controller gets it in its
environment), as well as signed with the key.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from clusterbook.engines.config import (
    CONNECTION_ENV,
    PORTS,
    Hidden,
    connection_info,
    controller_argv,
    controller_env,
    engine_argv,
    free_ports,
)
from clusterbook.errors import ClusterError, ConfigError, JobFailedError, ReadyTimeoutError
from clusterbook.launch import proc as procs
from clusterbook.launch.guard import ENV as JOB_ENV
from clusterbook.launch.guard import guard
from clusterbook.spec import validate_seconds
from clusterbook.views.progress import Bar, bar, checked

if TYPE_CHECKING:
    import ipyparallel

    from clusterbook.cluster.facade import Cluster
    from clusterbook.launch.job import Job

__all__ = ["EngineArgs", "EngineSet", "start_engines"]


class EngineArgs(TypedDict, total=False):
    """What ``cluster.engines(n, ...)`` takes (see :func:`start_engines`)."""

    timeout: float
    env: Mapping[str, str] | None
    encrypt: bool | None
    progress: bool | None


_POLL = 0.02
_LOG_TAIL = 12
_log = logging.getLogger("clusterbook")


def _write_secret(path: Path, data: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)


@dataclass
class _Controller:
    """The controller process on the head, tagged as a job so the guard reaps it."""

    proc: subprocess.Popen[bytes]
    token: str
    log: Path

    @classmethod
    def spawn(
        cls, argv: list[str], directory: Path, token: str, env: dict[str, str]
    ) -> _Controller:
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

    def __init__(self, n: int, directory: Path, controller: _Controller) -> None:
        self.n = n
        self.directory = directory
        self._controller = controller
        self.job: Job | None = None
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
            if self.job is not None and not self.job.done:
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

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running"
        job = self.job.id if self.job is not None else "-"
        return f"<EngineSet {job} n={self.n} {state}>"


def start_engines(
    cluster: Cluster,
    n: int | None = None,
    *,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    heartbeat: float = 0.05,
    head_addr: str | None = None,
    encrypt: bool | None = None,
    progress: bool | None = None,
) -> ipyparallel.Client:
    """Start a controller and ``n`` MPI engines on ``cluster`` and return a connected client.

    Parameters
    ----------
    cluster
        A running :class:`clusterbook.Cluster`.
    n
        Number of engines (MPI ranks; default: every slot).
    timeout
        Seconds to wait for the controller and all ``n`` engines; past it everything started
        is stopped and :class:`~clusterbook.ReadyTimeoutError` is raised.
    env
        Variables for the engines, as for ``cluster.mpirun``.
    heartbeat
        Seconds between the controller's heartbeats; an engine counts as ready at its first
        beat, so this bounds start-up latency.
    head_addr
        Address the nodes reach the head at (default: loopback, right when the nodes are this
        machine; SSH clusters pass the address their launcher gives the nodes).
    encrypt
        CurveZMQ encryption of all engine, controller and client traffic (default: when
        ``head_addr`` is given, i.e. the traffic crosses a network).
    progress
        A bar of the engines registered (default: where someone watches, see
        :mod:`clusterbook.views.progress`).

    Returns
    -------
    ipyparallel.Client
        Connected, with ``n`` engines whose ids are their MPI ranks. In IPython, ``%px`` and
        ``%%px`` are pointed at its engines.
    """
    try:
        import ipyparallel
        import zmq
    except ImportError as exc:
        raise ConfigError(
            "cluster.engines() needs ipyparallel; install it with "
            "pip install 'clusterbook[jupyter]' (on every node too)."
        ) from exc
    limit = validate_seconds(timeout, "timeout")
    assert limit is not None
    progress = checked(progress)  # a bad value is named before anything starts
    if not 0.01 <= (validate_seconds(heartbeat, "heartbeat") or 0) <= 10:
        raise ConfigError(f"heartbeat must be between 0.01 and 10 seconds, got {heartbeat!r}.")
    deadline = time.monotonic() + limit
    engine_ip = head_addr or "127.0.0.1"
    if encrypt is not None and not isinstance(encrypt, bool):  # 1 == True, but is not one
        raise ConfigError(f"encrypt must be True, False or None (automatic), got {encrypt!r}.")
    key = secrets.token_hex(32)
    # CurveZMQ when the traffic crosses the nodes' network: encrypted, not only signed.
    curve_public = curve_secret = None
    if encrypt or (encrypt is None and head_addr is not None):
        curve_public, curve_secret = (k.decode("ascii") for k in zmq.curve_keypair())
    ports = free_ports(PORTS)
    engine_info, client_info = connection_info(
        key, ports, engine_ip=engine_ip, client_ip="127.0.0.1", curve_serverkey=curve_public
    )
    directory = _new_profile_dir(cluster.run_dir / "ipyparallel")
    security = directory / "security"
    _write_secret(security / "ipcontroller-engine.json", engine_info)
    _write_secret(security / "ipcontroller-client.json", client_info)
    # The controller runs in this interpreter's environment, next to the client (it has
    # ipyparallel: it was just imported); the engines run the cluster's.
    argv = controller_argv(
        sys.executable,
        str(directory),
        engine_ip=engine_ip,
        client_ip="127.0.0.1",
        heartbeat_ms=round(heartbeat * 1000),
    )
    token = f"{cluster.id}-ipc-{secrets.token_hex(4)}"
    curve = controller_env(curve_public, curve_secret) if curve_public and curve_secret else {}
    controller = _Controller.spawn(argv, directory, token, curve)
    engines = EngineSet(0, directory, controller)
    cluster.on_stop(engines.stop)
    progress_bar = bar(progress, "starting engines", None, "engine")
    try:
        job = cluster.mpirun(
            engine_argv(limit),
            np=n,
            env={**(env or {}), CONNECTION_ENV: Hidden(json.dumps(engine_info))},
            abort_on_error=False,  # the engines' kernels catch what a cell raises
        )
        from clusterbook.launch.job import Job

        assert isinstance(job, Job)  # engines() refuses a detached cluster
        engines.job, engines.n = job, job.np
        with progress_bar:
            progress_bar.update(0, "connecting to the controller", job.np)
            engines.client = _connect(ipyparallel, security, engines, deadline, limit)
            progress_bar.update(0, "engines registered")
            _wait_for_engines(engines, deadline, limit, progress_bar)
    except BaseException:
        progress_bar.close()
        engines.stop(grace=1.0)
        raise
    engines.watch()
    client = engines.client
    _activate(client)
    return client


def _new_profile_dir(parent: Path) -> Path:
    parent.mkdir(mode=0o700, exist_ok=True)
    for i in range(1, 10_000):
        directory = parent / f"controller-{i}"
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue
        (directory / "security").mkdir(mode=0o700)
        return directory
    raise ClusterError(f"{parent} holds 10000 controller directories; use a new cluster.")


def _check_alive(engines: EngineSet) -> None:
    job, controller = engines.job, engines._controller
    if job is not None and job.done:
        result = job.wait()
        raise JobFailedError(
            f"The ipyparallel engines ({job.id}) ended before they were all ready.\n"
            f"{result.summary()}\nThe controller said:\n{controller.tail()}",
            result=result,
        )
    if controller.proc.poll() is not None:
        raise ClusterError(
            f"The ipyparallel controller exited with code {controller.proc.returncode} before "
            f"the engines were ready; it said:\n{controller.tail()}\n"
            f"(log: {controller.log})"
        )


def _connect(
    ipyparallel: Any, security: Path, engines: EngineSet, deadline: float, limit: float
) -> ipyparallel.Client:
    # The controller may still be starting: ask in short attempts, checking between them
    # that it and the engines are alive, instead of one long blind wait.
    while True:
        _check_alive(engines)
        left = deadline - time.monotonic()
        if left <= 0:
            raise _timeout(engines, limit, "the controller did not answer")
        try:
            return ipyparallel.Client(
                str(security / "ipcontroller-client.json"), timeout=min(1.0, left)
            )
        except TimeoutError:
            continue


def _wait_for_engines(engines: EngineSet, deadline: float, limit: float, shown: Bar) -> None:
    client = engines.client
    assert client is not None
    future = client.wait_for_engines(engines.n, timeout=limit, block=False, interactive=False)
    while not future.done():
        _check_alive(engines)
        shown.update(len(client.ids))
        if time.monotonic() > deadline:
            break
        futures.wait([future], timeout=_POLL)
    error = future.exception() if future.done() else None
    if future.done() and error is None:
        return
    reason = f"{len(client.ids)} of {engines.n} engines registered"
    if error is not None and not isinstance(error, TimeoutError):
        reason += f" ({error})"
    raise _timeout(engines, limit, reason)


def _timeout(engines: EngineSet, limit: float, reason: str) -> ReadyTimeoutError:
    job = engines.job
    where = f" (engines job {job.id}: see job.logs() or {job.directory})" if job else ""
    return ReadyTimeoutError(
        f"ipyparallel engines were not ready after {limit:g} s: {reason}{where}. Pass a "
        f"longer timeout, or look at the controller's log:\n{engines._controller.tail()}",
        timeout=limit,
        reason=reason,
    )


def _activate(client: ipyparallel.Client) -> None:
    # Point %px/%%px at these engines (ipyparallel does it only for the first client), in an
    # IPython that runs already: the core never imports IPython itself.
    ipython = sys.modules.get("IPython")
    if ipython is not None and ipython.get_ipython() is not None:
        client.activate()
