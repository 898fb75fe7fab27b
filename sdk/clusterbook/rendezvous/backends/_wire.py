"""The wire protocol of the TCP rendezvous store, shared by its server and its clients.

The head runs a :class:`~clusterbook.rendezvous.backends.tcp_server.StoreServer`; every node (the
head too) talks to it through a :class:`~clusterbook.rendezvous.backends.tcp.TcpBackend`. Both
sides share a per-cluster secret (:func:`write_secret` makes the token file, :func:`read_secret`
reads it back). No pickle anywhere.

Wire protocol (version 3). The connection is TLS 1.3: the server shows its self-signed
certificate, and the client goes on only if its SHA-256 fingerprint is the one in the store's
URL (:mod:`._tls`), so everything below is encrypted and goes to the head and nowhere else.
Inside TLS, every frame is a 4-byte big-endian length and that many bytes. The handshake frames
are small (at most 256 bytes)::

    client -> server   MAGIC + client_nonce                      (nonces: 32 random bytes)
    server -> client   MAGIC + server_nonce + HMAC(secret, "server proof" | cn | sn)
    client -> server   HMAC(secret, "client proof" | cn | sn)

Each side checks the other's proof, so both prove they know the secret, which itself never
crosses the wire: a client that knows the fingerprint (it is in the join URL) but not the secret
is dropped before it can read or change anything. After the handshake every frame is
``payload + tag``, with ``tag = HMAC(key, seq | payload)``: one key per direction derived from
the secret and both nonces, ``seq`` counting that direction's frames. TLS already protects the
records; the tags bind every frame to the secret as well, and keep the same framing for the
head's control channel (:mod:`clusterbook.control`), which runs on 127.0.0.1 without TLS. A
frame cannot be forged, altered, replayed, reordered or moved to another connection; the peer
that tries is dropped. Frames hold at most :data:`MAX_FRAME` bytes.

Requests (client payloads) and their replies::

    H node              hello, the first request; announces the node id ("" for none) -> O
    G                   get                                   -> s has:u8 token:i64 state
    S spec state        compare-and-set                       -> r won:u8 token:i64 state
    U step              run a rendezvous step here            -> s has:u8 token:i64 state
    W spec timeout:f64  long-poll watch                       -> s has:u8 token:i64 state
    D spec timeout:f64  long-poll watch for decisions         -> s has:u8 token:i64 state
    B                   goodbye: the server closes the connection without calling on_lost

``spec`` is the caller's token: ``kind:u8 value:i64`` with kind 0 for None, 1 for an integer
and 2 for anything else (it matches no stored token, so it never wins a write and a watch on it
returns at once). ``step`` is a :class:`~clusterbook.rendezvous.step.Step` as JSON: the server
runs it on the stored state under its lock and stores what it writes, so a node joins in one
round trip however many join at once; while the step leaves its node waiting, the answer waits
too, as a ``D`` would (up to the step's ``wait``). ``D`` waits like ``W`` but sleeps through
writes that change no rendezvous decision (heartbeats, reports; see
:func:`~clusterbook.rendezvous.ops.decisions_may_change`).

Connection loss: when a connection that announced a node id ends without a goodbye (the process
died, the machine vanished, the network broke), the server waits ``lost_grace`` seconds; unless
the same node id connected again meanwhile, it calls ``on_lost(node, state)`` and writes what
that returns as the new state, so the other nodes learn of the loss at once instead of after
missed heartbeats.
"""

from __future__ import annotations

import errno
import hmac
import math
import secrets
import select
import socket
import ssl
import struct
import threading
import time
from hashlib import sha256
from urllib.parse import parse_qs, urlsplit

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.backends._secret import _check_secret as _check_secret
from clusterbook.rendezvous.backends._secret import read_secret as read_secret
from clusterbook.rendezvous.backends._secret import write_secret as write_secret
from clusterbook.rendezvous.backends._tls import check_fingerprint
from clusterbook.spec import validate_seconds

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

_MAGIC = b"CBRDZV2\n"
_NONCE = 32
_HANDSHAKE_MAX = 256
_WATCH_MAX = 86400.0
_MAX_NODE = 1024

_ANY, _NONE, _INT = 2, 0, 1
_POLLIN = getattr(select, "POLLIN", 1)
_POLLOUT = getattr(select, "POLLOUT", 4)


class _ProtocolError(Exception):
    """The peer broke the protocol: bad frame, bad tag, unexpected message."""


class _AuthFailed(Exception):
    """The peer does not know the secret."""


class _PeerClosed(ConnectionError):
    """The peer closed the connection."""


# --- addresses ------------------------------------------------------------------------------------


def parse_url(url: object) -> tuple[str, int]:
    """``(host, port)`` of a ``tcp://host:port`` URL (IPv6 hosts in brackets), which may name
    the store's certificate (``?fingerprint=sha256:HEX``)."""
    host, port, _ = parse_store_url(url)
    return host, port


