"""The wire protocol of the TCP rendezvous store: frames, the hello, the requests and replies.

The head runs a :class:`~clusterbook.rendezvous.backends.tcp_server.StoreServer`; every node (the
head too) talks to it through a :class:`~clusterbook.rendezvous.backends.tcp.TcpBackend`. Both
sides share a per-cluster secret (:func:`write_secret` makes the token file, :func:`read_secret`
reads it back). No pickle anywhere.

Wire protocol (version 4). The connection is TLS 1.3 and nothing else protects it: the server
shows its self-signed certificate, and the client goes on only if its SHA-256 fingerprint is the
one in the store's URL (:mod:`._tls`), so everything below is encrypted, authenticated and goes
to the head and nowhere else. Inside TLS, a message is a frame: a 4-byte big-endian length
(:data:`FRAME_HEADER`) and that many bytes, at most :data:`MAX_FRAME`.

The client's first frame is its hello (:func:`hello`), which proves it holds the cluster's
secret (like a bearer token over HTTPS: only the pinned head ever sees it)::

    client -> server   MAGIC + len:u16 + secret + node          (node: its id, "" for none)
    server -> client   O        (accepted)   or   N, then the end (refused: another secret)

Before the hello is accepted the server answers nothing and takes no frame over
:data:`HELLO_MAX` bytes, so a peer without the secret learns nothing and changes nothing.

Requests (client payloads) and their replies (:data:`HEAD` is ``has:u8 token:i64``, or
``won:u8 token:i64``)::

    G                   get                                   -> s has:u8 token:i64 state
    S spec state        compare-and-set                       -> r won:u8 token:i64 state
    U step              run a rendezvous step here            -> s has:u8 token:i64 state
    W spec timeout:f64  long-poll watch                       -> s has:u8 token:i64 state
    D spec timeout:f64  long-poll watch for decisions         -> s has:u8 token:i64 state
    M spec timeout:f64  long-poll watch for members           -> s has:u8 token:i64 state
    R spec timeout:f64  long-poll watch, read in parts         -> p has:u8 token:i64 total:u64 part
    N offset:u64        the next part of that read            -> p has:u8 token:i64 total:u64 part
    B                   goodbye: the server closes the connection without calling on_lost

One request at a time per connection: the next goes once the reply came (a goodbye may come
while a watch waits). ``spec`` (:data:`SPEC`, made by :func:`token_spec`) is the caller's token:
``kind:u8 value:i64`` with kind :data:`TOKEN_NONE` for None, :data:`TOKEN_INT` for an integer
and :data:`TOKEN_ANY` for anything else (it matches no stored token, so it never wins a write
and a watch on it returns at once). ``step`` is a :class:`~clusterbook.rendezvous.step.Step` as
JSON: the server runs it on the stored state and stores what it writes, so a node joins in one
round trip however many join at once; while the step leaves its node waiting, the answer waits
too, as a ``D`` would (up to the step's ``wait``). ``D`` waits like ``W`` but sleeps through
writes that change no rendezvous decision (heartbeats, reports; see
:func:`~clusterbook.rendezvous.ops.decisions_may_change`); ``M`` sleeps through writes that
change only heartbeats and reports (:func:`~clusterbook.rendezvous.ops.members_may_change`).
A watch waits :data:`WATCH_MAX` seconds at most.

``R`` waits like ``W`` and answers the state in parts of at most :data:`PART_SIZE` bytes: the
first with the answer, each next one to an ``N`` that names its offset, all of the one state
the answer was (the server keeps it for the connection until its last part went, or the next
request): how the head reads a state larger than a frame (:data:`MAX_WHOLE`). A ``G``, ``S``
or ``W`` whose answer would be larger ends the connection, saying so in the server's log.

Connection loss: when a connection that announced a node id ends without a goodbye (the process
died, the machine vanished, the network broke), the server waits ``lost_grace`` seconds; unless
the same node id connected again meanwhile, it calls ``on_lost(node, state)`` and writes what
that returns as the new state, so the other nodes learn of the loss at once instead of after
missed heartbeats.

The same frames (:data:`FRAME_HEADER` and a payload, read by a :class:`Channel`, served by
:mod:`.tcp_loop`) carry the head's control channel (:mod:`clusterbook.head.control`), which has
a handshake of its own, and what an attached handle reads of a cluster's directory
(:mod:`clusterbook.cluster.remote.dirwire`).
"""

from __future__ import annotations

import errno
import hmac
import math
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.backends._secret import check_secret, read_secret, write_secret
from clusterbook.spec import validate_seconds

