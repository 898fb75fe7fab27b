"""A rendezvous store served over TCP by the head, and the backend its nodes use to reach it.

The head runs a :class:`StoreServer`; every node (the head too) talks to it through a
:class:`TcpBackend`. Both sides share a per-cluster secret (:func:`write_secret` makes the token
file, :func:`read_secret` reads it back). No pickle anywhere.

Wire protocol (version 1). Every frame is a 4-byte big-endian length and that many bytes. The
handshake frames are small (at most 256 bytes) and not authenticated::

    client -> server   MAGIC + client_nonce                      (nonces: 32 random bytes)
    server -> client   MAGIC + server_nonce + HMAC(secret, "server proof" | cn | sn)
    client -> server   HMAC(secret, "client proof" | cn | sn)

Each side checks the other's proof, so both prove they know the secret, which itself never
crosses the wire. After the handshake every frame is ``payload + tag``, with
``tag = HMAC(key, seq | payload)``: one key per direction derived from the secret and both
nonces, ``seq`` counting that direction's frames. A frame cannot be forged, altered, replayed,
reordered or moved to another connection; the peer that tries is dropped. Frames hold at most
:data:`MAX_FRAME` bytes. Frames are authenticated, not encrypted: whoever sees the traffic can
read the state (node ids, ranks, heartbeat times), but cannot change it.

Requests (client payloads) and their replies::

    H node              hello, the first request; announces the node id ("" for none) -> O
    G                   get                                   -> s has:u8 token:i64 state
    S spec state        compare-and-set                       -> r won:u8 token:i64 state
    W spec timeout:f64  long-poll watch                       -> s has:u8 token:i64 state
    B                   goodbye: the server closes the connection without calling on_lost

``spec`` is the caller's token: ``kind:u8 value:i64`` with kind 0 for None, 1 for an integer
and 2 for anything else (it matches no stored token, so it never wins a write and a watch on it
returns at once).

Connection loss: when a connection that announced a node id ends without a goodbye (the process
died, the machine vanished, the network broke), the server waits ``lost_grace`` seconds; unless
the same node id connected again meanwhile, it calls ``on_lost(node, state)`` and writes what
that returns as the new state, so the other nodes learn of the loss at once instead of after
missed heartbeats.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import logging
import math
import os
import secrets
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from hashlib import sha256
from typing import Any
from urllib.parse import urlsplit

from clusterbook.errors import ClusterStateError, ConfigError
from clusterbook.rendezvous.api import RendezvousBackend, RendezvousConnectionError, Token

__all__ = [
    "MAX_FRAME",
    "MAX_STATE",
    "StoreServer",
    "TcpBackend",
    "parse_url",
    "read_secret",
    "write_secret",
]

_log = logging.getLogger(__name__)

MAX_FRAME = 16 * 1024 * 1024
"""The largest frame (payload and tag) either side sends or accepts, in bytes."""

_TAG = 32
_LEN = struct.Struct(">I")
_SEQ = struct.Struct(">Q")
_SPEC = struct.Struct(">Bq")
_HEAD = struct.Struct(">Bq")
_SECONDS = struct.Struct(">d")

MAX_STATE = MAX_FRAME - _TAG - 1 - _HEAD.size
"""The largest state the store holds, in bytes."""

_MAGIC = b"CBRDZV1\n"
_NONCE = 32
_HANDSHAKE_MAX = 256
_HANDSHAKE_TIMEOUT = 10.0
_WATCH_MAX = 86400.0
_POLL = 0.05
_MIN_SECRET = 16
_MAX_NODE = 1024
_MAX_CONNECTIONS = 1024
_LOST_ATTEMPTS = 100
_JOIN = 5.0

_ANY, _NONE, _INT = 2, 0, 1


class _ProtocolError(Exception):
    """The peer broke the protocol: bad frame, bad tag, unexpected message."""


class _AuthFailed(Exception):
    """The peer does not know the secret."""


class _PeerClosed(ConnectionError):
    """The peer closed the connection."""


class _Goodbye(Exception):
    """The client said goodbye."""


class _Stopping(Exception):
    """The server is closing."""


# --- secrets --------------------------------------------------------------------------------------


def _check_secret(secret: object) -> bytes:
    if not isinstance(secret, bytes):
        raise ConfigError(
            f"The rendezvous secret must be bytes, got {type(secret).__name__}; use "
            "read_secret(path) on the cluster's token file."
        )
    if len(secret) < _MIN_SECRET:
        raise ConfigError(
            f"The rendezvous secret is {len(secret)} bytes; it must have at least {_MIN_SECRET} "
            "(write_secret() makes a random 32-byte one)."
        )
    return secret


def write_secret(path: str | os.PathLike[str], secret: bytes | None = None) -> bytes:
    """Create the token file ``path`` holding ``secret`` (random 32 bytes if None) in hex.

    The file is created with mode 0600 in one step, so it is never readable by others, not even
    for a moment; an existing file is never overwritten. Returns the secret.
    """
    secret = _check_secret(secrets.token_bytes(32) if secret is None else secret)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise ConfigError(
            f"Refusing to overwrite the secret file {os.fspath(path)}: it exists. Read it with "
            "read_secret(), or delete it first to give the cluster a new secret (every node "
            "must then use the new one)."
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"Cannot create the secret file {os.fspath(path)}: {exc.strerror or exc}."
        ) from exc
    try:
        data = memoryview(secret.hex().encode() + b"\n")
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return secret


def read_secret(path: str | os.PathLike[str]) -> bytes:
    """The secret in the token file ``path`` (see :func:`write_secret`).

    Refuses a file that its group or other users may access: a secret others can read is no
    secret.
    """
    name = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(
            f"There is no secret file at {name}; the head writes it with write_secret()."
        ) from None
    except OSError as exc:
        raise ConfigError(f"Cannot read the secret file {name}: {exc.strerror or exc}.") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"The secret file {name} is not a regular file.")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"The secret file {name} is open to its group or other users (mode "
                f"{mode:04o}); run `chmod 600 {name}` so only its owner can read it."
            )
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        secret = bytes.fromhex(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise ConfigError(
            f"The secret file {name} does not hold a hex secret; write it with write_secret()."
        ) from None
    return _check_secret(secret)


# --- addresses ------------------------------------------------------------------------------------


def parse_url(url: object) -> tuple[str, int]:
    """``(host, port)`` of a ``tcp://host:port`` URL (IPv6 hosts in brackets)."""
    example = "tcp://host:port, for example tcp://10.0.0.1:29400"
    if not isinstance(url, str):
        raise ConfigError(f"The rendezvous store URL must be a string like {example}; got {url!r}.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(
            f"The rendezvous store URL {url!r} is not valid ({exc}); use {example}."
        ) from None
    if (
        url != url.strip()
        or parts.scheme != "tcp"
        or not parts.hostname
        or port is None
        or port == 0
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
        or parts.password is not None
    ):
        raise ConfigError(f"The rendezvous store URL {url!r} is not of the form {example}.")
    return parts.hostname, port


