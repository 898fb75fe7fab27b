"""Requests to a running cluster's head from other processes of its user: run a job, cancel
one, stop.

The head (the kernel that started the cluster, or a detached cluster's supervisor) serves
:class:`~clusterbook.head.control_server.ControlServer` on a Unix socket in the cluster's directory,
``control.sock``: mode 0600, in a directory no one else may write or, by default, enter
(:mod:`clusterbook.fs.private` checks it), so another user cannot even connect, and the server
drops at once any peer whose uid (``SO_PEERCRED``) is not its own. Beside it, the 0600
``token`` file holds the cluster's secret, which both sides prove they hold without sending it::

    client -> head   MAGIC + client nonce                                    (32 random bytes)
    head -> client   head nonce + HMAC-SHA256(secret, "head" | MAGIC | both nonces)
    client -> head   HMAC-SHA256(secret, "client" | MAGIC | both nonces)
    head -> client   O (accepted)   or   N, then the end

The client checks the head's proof before it gives its own, and (through :func:`unix_dial`)
that the socket's server runs as its own user; it connects to its run directory's socket,
never to an address a record names. A fake head, or a record someone else rewrote, learns a
random nonce and nothing more. Frames are those of the rendezvous store
(:data:`~clusterbook.rendezvous.backends.wire.FRAME_HEADER` and a payload); after the
handshake, payloads are JSON. No pickle anywhere.

The client speaks over any connected socket its ``dial`` returns: :func:`unix_dial` for a
run directory on this machine, or a relay on the head's machine that an ssh connection runs
(:mod:`clusterbook.cluster.remote.sshdir`): the handshake then runs end to end, through it.

Requests and replies (JSON objects)::

    {"op": "mpirun", "argv": [...], "np": N|null, "job": {JobArgs}}  -> {"id", "directory"}
    {"op": "cancel", "job": ID}                                      -> {}
    {"op": "stop", "reason": TEXT|null}                              -> {}
    {"op": "wait_ready", "timeout": S}                               -> {}
    {"op": "reinstate", "node": NAME}                                -> {}
    {"op": "job_script"}                                             -> {"script": TEXT}
    {"op": "put", "paths": [...], "dest": D|null}                    -> {}
    {"op": "write", "path": P, "data": BASE64, "nodes": [...]|null, "mode": M} -> {}
    {"op": "gather", "directory": D}                                 -> {"paths": [...]}
    {"op": "run_on_nodes", "argv": [...], "timeout": S, "nodes": [...]|null} -> {"rows": [...]}
    {"op": "resource_history", "window": S|null}  -> {"interval": S, "nodes": {...}}
    {"op": "scale", "nodes": N}                                      -> {}
    {"op": "adapt", "minimum": N, "maximum": M, "interval": D, "grace": D} -> {}

A request that fails with a :class:`~clusterbook.errors.ClusterError` answers
``{"error": {"type": NAME, "message": TEXT}}``; the client raises the same type again.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from clusterbook import errors
from clusterbook.errors import ClusterError, ClusterStateError
from clusterbook.rendezvous.backends.wire import (
    MAX_FRAME,
    AuthFailed,
    Channel,
    ProtocolError,
    check_secret,
    read_secret,
)

__all__ = [
    "ACCEPTED",
    "MAGIC",
    "NONCE",
    "PROOF",
    "REFUSED",
    "SOCKET_FILE",
    "TOKEN_FILE",
    "ControlClient",
    "Dial",
    "Handler",
    "answer",
    "check_head",
    "client_proof",
    "error_reply",
    "head_challenge",
    "listen",
    "nonce_of",
    "peer_uid",
    "rebuilt_error",
    "socket_name",
    "unix_dial",
]

TOKEN_FILE = "token"  # noqa: S105 - the name of the file, not a secret
SOCKET_FILE = "control.sock"
MAGIC = b"CBCTL1\n\x00"
NONCE = 32
_log = logging.getLogger("clusterbook.head.control")
PROOF = hashlib.sha256().digest_size
ACCEPTED, REFUSED = b"O", b"N"
_SUN_PATH = 107  # bytes of a socket's path that fit in sockaddr_un (and its final NUL)
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

Handler = Callable[[Mapping[str, Any]], Mapping[str, Any]]
Dial = Callable[[float], socket.socket]
"""Connects to the head by a deadline (``time.monotonic()``) and returns the socket."""


# -- the handshake (pure) -------------------------------------------------------------------


def _proof(secret: bytes, role: bytes, client_nonce: bytes, head_nonce: bytes) -> bytes:
    message = role + b"|" + MAGIC + client_nonce + head_nonce
    return hmac.new(secret, message, hashlib.sha256).digest()


def nonce_of(hello: bytes) -> bytes:
    """The client's nonce in its first frame; :class:`ProtocolError` if that is not one."""
    if len(hello) != len(MAGIC) + NONCE or not hello.startswith(MAGIC):
        raise ProtocolError("not a clusterbook control client of this version")
    return hello[len(MAGIC) :]


