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

import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from clusterbook.cluster.handle import ClusterHandle, JobHandle
from clusterbook.durations import Duration, duration
from clusterbook.engines.config import (
    CONNECTION_ENV,
    ENGINES_LABEL,
    INTERNAL_PORTS,
    PORTS,
    Hidden,
    connection_info,
    controller_argv,
    controller_env,
    engine_argv,
    free_ports,
)
from clusterbook.engines.engineset import Controller, EngineSet
from clusterbook.errors import ClusterError, ConfigError
from clusterbook.nodes.tasks.common import process_tag
from clusterbook.views.progress import Bar, bar, checked

if TYPE_CHECKING:
    import ipyparallel
    from typing_extensions import Unpack

    from clusterbook.launch.prepare import JobArgs

__all__ = ["EngineArgs", "EngineHost", "EngineSet", "start_engines"]


class EngineArgs(TypedDict, total=False):
    """What ``cluster.engines(n, ...)`` takes (see :func:`start_engines`)."""

    timeout: Duration
    env: Mapping[str, str] | None
    encrypt: bool | None
    progress: bool | None


class EngineHost(ClusterHandle, Protocol):
    """What engines need of the cluster they run on: a cluster this process runs (the head
    that runs it: its engines' controller must live as long as they do), which runs their job
    under a label and stops the controller with the engines (:meth:`on_stop`)."""

    def mpirun(
        self,
        argv: Sequence[str],
        np: int | None = None,
        *,
        label: str | None = None,
        **job: Unpack[JobArgs],
    ) -> JobHandle: ...

    def on_stop(self, stop: Callable[[], None]) -> None: ...


_POLL = 0.02


def _write_secret(path: Path, data: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)


def start_engines(
    cluster: EngineHost,
    n: int | None = None,
    *,
    timeout: Duration = 60.0,
    env: Mapping[str, str] | None = None,
    heartbeat: Duration = 0.05,
    head_addr: str | None = None,
    encrypt: bool | None = None,
    progress: bool | None = None,
) -> ipyparallel.Client:
    """Start a controller and ``n`` MPI engines on ``cluster`` and return a connected client.

    Parameters
    ----------
    cluster
        A running cluster of this process (its head: :class:`EngineHost`).
    n
        Number of engines (MPI ranks; default: every slot).
    timeout
        How long to wait for the controller and all ``n`` engines (a duration: seconds, a
        ``datetime.timedelta`` or text like ``"2m"``); past it everything started
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
    ipyparallel, zmq = _imported()
    limit, heartbeat = _checked(timeout, heartbeat, encrypt)
    progress = checked(progress)  # a bad value is named before anything starts
    deadline = time.monotonic() + limit
    # CurveZMQ when the traffic crosses the nodes' network: encrypted, not only signed.
    curve = None
    if encrypt or (encrypt is None and head_addr is not None):
        public, secret = (k.decode("ascii") for k in zmq.curve_keypair())
        curve = (public, secret)
    engines, engine_info = _spawn_controller(cluster, head_addr or "127.0.0.1", heartbeat, curve)
    cluster.on_stop(engines.stop)
    progress_bar = bar(progress, "starting engines", None, "engine")
    try:
        job = cluster.mpirun(
            engine_argv(limit),
            np=n,
            label=ENGINES_LABEL,
            env={**(env or {}), CONNECTION_ENV: Hidden(json.dumps(engine_info))},
            abort_on_error=False,  # the engines' kernels catch what a cell raises
        )
        engines.job, engines.n = job, job.np
        with progress_bar:
            progress_bar.update(0, "connecting to the controller", job.np)
            security = engines.directory / "security"
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


def _imported() -> tuple[Any, Any]:
    """ipyparallel and zmq, imported now (never before engines are asked for)."""
    try:
        import ipyparallel
        import zmq
    except ImportError as exc:
        raise ConfigError(
            "cluster.engines() needs ipyparallel; install it with "
            "pip install 'clusterbook[jupyter]' (on every node too)."
        ) from exc
    return ipyparallel, zmq


def _checked(timeout: object, heartbeat: object, encrypt: bool | None) -> tuple[float, float]:
    """The seconds to wait for the engines and between heartbeats; bad values are named
    before anything starts."""
    limit, beat = duration(timeout, "timeout"), duration(heartbeat, "heartbeat")
    if not 0.01 <= beat <= 10:
        raise ConfigError(f"heartbeat must be between 0.01 and 10 seconds, got {heartbeat!r}.")
    if encrypt is not None and not isinstance(encrypt, bool):  # 1 == True, but is not one
        raise ConfigError(f"encrypt must be True, False or None (automatic), got {encrypt!r}.")
    return limit, beat


def _spawn_controller(
    cluster: EngineHost, engine_ip: str, heartbeat: float, curve: tuple[str, str] | None
) -> tuple[EngineSet, dict[str, Any]]:
    """Write a fresh key's connection files and start the controller on them (it listens at
    ``engine_ip`` for the engines; ``curve``: its CurveZMQ key pair); the engine set (of no
    engines yet) and what the engines connect with."""
    key = secrets.token_hex(32)
    ports = free_ports(PORTS + INTERNAL_PORTS)
    engine_info, client_info = connection_info(
        key,
        ports[:PORTS],
        engine_ip=engine_ip,
        client_ip="127.0.0.1",
        curve_serverkey=curve[0] if curve else None,
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
        internal_ports=ports[PORTS:],
    )
    token = process_tag(cluster.id, f"ipc-{secrets.token_hex(4)}")
    env = controller_env(*curve) if curve else {}
    return EngineSet(0, directory, Controller.spawn(argv, directory, token, env)), engine_info


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


def _connect(
    ipyparallel: Any, security: Path, engines: EngineSet, deadline: float, limit: float
) -> ipyparallel.Client:
    # The controller may still be starting: ask in short attempts, checking between them
    # that it and the engines are alive, instead of one long blind wait.
    while True:
        engines.check_alive()
        left = deadline - time.monotonic()
        if left <= 0:
            raise engines.not_ready(limit, "the controller did not answer")
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
        engines.check_alive()
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
    raise engines.not_ready(limit, reason)


def _activate(client: ipyparallel.Client) -> None:
    # Point %px/%%px at these engines (ipyparallel does it only for the first client), in an
    # IPython that runs already: the core never imports IPython itself.
    ipython = sys.modules.get("IPython")
    if ipython is not None and ipython.get_ipython() is not None:
        client.activate()
