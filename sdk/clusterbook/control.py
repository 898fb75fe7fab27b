"""Requests to a running cluster's head from other processes: run a job, cancel one, stop.

The head (the kernel that started the cluster, or a detached cluster's supervisor) serves
:class:`ControlServer` on 127.0.0.1; its address is in the record (``cluster.json``), its
secret in the 0600 ``token`` file beside it, so whoever can read the cluster's directory can
drive it and nobody else can. Frames are those of the rendezvous store
(:mod:`clusterbook.rendezvous.backends._wire`): the client's first one shows the secret, and
the traffic never leaves this machine (no other user sees or changes loopback traffic, the
way a Jupyter server's token is safe on 127.0.0.1); payloads are JSON. No pickle anywhere.

Requests and replies (JSON objects)::

    {"op": "mpirun", "argv": [...], "np": N|null, "job": {JobArgs}}  -> {"id", "directory"}
    {"op": "cancel", "job": ID}                                      -> {}
    {"op": "stop", "reason": TEXT|null}                              -> {}
    {"op": "wait_ready", "timeout": S}                               -> {}
    {"op": "put", "paths": [...]} / {"op": "gather", "directory": D} -> {"paths": [...]}
    {"op": "run_on_nodes", "argv": [...], "timeout": S}              -> {"rows": [...]}

A request that fails with a :class:`~clusterbook.errors.ClusterError` answers
``{"error": {"type": NAME, "message": TEXT}}``; the client raises the same type again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from clusterbook import errors
from clusterbook.errors import ClusterError, ClusterStateError
from clusterbook.rendezvous.backends._wire import (
    AuthFailed,
    Channel,
    _tune,
    accept_hello,
    open_channel,
    read_secret,
    write_secret,
)

__all__ = ["TOKEN_FILE", "ControlClient", "ControlServer", "Handler", "rebuilt_error"]

TOKEN_FILE = "token"  # noqa: S105 - the name of the file, not a secret
_log = logging.getLogger("clusterbook.control")
_HANDSHAKE_TIMEOUT = 10.0

Handler = Callable[[Mapping[str, Any]], Mapping[str, Any]]


class ControlServer:
    """Serve ``handlers`` (op name to function of the request) to holders of the secret."""

    def __init__(self, directory: Path, handlers: Mapping[str, Handler]) -> None:
        self._handlers = dict(handlers)
        self._token = directory / TOKEN_FILE
        self._token.unlink(missing_ok=True)
        self._secret = write_secret(self._token)
        self._sock = socket.create_server(("127.0.0.1", 0))
        host, port = self._sock.getsockname()[:2]
        self._address = f"{host}:{port}"
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._accept, name="clusterbook-control", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> str | None:
        """``HOST:PORT`` while it takes requests, else None."""
        return None if self._closed.is_set() else self._address

    def close(self) -> None:
        """Stop taking requests; remove the token file."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._token.unlink(missing_ok=True)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(conn,), name="clusterbook-control-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            _tune(conn)
            try:
                deadline = time.monotonic() + _HANDSHAKE_TIMEOUT
                chan = Channel(conn)
                try:
                    accept_hello(chan, self._secret, deadline)
                except AuthFailed:
                    _log.warning("The control server refused a client: authentication failed.")
                    return
                conn.settimeout(None)
                while not self._closed.is_set():
                    request = json.loads(chan.recv(None))
                    chan.send(json.dumps(self._answer(request)).encode())
            except Exception as exc:  # a client gone, or not one of ours
                _log.debug("Control connection ended: %s", exc)

    def _answer(self, request: Any) -> Mapping[str, Any]:
        op = request.get("op") if isinstance(request, dict) else None
        handler = self._handlers.get(op) if isinstance(op, str) else None
        if handler is None:
            known = ", ".join(sorted(self._handlers))
            return _error(ClusterStateError(f"The head does not know request {op!r} ({known})."))
        try:
            return dict(handler(request))
        except ClusterError as exc:
            return _error(exc)
        except Exception as exc:  # a bug in the head must not kill its server
            _log.exception("Control request %r failed.", op)
            return _error(ClusterError(f"{type(exc).__name__}: {exc}"))


def _error(exc: ClusterError) -> dict[str, Any]:
    return {"error": {"type": type(exc).__name__, "message": str(exc)}}


class ControlClient:
    """Requests to the head whose address and token file a cluster's record names."""

    def __init__(self, address: str, token_file: Path, *, timeout: float = 10.0) -> None:
        host, _, port = address.rpartition(":")
        self._where = (host, int(port))
        self._secret = read_secret(token_file)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._chan: Channel | None = None

    def call(self, op: str, *, reply_within: float | None = None, **args: Any) -> dict[str, Any]:
        """Send request ``op`` and return its answer; raise the error the head answered
        with, or :class:`ClusterStateError` when the head cannot be reached."""
        payload = json.dumps({"op": op, **args}).encode()
        with self._lock:
            try:
                chan = self._connect()
                chan.send(payload)
                wait = None if reply_within is None else time.monotonic() + reply_within
                reply = json.loads(chan.recv(wait))
            except Exception as exc:
                self.close()
                raise ClusterStateError(
                    f"Cannot reach the cluster's head at {self._where[0]}:{self._where[1]} "
                    f"({type(exc).__name__}: {exc}); it may have stopped."
                ) from exc
        if "error" in reply:
            raise rebuilt_error(reply["error"])
        return dict(reply)

    def _connect(self) -> Channel:
        if self._chan is None:
            sock = socket.create_connection(self._where, timeout=self._timeout)
            _tune(sock)
            try:
                self._chan = open_channel(
                    sock, self._secret, None, time.monotonic() + self._timeout
                )
            except BaseException:
                sock.close()
                raise
            sock.settimeout(None)
        return self._chan

    def close(self) -> None:
        chan, self._chan = self._chan, None
        if chan is not None:
            with contextlib.suppress(OSError):
                chan.sock.close()


def rebuilt_error(error: Mapping[str, Any]) -> ClusterError:
    """The head's error as this process's exception of the same type."""
    kind = getattr(errors, str(error.get("type")), None)
    message = str(error.get("message", ""))
    if not (isinstance(kind, type) and issubclass(kind, ClusterError)):
        kind = ClusterError
    exc = kind.__new__(kind)
    Exception.__init__(exc, message)
    return exc