def _format_url(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _seconds(value: object, name: str, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"The {name} must be a number of seconds, got {value!r}.")
    if value < 0 or (value == 0 and not zero):
        raise ConfigError(f"The {name} must be greater than {'or equal to ' if zero else ''}0.")
    return float(value)


# --- framing --------------------------------------------------------------------------------------


def _readable(sock: socket.socket, timeout: float) -> bool:
    """Whether ``sock`` has data or an end of file to read (poll: no FD_SETSIZE limit)."""
    if sock.fileno() < 0:
        raise OSError(errno.EBADF, "closed socket")
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout * 1000))))
    return bool(select.select([sock], [], [], timeout)[0])


def _recv_exact(sock: socket.socket, size: int, deadline: float | None) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            sock.settimeout(left)
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise _PeerClosed("the peer closed the connection")
        got += n
    return bytes(buf)


def _send_plain(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LEN.pack(len(payload)) + payload)


def _recv_plain(sock: socket.socket, deadline: float | None) -> bytes:
    (size,) = _LEN.unpack(_recv_exact(sock, _LEN.size, deadline))
    if size > _HANDSHAKE_MAX:
        raise _ProtocolError(f"handshake frame of {size} bytes")
    return _recv_exact(sock, size, deadline)


def _derive(secret: bytes, label: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    message = b"clusterbook rendezvous v1 " + label + b"\x00" + client_nonce + server_nonce
    return hmac.digest(secret, message, "sha256")


class _Channel:
    """Authenticated frames over a connected socket (see the module docstring)."""

    def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes) -> None:
        self.sock = sock
        self._send_key = send_key
        self._recv_key = recv_key
        self._send_seq = 0
        self._recv_seq = 0
        self._send_lock = threading.Lock()

    def _tag(self, key: bytes, seq: int, payload: bytes) -> bytes:
        mac = hmac.new(key, _SEQ.pack(seq), sha256)
        mac.update(payload)
        return mac.digest()

    def send(self, payload: bytes) -> None:
        size = len(payload) + _TAG
        if size > MAX_FRAME:
            raise _ProtocolError(f"frame of {size} bytes is over the {MAX_FRAME}-byte limit")
        with self._send_lock:
            tag = self._tag(self._send_key, self._send_seq, payload)
            self._send_seq += 1
            self.sock.sendall(b"".join((_LEN.pack(size), payload, tag)))

    def recv(self, deadline: float | None) -> bytes:
        (size,) = _LEN.unpack(_recv_exact(self.sock, _LEN.size, deadline))
        if size < _TAG or size > MAX_FRAME:
            raise _ProtocolError(f"frame of {size} bytes (limit {MAX_FRAME})")
        body = _recv_exact(self.sock, size, deadline)
        payload, tag = body[:-_TAG], body[-_TAG:]
        if not hmac.compare_digest(tag, self._tag(self._recv_key, self._recv_seq, payload)):
            raise _ProtocolError("frame with a bad tag (forged, altered or replayed)")
        self._recv_seq += 1
        return payload