def head_challenge(secret: bytes, client_nonce: bytes, head_nonce: bytes) -> bytes:
    """The head's answer to a client's nonce: its own nonce and its proof."""
    return head_nonce + _proof(secret, b"head", client_nonce, head_nonce)


def check_head(secret: bytes, client_nonce: bytes, answer: bytes) -> bytes:
    """The head's nonce, once its answer proves it holds ``secret``; else :class:`AuthFailed`."""
    head_nonce, shown = answer[:NONCE], answer[NONCE:]
    if len(head_nonce) != NONCE or not hmac.compare_digest(
        shown, _proof(secret, b"head", client_nonce, head_nonce)
    ):
        raise AuthFailed("the server did not prove it holds the cluster's secret")
    return head_nonce


def client_proof(secret: bytes, client_nonce: bytes, head_nonce: bytes) -> bytes:
    """The client's proof (the head compares it with :func:`hmac.compare_digest`)."""
    return _proof(secret, b"client", client_nonce, head_nonce)


# -- the socket ----------------------------------------------------------------------------


@contextlib.contextmanager
def socket_name(path: Path) -> Iterator[str]:
    """A name to bind or connect ``path`` by: itself, or where it is too long for a socket's
    address (108 bytes), the same file through a descriptor of its directory
    (``/proc/self/fd/N/NAME``, Linux)."""
    if len(os.fsencode(path)) <= _SUN_PATH:
        yield str(path)
        return
    fd = os.open(path.parent, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        short = f"/proc/self/fd/{fd}/{path.name}"
        if not os.path.isdir(os.path.dirname(short)):
            raise ClusterStateError(
                f"The control socket's path {path} is over {_SUN_PATH} bytes and this system "
                "has no /proc/self/fd to reach it by; give the cluster a shorter run_dir."
            )
        yield short
    finally:
        os.close(fd)


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (None where the system does
    not tell: no ``SO_PEERCRED``, or not a Unix socket)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None or sock.family != getattr(socket, "AF_UNIX", None):
        return None
    _, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option, _CRED.size))
    return int(uid)


def listen(path: Path) -> socket.socket:
    """A socket listening at ``path`` (for the head; one a dead head left there is replaced),
    made 0600 before anyone can connect: a socket that does not listen yet refuses them."""
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with socket_name(path) as name:
            sock.bind(name)
            os.chmod(name, 0o600)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def unix_dial(path: Path) -> Dial:
    """A :data:`Dial` for the control socket at ``path`` on this machine, which refuses a
    socket served by another user."""

    def dial(deadline: float) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _connect_unix(sock, path, deadline)
            uid = peer_uid(sock)
            if uid is not None and uid != os.geteuid():
                raise ClusterStateError(
                    f"The control socket {path} is served by uid {uid}, not by you (uid "
                    f"{os.geteuid()}): it is not your cluster's head; nothing was sent to it."
                )
        except BaseException:
            sock.close()
            raise
        return sock

    return dial


def _connect_unix(sock: socket.socket, path: Path, deadline: float) -> None:
    """Connect ``sock`` to ``path`` by ``deadline``. A Unix socket whose backlog is full
    answers EAGAIN at once rather than queueing the caller (as TCP would): a head busy
    shedding a flood of idle connections is tried again, a little later each time."""
    pause = 0.005
    while True:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            with socket_name(path) as name:
                sock.connect(name)
            return
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.2)


# -- the client ----------------------------------------------------------------------------