def parse_store_url(url: object) -> tuple[str, int, str | None]:
    """``(host, port, fingerprint)`` of a store URL, the fingerprint None when it names none."""
    example = "tcp://host:port, for example tcp://10.0.0.1:29400"
    if not isinstance(url, str):
        raise ConfigError(f"The rendezvous store URL must be a string like {example}; got {url!r}.")
    try:
        parts = urlsplit(url)
        port = parts.port
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
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
        or set(query) - {"fingerprint"}
        or len(query.get("fingerprint", ())) > 1
        or parts.fragment
        or parts.username is not None
        or parts.password is not None
    ):
        raise ConfigError(f"The rendezvous store URL {url!r} is not of the form {example}.")
    fingerprint = None
    if "fingerprint" in query:
        fingerprint = check_fingerprint(query["fingerprint"][0], f"the URL {url!r}")
    return parts.hostname, port, fingerprint


def _format_url(host: str, port: int, fingerprint: str | None = None) -> str:
    url = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
    return url if fingerprint is None else f"{url}?fingerprint={fingerprint}"


def _seconds(value: object, name: str, *, zero: bool = False) -> float:
    seconds = validate_seconds(value, f"The {name}", zero=zero)
    assert seconds is not None
    return seconds


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
    """Authenticated frames over a connected socket (see the module docstring).

    Over TLS (an ``ssl.SSLSocket``, after its handshake) the socket is made non-blocking and
    every read and write of the TLS session takes one lock, waiting for the socket outside it:
    a client says goodbye from one thread while another waits for an answer, and OpenSSL does
    not allow one session to be used by two threads at once.
    """

    def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes) -> None:
        self.sock = sock
        self._send_key = send_key
        self._recv_key = recv_key
        self._send_seq = 0
        self._recv_seq = 0
        self._send_lock = threading.Lock()
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._io_lock = threading.Lock()
        if self._tls:
            sock.setblocking(False)

    def _tag(self, key: bytes, seq: int, payload: bytes) -> bytes:
        mac = hmac.new(key, _SEQ.pack(seq), sha256)
        mac.update(payload)
        return mac.digest()

    def send(self, payload: bytes, deadline: float | None = None) -> None:
        """Send one frame; over TLS, raise :class:`TimeoutError` if it cannot go out by
        ``deadline`` (a plain socket keeps the timeout it has)."""
        size = len(payload) + _TAG
        if size > MAX_FRAME:
            raise _ProtocolError(f"frame of {size} bytes is over the {MAX_FRAME}-byte limit")
        with self._send_lock:
            tag = self._tag(self._send_key, self._send_seq, payload)
            self._send_seq += 1
            data = b"".join((_LEN.pack(size), payload, tag))
            if self._tls:
                self._send_tls(data, deadline)
            else:
                self.sock.sendall(data)

    def recv(self, deadline: float | None) -> bytes:
        (size,) = _LEN.unpack(self._recv_exact(_LEN.size, deadline))
        if size < _TAG or size > MAX_FRAME:
            raise _ProtocolError(f"frame of {size} bytes (limit {MAX_FRAME})")
        body = self._recv_exact(size, deadline)
        payload, tag = body[:-_TAG], body[-_TAG:]
        if not hmac.compare_digest(tag, self._tag(self._recv_key, self._recv_seq, payload)):
            raise _ProtocolError("frame with a bad tag (forged, altered or replayed)")
        self._recv_seq += 1
        return payload

    def readable(self) -> bool:
        """Whether a read would not wait: data (or the end of the connection) is there."""
        if self._tls and self.sock.pending():  # type: ignore[attr-defined]
            return True
        return _readable(self.sock, 0)

    def _recv_exact(self, size: int, deadline: float | None) -> bytes:
        if not self._tls:
            return _recv_exact(self.sock, size, deadline)
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            with self._io_lock:
                try:
                    n = self.sock.recv_into(view[got:], size - got)
                except (ssl.SSLWantReadError, BlockingIOError):
                    n = -1
                except ssl.SSLWantWriteError:
                    n = -2
            if n == 0:
                raise _PeerClosed("the peer closed the connection")
            if n > 0:
                got += n
            else:
                _wait(self.sock, _POLLIN if n == -1 else _POLLOUT, deadline)
        return bytes(buf)

    def _send_tls(self, data: bytes, deadline: float | None) -> None:
        view = memoryview(data)
        while view:
            with self._io_lock:
                try:
                    view = view[self.sock.send(view) :]
                    continue
                except (ssl.SSLWantWriteError, BlockingIOError):
                    event = _POLLOUT
                except ssl.SSLWantReadError:
                    event = _POLLIN
            _wait(self.sock, event, deadline)


def _shutdown(sock: socket.socket, how: int) -> None:
    """Shut the connection down; a TLS socket keeps its session (``SSLSocket.shutdown`` drops
    it, and another thread may be reading it)."""
    socket.socket.shutdown(sock, how)


def _wait(sock: socket.socket, event: int, deadline: float | None) -> None:
    """Wait until ``sock`` is ready for ``event`` (POLLIN or POLLOUT), or raise at ``deadline``."""
    if sock.fileno() < 0:
        raise OSError(errno.EBADF, "closed socket")
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        raise TimeoutError("timed out")
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, event)
        ready = bool(poller.poll(None if left is None else max(1, math.ceil(left * 1000))))
    else:
        reads, writes = ([sock], []) if event == _POLLIN else ([], [sock])
        ready = any(select.select(reads, writes, [], left)[:2])
    if not ready:
        raise TimeoutError("timed out")


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