def _client_handshake(sock: socket.socket, secret: bytes, deadline: float | None) -> _Channel:
    client_nonce = secrets.token_bytes(_NONCE)
    _send_plain(sock, _MAGIC + client_nonce)
    reply = _recv_plain(sock, deadline)
    if len(reply) != len(_MAGIC) + _NONCE + 32 or not reply.startswith(_MAGIC):
        raise _ProtocolError("the peer is not a clusterbook rendezvous store of this version")
    server_nonce, proof = reply[len(_MAGIC) : -32], reply[-32:]
    if not hmac.compare_digest(proof, _derive(secret, b"server proof", client_nonce, server_nonce)):
        raise _AuthFailed("the store's secret differs from this client's")
    _send_plain(sock, _derive(secret, b"client proof", client_nonce, server_nonce))
    return _Channel(
        sock,
        send_key=_derive(secret, b"client to server", client_nonce, server_nonce),
        recv_key=_derive(secret, b"server to client", client_nonce, server_nonce),
    )


def _server_handshake(sock: socket.socket, secret: bytes, deadline: float | None) -> _Channel:
    hello = _recv_plain(sock, deadline)
    if len(hello) != len(_MAGIC) + _NONCE or not hello.startswith(_MAGIC):
        raise _ProtocolError("not a clusterbook rendezvous client of this version")
    client_nonce = hello[len(_MAGIC) :]
    server_nonce = secrets.token_bytes(_NONCE)
    proof = _derive(secret, b"server proof", client_nonce, server_nonce)
    _send_plain(sock, _MAGIC + server_nonce + proof)
    answer = _recv_plain(sock, deadline)
    if not hmac.compare_digest(
        answer, _derive(secret, b"client proof", client_nonce, server_nonce)
    ):
        raise _AuthFailed("the client does not know the secret")
    return _Channel(
        sock,
        send_key=_derive(secret, b"server to client", client_nonce, server_nonce),
        recv_key=_derive(secret, b"client to server", client_nonce, server_nonce),
    )