class ControlClient:
    """Requests to a head: ``dial`` reaches it, ``token`` is the secret or the file that holds
    it, ``where`` names it in messages."""

    def __init__(
        self, dial: Dial, token: Path | bytes, *, where: str, timeout: float = 10.0
    ) -> None:
        self._dial = dial
        self._where = where
        self._secret = check_secret(token) if isinstance(token, bytes) else read_secret(token)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._chan: Channel | None = None

    def call(self, op: str, *, reply_within: float | None = None, **args: Any) -> dict[str, Any]:
        """Send request ``op`` and return its answer; raise the error the head answered
        with, or :class:`ClusterStateError` when the head cannot be reached or does not
        prove it is the cluster's."""
        payload = json.dumps({"op": op, **args}, default=_seconds).encode()
        with self._lock:
            try:
                chan = self._connect()
                chan.send(payload)
                wait = None if reply_within is None else time.monotonic() + reply_within
                reply = json.loads(chan.recv(wait))
            except ClusterError:
                self.close()
                raise
            except AuthFailed as exc:
                self.close()
                raise ClusterStateError(
                    f"The control socket {self._where} and this process do not share the "
                    f"cluster's secret ({exc}); nothing that shows it was sent. The token file "
                    "may be another cluster's, or the socket not this cluster's head."
                ) from None
            except Exception as exc:
                self.close()
                raise ClusterStateError(
                    f"Cannot reach the cluster's head at {self._where} "
                    f"({type(exc).__name__}: {exc}); it may have stopped."
                ) from exc
        if "error" in reply:
            raise rebuilt_error(reply["error"])
        return dict(reply)

    def _connect(self) -> Channel:
        if self._chan is None:
            deadline = time.monotonic() + self._timeout
            sock = self._dial(deadline)
            try:
                self._chan = _handshake(Channel(sock), self._secret, deadline)
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


def _handshake(chan: Channel, secret: bytes, deadline: float) -> Channel:
    """The client's side of the handshake (see the module's docstring)."""
    mine = secrets.token_bytes(NONCE)
    chan.send(MAGIC + mine)
    theirs = check_head(secret, mine, chan.recv(deadline, limit=NONCE + PROOF))
    chan.send(client_proof(secret, mine, theirs))
    answer = chan.recv(deadline, limit=1)
    if answer == REFUSED:
        raise AuthFailed("the head does not know this client's secret")
    if answer != ACCEPTED:
        raise ProtocolError("unexpected answer to the handshake")
    return chan


def answer(handlers: Mapping[str, Handler], payload: bytes) -> bytes:
    """The head's reply to the request ``payload``: what its handler returns, or the error."""
    try:
        request = json.loads(payload)
    except ValueError as exc:
        return _reply(error_reply(ClusterStateError(f"The head cannot read a request: {exc}.")))
    op = request.get("op") if isinstance(request, dict) else None
    handler = handlers.get(op) if isinstance(op, str) else None
    if handler is None:
        known = ", ".join(sorted(handlers))
        return _reply(
            error_reply(ClusterStateError(f"The head does not know request {op!r} ({known})."))
        )
    try:
        return _reply(dict(handler(request)))
    except ClusterError as exc:
        return _reply(error_reply(exc))
    except Exception as exc:  # a bug in the head must not kill its server
        _log.exception("Control request %r failed.", op)
        return _reply(error_reply(ClusterError(f"{type(exc).__name__}: {exc}")))


def _reply(reply: Mapping[str, Any]) -> bytes:
    data = json.dumps(reply).encode()
    if len(data) > MAX_FRAME:
        too_large = ClusterError(f"The head's answer to this request is over {MAX_FRAME} bytes.")
        return json.dumps(error_reply(too_large)).encode()
    return data


def error_reply(exc: ClusterError) -> dict[str, Any]:
    """The reply that says ``exc`` (:func:`rebuilt_error` raises it again)."""
    return {"error": {"type": type(exc).__name__, "message": str(exc)}}


def rebuilt_error(error: Mapping[str, Any]) -> ClusterError:
    """The head's error as this process's exception of the same type."""
    kind = getattr(errors, str(error.get("type")), None)
    message = str(error.get("message", ""))
    if not (isinstance(kind, type) and issubclass(kind, ClusterError)):
        kind = ClusterError
    exc = kind.__new__(kind)
    Exception.__init__(exc, message)
    return exc


def _seconds(value: object) -> float:
    """A request's duration given as a timedelta (a job's ``timeout``, ``deadline``), as the
    seconds the head reads; anything else JSON cannot carry is refused as ``json`` does."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