__all__ = [
    "ACCEPTED",
    "FRAME_HEADER",
    "HEAD",
    "HELLO_MAX",
    "MAGIC",
    "MAX_FRAME",
    "MAX_NODE",
    "MAX_SECRET",
    "MAX_STATE",
    "MAX_WHOLE",
    "PART",
    "PART_SIZE",
    "REFUSED",
    "SECONDS",
    "SPEC",
    "TOKEN_ANY",
    "TOKEN_INT",
    "TOKEN_NONE",
    "WATCH_MAX",
    "AuthFailed",
    "Channel",
    "PeerClosed",
    "ProtocolError",
    "check_hello",
    "check_seconds",
    "check_secret",
    "hello",
    "next_part",
    "open_channel",
    "read_secret",
    "shutdown",
    "token_spec",
    "tune",
    "unpack_part",
    "write_secret",
]

MAX_FRAME = 16 * 1024 * 1024
"""The largest frame (its payload) either side sends or accepts, in bytes."""

FRAME_HEADER = struct.Struct(">I")
"""A frame's header: its payload's length, 4 bytes big-endian."""
SPEC = struct.Struct(">Bq")
"""A request's token: its kind (:data:`TOKEN_NONE`, :data:`TOKEN_INT`, :data:`TOKEN_ANY`) and
value."""
HEAD = struct.Struct(">Bq")
"""A reply's head, before the state: whether there is one (or the write won), and its token."""
SECONDS = struct.Struct(">d")
"""A watch's timeout, in seconds."""

MAX_WHOLE = MAX_FRAME - 1 - HEAD.size
"""The largest state one frame carries (a compare-and-set, a get, a watch), in bytes."""
MAX_STATE = 256 * 1024 * 1024
"""The largest state the store holds, in bytes: more than a frame carries, so a state this
large is read in parts (``R`` and ``N``) and changed on the store's side (steps, and the
head's own changes)."""
PART = struct.Struct(">Q")
"""A part's offset in the state, or the state's whole length."""
PART_SIZE = 8 * 1024 * 1024
"""The most bytes of the state one part carries."""

MAGIC = b"CBRDZV4\n"
"""How a hello begins: the protocol and its version."""
MAX_SECRET = 4096
"""The longest secret a hello carries, in bytes."""
MAX_NODE = 1024
"""The longest node id a hello announces, in bytes of UTF-8."""
_SECRET_LEN = struct.Struct(">H")
HELLO_MAX = len(MAGIC) + _SECRET_LEN.size + MAX_SECRET + MAX_NODE
"""The largest frame the server takes before the hello was accepted."""
ACCEPTED, REFUSED = b"O", b"N"
"""The server's answers to a hello."""
WATCH_MAX = 86400.0
"""The longest a watch waits, in seconds."""

TOKEN_NONE, TOKEN_INT, TOKEN_ANY = 0, 1, 2
"""The kinds of a request's token: None, an integer, anything else (which matches none)."""
_POLLIN = getattr(select, "POLLIN", 1)
_POLLOUT = getattr(select, "POLLOUT", 4)


class ProtocolError(Exception):
    """The peer broke the protocol: bad frame, unexpected message."""


class AuthFailed(Exception):
    """The peer does not hold the secret (or refused ours)."""


class PeerClosed(ConnectionError):
    """The peer closed the connection."""


# --- values ---------------------------------------------------------------------------------------


def check_seconds(value: object, name: str, *, zero: bool = False) -> float:
    """``value`` as seconds (0 only with ``zero``), else a :class:`ConfigError` naming it."""
    seconds = validate_seconds(value, f"The {name}", zero=zero)
    assert seconds is not None
    return seconds


def next_part(offset: int) -> Callable[[float], bytes]:
    """The request (``N``) of the part of a read in parts that begins at ``offset``."""
    request = b"N" + PART.pack(offset)
    return lambda _left: request


def unpack_part(payload: bytes) -> tuple[int, bytes]:
    """The whole state's length and the part's bytes, from a ``p`` reply after its head."""
    if len(payload) < PART.size:
        raise ProtocolError("a part without its state's length")
    (total,) = PART.unpack_from(payload)
    return total, payload[PART.size :]


# --- the hello ------------------------------------------------------------------------------------


def hello(secret: bytes, node: str | None) -> bytes:
    """The client's first frame: the magic, its secret and its node id."""
    if len(secret) > MAX_SECRET:
        raise ConfigError(f"The rendezvous secret is over {MAX_SECRET} bytes.")
    name = (node or "").encode("utf-8")
    return MAGIC + _SECRET_LEN.pack(len(secret)) + secret + name