def _tune(sock: socket.socket) -> None:
    """Small frames go out at once; a peer that vanished without a word is noticed in ~20 s."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 3), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError:
        pass


def _spec(token: object) -> bytes:
    if token is None:
        return _SPEC.pack(_NONE, 0)
    if isinstance(token, int) and not isinstance(token, bool) and -(2**63) <= token < 2**63:
        return _SPEC.pack(_INT, token)
    return _SPEC.pack(_ANY, 0)


# --- server ---------------------------------------------------------------------------------------


class StoreServer:
    """The rendezvous store the head serves: one state blob and its fencing token.

    ``on_lost(node, state)`` is called (on a thread of the server) when the connection of a
    node that announced its id ended without a goodbye and the node did not connect again within
    ``lost_grace`` seconds; bytes it returns become the new state (a new token; watchers wake),
    None leaves the state as it is. It is not called while no state was ever set. If the state
    changes while it runs, it is called again with the newer state.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        secret: bytes,
        lost_grace: float = 0.25,
        on_lost: Callable[[str, bytes], bytes | None] | None = None,
    ) -> None:
        if not isinstance(host, str) or not host:
            raise ConfigError(
                f"The store server's host must be a host name or address, got {host!r}."
            )
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(
                f"The store server's port must be 0..65535 (0: any free one), got {port!r}."
            )
        if on_lost is not None and not callable(on_lost):
            raise ConfigError(f"on_lost must be a callable or None, got {on_lost!r}.")
        self._host = host
        self._port = port
        self._secret = _check_secret(secret)
        self._lost_grace = _seconds(lost_grace, "lost grace", zero=True)
        self._on_lost = on_lost
        self._cond = threading.Condition()
        self._state: bytes | None = None
        self._token: Token = 0
        self._closed = False
        self._listener: socket.socket | None = None
        self._address: tuple[str, int] | None = None
        self._wake: tuple[int, int] | None = None
        self._accepter: threading.Thread | None = None
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._live: dict[str, int] = {}
        self._generation: dict[str, int] = {}
        self._timers: list[threading.Timer] = []

    # lifecycle

    def start(self) -> StoreServer:
        """Listen and serve on background threads; returns the server."""
        with self._cond:
            if self._closed:
                raise ClusterStateError("This store server is closed; start a new StoreServer.")
            if self._listener is not None:
                return self
            try:
                family, kind, proto, _, sockaddr = socket.getaddrinfo(
                    self._host, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
                )[0]
            except socket.gaierror as exc:
                raise ConfigError(
                    f"The store server cannot listen on {self._host!r}: {exc.strerror}."
                ) from None
            listener = socket.socket(family, kind, proto)
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(sockaddr)
                listener.listen(128)
                listener.setblocking(False)
            except OSError as exc:
                listener.close()
                raise ConfigError(
                    f"The store server cannot listen on {self._host}:{self._port} "
                    f"({exc.strerror or exc}); pick another port (0 picks a free one)."
                ) from None
            self._listener = listener
            self._address = (self._host, listener.getsockname()[1])
            self._wake = os.pipe()
            self._accepter = threading.Thread(
                target=self._accept_loop, name="clusterbook-store-accept", daemon=True
            )
            self._accepter.start()
        return self

    def close(self) -> None:
        """Stop serving: close every connection and join the server's threads. Idempotent."""
        with self._cond:
            first = not self._closed
            self._closed = True
            self._cond.notify_all()
            for sock in self._connections:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            threads = list(self._connections.values())
            timers = list(self._timers)
        if first and self._wake is not None:
            os.write(self._wake[1], b"x")
        for timer in timers:
            timer.cancel()
        for thread in [self._accepter, *threads, *timers]:
            if thread is not None and thread is not threading.current_thread():
                thread.join(_JOIN)
        with self._cond:
            wake, self._wake = self._wake, None
        if wake is not None:
            for fd in wake:
                os.close(fd)

    def __enter__(self) -> StoreServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the server listens on."""
        if self._address is None:
            raise ClusterStateError("The store server has no address before start().")
        return self._address

    @property
    def url(self) -> str:
        """``tcp://host:port`` for :class:`TcpBackend`."""
        return _format_url(*self.address)

    @property
    def connected_nodes(self) -> frozenset[str]:
        """Node ids with a live connection now."""
        with self._cond:
            return frozenset(self._live)

    # connections

    def _accept_loop(self) -> None:
        listener, wake = self._listener, self._wake
        assert listener is not None
        assert wake is not None
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        poller.register(wake[0], select.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if wake[0] in events:
                    return
                try:
                    sock, _ = listener.accept()
                except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                    continue
                except OSError as exc:
                    _log.warning("The rendezvous store could not accept a connection: %s", exc)
                    time.sleep(0.1)
                    continue
                with self._cond:
                    if self._closed or len(self._connections) >= _MAX_CONNECTIONS:
                        sock.close()
                        continue
                    thread = threading.Thread(
                        target=self._serve, args=(sock,), name="clusterbook-store-conn", daemon=True
                    )
                    self._connections[sock] = thread
                    thread.start()
        finally:
            listener.close()

    def _serve(self, sock: socket.socket) -> None:
        node: str | None = None
        announced = clean = False
        try:
            sock.settimeout(_HANDSHAKE_TIMEOUT)
            _tune(sock)
            deadline = time.monotonic() + _HANDSHAKE_TIMEOUT
            chan = _server_handshake(sock, self._secret, deadline)
            hello = chan.recv(deadline)
            if hello[:1] != b"H" or len(hello) > 1 + _MAX_NODE:
                raise _ProtocolError("expected a hello")
            node = hello[1:].decode("utf-8") or None
            self._session_started(node)
            announced = True
            chan.send(b"O")
            sock.settimeout(None)
            while True:
                request = chan.recv(None)
                if request == b"B":
                    clean = True
                    return
                chan.send(self._handle(chan, request))
        except _Goodbye:
            clean = True
        except _AuthFailed:
            _log.warning("The rendezvous store refused a client: authentication failed.")
        except (_Stopping, _PeerClosed):
            pass
        except (OSError, _ProtocolError, UnicodeDecodeError) as exc:
            _log.info("The rendezvous store dropped a connection: %s", exc)
        finally:
            if announced:
                self._session_ended(node, clean)
            with self._cond:
                self._connections.pop(sock, None)
                sock.close()

    def _handle(self, chan: _Channel, request: bytes) -> bytes:
        op, body = request[:1], request[1:]
        if op == b"G" and not body:
            with self._cond:
                return self._reply_state()
        if op in (b"S", b"W") and len(body) >= _SPEC.size:
            kind, value = _SPEC.unpack_from(body)
            if kind not in (_NONE, _INT, _ANY):
                raise _ProtocolError(f"token kind {kind}")
            if op == b"S":
                return self._set(kind, value, body[_SPEC.size :])
            if len(body) == _SPEC.size + _SECONDS.size:
                (timeout,) = _SECONDS.unpack_from(body, _SPEC.size)
                return self._watch(chan, kind, value, timeout)
        raise _ProtocolError(f"unexpected request {op!r} of {len(request)} bytes")

    # the store (call with self._cond held)

    def _matches(self, kind: int, value: int) -> bool:
        current = None if self._state is None else self._token
        if kind == _NONE:
            return current is None
        return kind == _INT and current == value

    def _reply_state(self) -> bytes:
        if self._state is None:
            return b"s" + _HEAD.pack(0, 0)
        return b"s" + _HEAD.pack(1, self._token) + self._state

    def _write(self, state: bytes) -> None:
        self._state = state
        self._token += 1
        self._cond.notify_all()

    def _set(self, kind: int, value: int, state: bytes) -> bytes:
        with self._cond:
            won = self._matches(kind, value)
            if won:
                self._write(state)
            return b"r" + _HEAD.pack(won, self._token) + (self._state or b"")

    def _watch(self, chan: _Channel, kind: int, value: int, timeout: float) -> bytes:
        timeout = min(_WATCH_MAX, timeout) if timeout > 0 else 0.0  # NaN -> 0
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                for waited in (False, True):
                    if self._closed:
                        raise _Stopping
                    left = deadline - time.monotonic()
                    if not self._matches(kind, value) or left <= 0:
                        return self._reply_state()
                    if not waited:
                        self._cond.wait(min(left, _POLL))
            # A waiting client sends nothing but a goodbye: notice it, or the end of the
            # connection, while waiting, so a node that dies in a watch is seen as lost.
            if _readable(chan.sock, 0):
                if chan.recv(None) == b"B":
                    raise _Goodbye
                raise _ProtocolError("a request during a watch")

    # sessions

    def _session_started(self, node: str | None) -> None:
        if node is None:
            return
        with self._cond:
            self._live[node] = self._live.get(node, 0) + 1
            self._generation[node] = self._generation.get(node, 0) + 1

    def _session_ended(self, node: str | None, clean: bool) -> None:
        if node is None:
            return
        with self._cond:
            left = self._live.get(node, 0) - 1
            if left > 0:
                self._live[node] = left
                return
            self._live.pop(node, None)
            if clean or self._closed or self._on_lost is None:
                return
            timer = threading.Timer(
                self._lost_grace, self._lost, args=(node, self._generation.get(node, 0))
            )
            timer.name = "clusterbook-store-lost"
            timer.daemon = True
            self._timers = [t for t in self._timers if t.is_alive()]
            self._timers.append(timer)
            timer.start()

    def _still_lost(self, node: str, generation: int) -> bool:
        return (
            not self._closed
            and node not in self._live
            and self._generation.get(node, 0) == generation
        )

    def _lost(self, node: str, generation: int) -> None:
        assert self._on_lost is not None
        for _ in range(_LOST_ATTEMPTS):
            with self._cond:
                if not self._still_lost(node, generation) or self._state is None:
                    return
                state, token = self._state, self._token
            try:
                new = self._on_lost(node, state)
            except Exception:
                _log.exception("on_lost(%r) failed; the state is left as it was.", node)
                return
            if new is None:
                return
            if not isinstance(new, bytes) or len(new) > MAX_STATE:
                _log.error(
                    "on_lost(%r) returned %s, not bytes of at most %d; the state is left as is.",
                    node,
                    type(new).__name__,
                    MAX_STATE,
                )
                return
            with self._cond:
                if not self._still_lost(node, generation):
                    return
                if self._token == token:
                    self._write(new)
                    return
        _log.warning("on_lost(%r): the state kept changing; gave up.", node)


# --- client ---------------------------------------------------------------------------------------


class TcpBackend(RendezvousBackend):
    """A client of a :class:`StoreServer` at ``url`` (``tcp://host:port``).

    Keeps one connection, made on first use and again whenever it was lost; calls from several
    threads take turns on it. ``node`` announces this client as that node, for the server's
    connection-loss fast path; :meth:`close` says goodbye so a node that leaves is not taken
    for lost. Every call raises :class:`RendezvousConnectionError` within ``timeout`` seconds
    (a watch: its own timeout plus that) when the store cannot be reached or does not answer.
    """

    name = "tcp"

    def __init__(
        self, url: str, secret: bytes, *, node: str | None = None, timeout: float = 5.0
    ) -> None:
        self._host, self._port = parse_url(url)
        self._url = _format_url(self._host, self._port)
        self._secret = _check_secret(secret)
        if node is not None and (
            not isinstance(node, str) or not node or len(node.encode("utf-8")) > _MAX_NODE
        ):
            raise ConfigError(
                f"The node id must be a non-empty string of at most {_MAX_NODE} bytes, "
                f"got {node!r}."
            )
        self._node = node
        self._timeout = _seconds(timeout, "store timeout")
        self._lock = threading.Lock()
        self._chan: _Channel | None = None
        self._closed = False

    @property
    def url(self) -> str:
        return self._url

    @property
    def node(self) -> str | None:
        return self._node

    def get_state(self) -> tuple[bytes, Token] | None:
        return self._call(lambda _left: b"G", b"s", idempotent=True)

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool]:
        if not isinstance(state, bytes):
            raise TypeError(f"state must be bytes, got {type(state).__name__}")
        if len(state) > MAX_STATE:
            raise ConfigError(
                f"The rendezvous state is {len(state)} bytes; the store holds at most "
                f"{MAX_STATE} bytes."
            )
        request = b"S" + _spec(token) + state
        return self._call(lambda _left: request, b"r", idempotent=False)

    def watch(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        wait = min(_WATCH_MAX, float(timeout)) if timeout > 0 else 0.0  # NaN -> 0
        spec = _spec(token)
        return self._call(
            lambda left: b"W" + spec + _SECONDS.pack(left), b"s", idempotent=True, wait=wait
        )

    def close(self) -> None:
        """Say goodbye and close the connection. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        first = self._chan
        if first is not None:  # also ends a watch in progress: the store closes after a goodbye
            _goodbye(first)
        if self._lock.acquire(timeout=self._timeout):
            try:
                chan, self._chan = self._chan, None
                if chan is not None:
                    if chan is not first:
                        _goodbye(chan)
                    _drain(chan.sock, time.monotonic() + self._timeout)
                    chan.sock.close()
            finally:
                self._lock.release()
        else:  # a call is stuck waiting on the store: end it
            for chan in {first, self._chan} - {None}:
                with contextlib.suppress(OSError):
                    chan.sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> TcpBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # internals

    def _drop(self) -> None:
        chan, self._chan = self._chan, None
        if chan is not None:
            chan.sock.close()

    def _connect(self, deadline: float) -> _Channel:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock = socket.create_connection((self._host, self._port), timeout=left)
        try:
            _tune(sock)
            chan = _client_handshake(sock, self._secret, deadline)
            chan.send(b"H" + (self._node or "").encode("utf-8"))
            if chan.recv(deadline) != b"O":
                raise _ProtocolError("unexpected answer to the hello")
        except BaseException:
            sock.close()
            raise
        return chan

    def _call(
        self,
        request: Callable[[float], bytes],
        kind: bytes,
        *,
        idempotent: bool,
        wait: float = 0.0,
    ) -> Any:
        with self._lock:
            start = time.monotonic()
            for attempt in (1, 2):
                chan = self._chan
                reused = chan is not None
                if chan is not None and _stale(chan.sock):
                    self._drop()
                    chan, reused = None, False
                if self._closed:
                    self._drop()
                    raise self._closed_error()
                try:
                    if chan is None:
                        chan = self._chan = self._connect(start + self._timeout)
                        if self._closed:  # close() began meanwhile and may not have seen it
                            _goodbye(chan)
                            self._drop()
                            raise self._closed_error()
                    chan.send(request(max(0.0, start + wait - time.monotonic())))
                    return _decode(chan.recv(start + self._timeout + wait), kind)
                except _AuthFailed as exc:
                    self._drop()
                    raise RendezvousConnectionError(
                        f"Authentication with the rendezvous store at {self._url} failed: {exc}. "
                        "Every node must use the cluster's secret: read_secret() on the token "
                        "file the head wrote with write_secret()."
                    ) from None
                except (OSError, _ProtocolError) as exc:
                    self._drop()
                    retry = reused and idempotent and not isinstance(exc, TimeoutError)
                    if attempt == 1 and retry and not self._closed:
                        continue
                    raise self._unreachable(exc, wait) from exc
            raise AssertionError("unreachable")  # pragma: no cover

    def _closed_error(self) -> RendezvousConnectionError:
        return RendezvousConnectionError(
            f"This client of the rendezvous store at {self._url} is closed; make a new TcpBackend."
        )

    def _unreachable(self, exc: BaseException, wait: float) -> RendezvousConnectionError:
        if self._closed:
            return RendezvousConnectionError(
                f"This client of the rendezvous store at {self._url} was closed during the call."
            )
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {self._timeout + wait:g} s"
        elif isinstance(exc, ConnectionRefusedError):
            reason = "connection refused: nothing listens there"
        elif isinstance(exc, socket.gaierror):
            reason = f"the host name {self._host!r} does not resolve"
        elif isinstance(exc, _PeerClosed):
            reason = "the store closed the connection"
        elif isinstance(exc, _ProtocolError):
            reason = f"protocol error: {exc}"
        else:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return RendezvousConnectionError(
            f"Cannot reach the rendezvous store at {self._url} ({reason}). Check that the head's "
            f"store server is running and listening there, and that this machine can reach "
            f"{self._host} port {self._port} (address, firewall)."
        )


def _stale(sock: socket.socket) -> bool:
    """Whether a connection between calls is unusable: nothing may arrive then, so anything
    readable means the store closed it (or broke the protocol)."""
    try:
        return _readable(sock, 0)
    except (OSError, ValueError):
        return True


def _goodbye(chan: _Channel) -> None:
    try:
        chan.send(b"B")
        chan.sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _drain(sock: socket.socket, deadline: float) -> None:
    """Read until the peer closes (it took the goodbye in) or ``deadline``."""
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                return
    except OSError:
        pass


def _decode(reply: bytes, kind: bytes) -> Any:
    if reply[:1] != kind or len(reply) < 1 + _HEAD.size:
        raise _ProtocolError(f"unexpected reply {reply[:1]!r}")
    flag, token = _HEAD.unpack_from(reply, 1)
    state = reply[1 + _HEAD.size :]
    if kind == b"r":
        return state, token, bool(flag)
    return (state, token) if flag else None
