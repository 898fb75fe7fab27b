"""What an ipyparallel controller and its MPI engines are started with: pure builders.

The connection information is ipyparallel's connection-file format (one dict for engines, one
for clients); the command lines are the controller's and an engine's. Nothing here starts a
process; :mod:`clusterbook.engines` does.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "CONNECTION_ENV",
    "CURVE_ENV",
    "ENGINES_LABEL",
    "ENGINE_MODULE",
    "INTERNAL_PORTS",
    "LOWEST_PORT",
    "PORTS",
    "Hidden",
    "connection_info",
    "controller_argv",
    "controller_env",
    "engine_argv",
    "ephemeral_start",
    "free_ports",
]

#: What ipyparallel's engine reads its connection information from.
CONNECTION_ENV = "IPP_CONNECTION_INFO"
#: What the controller reads its CurveZMQ key pair from (the environment: never an argv).
CURVE_ENV = ("IPP_ENABLE_CURVE", "IPP_CURVE_PUBLICKEY", "IPP_CURVE_SECRETKEY")
#: The module an engine job runs (``python -m ipyparallel.engine``).
ENGINE_MODULE = "ipyparallel.engine"
#: The name the engines' job is shown under in the jobs' tables (its ``label``).
ENGINES_LABEL = "ipyparallel engines"
_SCRUB = f"import os as _os; _os.environ.pop({CONNECTION_ENV!r}, None); del _os"
_ENGINE_PORTS = ("registration", "control", "mux", "task", "iopub", "hb_ping", "hb_pong")
_CLIENT_PORTS = ("control", "mux", "task", "iopub", "notification", "broadcast")
_LEAVES = 2  # broadcast scheduler leaves at ipyparallel's default depth of 1
#: Ports a controller listens on for engines and clients (the registration port is shared).
PORTS = len(_ENGINE_PORTS) + _LEAVES + len(_CLIENT_PORTS)
#: Ports a controller listens on for itself, on loopback: the broadcast scheduler's inner
#: nodes (two at depth 1) and the monitor. Not given, ipyparallel picks them by binding port
#: 0 and closing it, in the kernel's ephemeral range, where an outgoing connection can take
#: one before the controller binds it (it then dies with "Address already in use").
INTERNAL_PORTS = 3


def connection_info(
    key: str,
    ports: list[int],
    *,
    engine_ip: str,
    client_ip: str,
    curve_serverkey: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The engine and client connection dicts of a controller (ipyparallel's file format).

    ``ports`` holds :data:`PORTS` free ports. Each side's ``location`` is the address it
    connects to, an IP literal: nobody looks a host name up, and the client (on the head,
    at ``client_ip``) sees a controller on its own machine. With ``curve_serverkey`` (the
    controller's CurveZMQ public key), engines and clients encrypt all their traffic.
    """
    if len(ports) != PORTS:
        raise ValueError(f"connection_info needs {PORTS} ports, got {len(ports)}.")
    it = iter(ports)
    common = {
        "key": key,
        "curve_serverkey": curve_serverkey,
        "pack": "json",
        "unpack": "json",
        "signature_scheme": "hmac-sha256",
        "ssh": "",
    }
    engine: dict[str, Any] = {"interface": f"tcp://{engine_ip}", "location": engine_ip}
    engine.update({name: next(it) for name in _ENGINE_PORTS})
    engine["broadcast"] = [next(it) for _ in range(_LEAVES)]
    client: dict[str, Any] = {"interface": f"tcp://{client_ip}", "location": client_ip}
    client["task_scheme"] = "leastload"
    client["registration"] = engine["registration"]
    client.update({name: next(it) for name in _CLIENT_PORTS})
    return {**engine, **common}, {**client, **common}


def controller_argv(
    python: str,
    profile_dir: str,
    *,
    engine_ip: str,
    client_ip: str,
    heartbeat_ms: int,
    internal_ports: Sequence[int],
) -> list[str]:
    """The controller's command line: reuse the connection files in ``profile_dir``, listen
    for itself on ``internal_ports`` (:data:`INTERNAL_PORTS` free ports), beat every
    ``heartbeat_ms`` and tolerate about ten seconds of missed beats (a busy machine)."""
    if len(internal_ports) != INTERNAL_PORTS:
        raise ValueError(
            f"controller_argv needs {INTERNAL_PORTS} internal ports, got {len(internal_ports)}."
        )
    misses = max(10, 10_000 // heartbeat_ms)
    return [
        python,
        "-m",
        "ipyparallel.controller",
        f"--profile-dir={profile_dir}",
        "--reuse",
        f"--IPController.engine_ip={engine_ip}",
        f"--IPController.client_ip={client_ip}",
        f"--IPController.location={engine_ip}",
        f"--IPController.ports={','.join(map(str, internal_ports))}",
        f"--HeartMonitor.period={heartbeat_ms}",
        f"--HeartMonitor.max_heartmonitor_misses={misses}",
        "--log-level=INFO",
    ]


def controller_env(curve_publickey: str, curve_secretkey: str) -> dict[str, str]:
    """The controller's environment additions: CurveZMQ on, with this key pair."""
    return dict(zip(CURVE_ENV, ("1", curve_publickey, curve_secretkey), strict=True))


def engine_argv(timeout: float) -> list[str]:
    """An engine's command line: its MPI rank is its engine id and ``mpi4py`` is loaded; it
    waits up to ``timeout`` seconds for the controller to answer its registration. The
    engine's nanny stays on (about 0.2 s of start-up): it is what delivers an interrupt of a
    ``%%px`` cell, which would otherwise wait for an answer forever. Logs at WARN: more
    verbose levels print the engine's configuration, key included, into the rank logs."""
    return [
        "python",
        "-m",
        ENGINE_MODULE,
        "--mpi",
        f"--timeout={timeout:g}",
        "--log-level=WARN",
        "-c",
        _SCRUB,
    ]


class Hidden(str):
    """A string whose repr hides it: the engines job's environment is part of its plan,
    which a user may print (``job.plan``); the value itself reaches the ranks unchanged."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'<hidden>'"


#: Where the kernel takes the local ports of outgoing connections (Linux).
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
#: The lowest port :func:`free_ports` takes: below it, ports that services are configured on.
LOWEST_PORT = 10000


def ephemeral_start() -> int | None:
    """The first port of the kernel's ephemeral range (None: not known)."""
    try:
        with open(_EPHEMERAL_RANGE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_ports(count: int, range_start: Callable[[], int | None] = ephemeral_start) -> list[int]:
    """``count`` distinct TCP ports free on every interface now, for the controller to bind a
    moment later.

    They are taken below the kernel's ephemeral range where it leaves room. A port the kernel
    hands out (what binding port 0 gives) is one it also gives any outgoing connection made
    meanwhile as its local end (an agent's, ssh's, mpirun's), and the controller's bind then
    fails with "Address already in use"; below the range only another listener can take it.
    ``range_start`` says where the range starts (None: not known)."""
    low = range_start()
    span = range(LOWEST_PORT, low) if low is not None else range(0)
    # Held open together so that they are distinct; bound on every interface so that a port
    # is free on the engine-facing and the loopback address alike.
    socks: list[socket.socket] = []
    try:
        for port in random.sample(span, min(len(span), 64 * count)):
            if len(socks) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("0.0.0.0", port))  # noqa: S104 - probing for a free port, nothing listens
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < count:  # no room below the range: any port the kernel gives
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("0.0.0.0", 0))  # noqa: S104
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