def check_hello(payload: bytes, secret: bytes) -> str | None:
    """The node id a hello announces (None for none), if it holds ``secret``; raise
    :class:`ProtocolError` if it is no hello, :class:`AuthFailed` if the secret differs."""
    size = len(MAGIC) + _SECRET_LEN.size
    if len(payload) < size or not payload.startswith(MAGIC):
        raise ProtocolError("not a clusterbook rendezvous client of this version")
    (length,) = _SECRET_LEN.unpack_from(payload, len(MAGIC))
    shown, name = payload[size : size + length], payload[size + length :]
    if len(shown) != length or len(name) > MAX_NODE:
        raise ProtocolError("a malformed hello")
    if not hmac.compare_digest(shown, secret):
        raise AuthFailed("the client's secret differs from the store's")
    return name.decode("utf-8") or None


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
            raise PeerClosed("the peer closed the connection")
        got += n
    return bytes(buf)


class Channel:
    """Frames over a connected socket (see the module docstring): TLS to the store, plain TCP on
    127.0.0.1 for the control channel.

    Over TLS (an ``ssl.SSLSocket``, after its handshake) the socket is made non-blocking and
    every read and write of the TLS session takes one lock, waiting for the socket outside it:
    a client says goodbye from one thread while another waits for an answer, and OpenSSL does
    not allow one session to be used by two threads at once.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._io_lock = threading.Lock()
        if self._tls:
            sock.setblocking(False)

    def send(self, payload: bytes, deadline: float | None = None) -> None:
        """Send one frame; over TLS, raise :class:`TimeoutError` if it cannot go out by
        ``deadline`` (a plain socket keeps the timeout it has)."""
        if len(payload) > MAX_FRAME:
            raise ProtocolError(f"frame of {len(payload)} bytes is over the {MAX_FRAME}-byte limit")
        data = FRAME_HEADER.pack(len(payload)) + payload
        with self._send_lock:
            if self._tls:
                self._send_tls(data, deadline)
            else:
                self.sock.sendall(data)

    def recv(self, deadline: float | None, limit: int = MAX_FRAME) -> bytes:
        """The next frame's payload (of at most ``limit`` bytes)."""
        (size,) = FRAME_HEADER.unpack(self._recv_exact(FRAME_HEADER.size, deadline))
        if size > limit:
            raise ProtocolError(f"frame of {size} bytes (limit {limit})")
        return self._recv_exact(size, deadline) if size else b""

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
        # Nothing decrypted at hand (an answer not read yet, as a rule): wait for the socket
        # first, rather than learn from a failed read (an exception) that there is nothing.
        n = 0 if self.sock.pending() else -1  # type: ignore[attr-defined]
        while got < size:
            if n < 0:
                _wait(self.sock, _POLLIN if n == -1 else _POLLOUT, deadline)
            with self._io_lock:
                try:
                    n = self.sock.recv_into(view[got:], size - got)
                except (ssl.SSLWantReadError, BlockingIOError):
                    n = -1
                except ssl.SSLWantWriteError:
                    n = -2
            if n == 0:
                raise PeerClosed("the peer closed the connection")
            if n > 0:
                got += n
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


def shutdown(sock: socket.socket, how: int) -> None:
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


def open_channel(sock: socket.socket, secret: bytes, node: str | None, deadline: float) -> Channel:
    """Say the hello on ``sock`` (connected, and for the store already in TLS with the pinned
    certificate) and return its channel once the server accepted it; raise
    :class:`AuthFailed` when it refused the secret."""
    chan = Channel(sock)
    chan.send(hello(secret, node), deadline)
    answer = chan.recv(deadline, limit=1)
    if answer == REFUSED:
        raise AuthFailed("the store does not know this client's secret")
    if answer != ACCEPTED:
        raise ProtocolError("unexpected answer to the hello")
    return chan


def tune(sock: socket.socket) -> None:
    """Small frames go out at once; a peer that vanished without a word is noticed in ~20 s."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 3), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError:
        pass


def token_spec(token: object) -> bytes:
    """A request's ``token`` as :data:`SPEC` packs it."""
    if token is None:
        return SPEC.pack(TOKEN_NONE, 0)
    if isinstance(token, int) and not isinstance(token, bool) and -(2**63) <= token < 2**63:
        return SPEC.pack(TOKEN_INT, token)
    return SPEC.pack(TOKEN_ANY, 0)
