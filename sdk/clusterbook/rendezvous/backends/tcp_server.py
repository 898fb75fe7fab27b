"""The server side of the TCP rendezvous store: :class:`StoreServer`, which the head runs.

It holds the state and its fencing token (a :class:`~._store.StateStore`) and serves the
protocol described in :mod:`clusterbook.rendezvous.backends.wire` over TLS with its own
self-signed certificate (:mod:`._tls`). One thread does it all, around one ``selectors``
loop: TLS handshakes and reads that wait do not hold anyone up, a round that completes answers
every waiting node from that thread without waking one thread per node, and the rendezvous
steps read in one pass of the loop run as one batch on one copy of the state. It reports nodes
whose connection was lost.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clusterbook.errors import ClusterStateError, ConfigError
from clusterbook.rendezvous.backends._store import ANY, DECISIONS, MEMBERS, StateStore
from clusterbook.rendezvous.backends._tls import Certificate, make_certificate, server_context
from clusterbook.rendezvous.backends.url import format_url
from clusterbook.rendezvous.backends.wire import (
    ACCEPTED,
    FRAME_HEADER,
    HEAD,
    HELLO_MAX,
    MAX_FRAME,
    MAX_STATE,
    REFUSED,
    SECONDS,
    SPEC,
    TOKEN_ANY,
    TOKEN_INT,
    TOKEN_NONE,
    WATCH_MAX,
    AuthFailed,
    ProtocolError,
    check_hello,
    check_seconds,
    check_secret,
    shutdown,
    tune,
)
from clusterbook.rendezvous.step import Step, StepFormatError
from clusterbook.spec import validate_port

if TYPE_CHECKING:
    from clusterbook.rendezvous.backends.tcp import TcpBackend

__all__ = ["BATCH", "StoreServer"]

# The store's records keep the logger name of the public module, where users configure it.
_log = logging.getLogger("clusterbook.rendezvous.backends.tcp")

BATCH = 1024
"""The most rendezvous steps the server runs as one write (those read in one pass of its loop,
in this many at a time)."""
_HANDSHAKE_TIMEOUT = 10.0
_LEVELS = {b"W": ANY, b"M": MEMBERS, b"D": DECISIONS}  # what each watch waits for
_MAX_CONNECTIONS = 1024
_JOIN = 5.0
_READ = 256 * 1024  # bytes read from one connection at a time
_CHUNK = 256 * 1024  # bytes written to one connection at a time

_TLS, _HELLO, _OPEN = "tls", "hello", "open"


def _decrypted(sock: socket.socket) -> bool:
    """Whether ``sock`` holds bytes already decrypted (TLS), which no selector sees."""
    return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0


@dataclass(eq=False)
class _Wait:
    """A request held until the state changes (a watch, or a step that left its node waiting)."""

    kind: int
    value: int
    level: int  # _store.ANY, MEMBERS or DECISIONS


@dataclass(eq=False)
class _Conn:
    sock: socket.socket  # TLS, but for the server's own process's (see local_client)
    phase: str = _TLS
    node: str | None = None
    announced: bool = False
    busy: bool = False  # a request is being answered (a step in the batch, or a wait)
    wait: _Wait | None = None
    closing: bool = False  # close once what is queued went out
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    events: int = 0


class StoreServer:
    """The rendezvous store the head serves: one state blob and its fencing token.

    ``on_lost(node, state)`` is called (on the server's thread; it must not wait for the store)
    when the connection of a node that announced its id ended without a goodbye and the node did
    not connect again within ``lost_grace`` seconds; bytes it returns become the new state (a new
    token; watchers wake), None leaves the state as it is. It is not called while no state was
    ever set.

    The traffic is TLS: the server shows ``certificate``, by default a new self-signed one made
    here; its fingerprint is in :attr:`url`, which is what clients pin. (The clients of this
    very process, :meth:`local_client`, talk through a socket pair instead: nothing leaves it.)
    Give the certificate of an earlier server to serve as that one again (its clients
    reconnect).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        secret: bytes,
        lost_grace: float = 0.25,
        on_lost: Callable[[str, bytes], bytes | None] | None = None,
        certificate: Certificate | None = None,
    ) -> None:
        if not isinstance(host, str) or not host:
            raise ConfigError(
                f"The store server's host must be a host name or address, got {host!r}."
            )
        validate_port(port, "The store server's port", free="any free one")
        if on_lost is not None and not callable(on_lost):
            raise ConfigError(f"on_lost must be a callable or None, got {on_lost!r}.")
        self._host = host
        self._port = port
        self._secret = check_secret(secret)
        self._lost_grace = check_seconds(lost_grace, "lost grace", zero=True)
        self._on_lost = on_lost
        if certificate is not None and not isinstance(certificate, Certificate):
            raise ConfigError(
                f"certificate must be a Certificate (a StoreServer's .certificate) or None, "
                f"got {type(certificate).__name__}."
            )
        self._certificate = certificate or make_certificate()
        try:
            self._context = server_context(self._certificate)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"The store server cannot use its certificate: {exc}.") from None
        self._lock = threading.Lock()  # guards the lifecycle and the sessions (read by others)
        self._store = StateStore()
        self._closed = False
        self._listener: socket.socket | None = None
        self._address: tuple[str, int] | None = None
        self._wake: tuple[int, int] | None = None
        self._selector: selectors.BaseSelector | None = None
        self._thread: threading.Thread | None = None
        self._connections: dict[int, _Conn] = {}
        # The held requests, by what they wait for: a write wakes only the levels it reaches.
        self._waiting: dict[int, set[_Conn]] = {ANY: set(), MEMBERS: set(), DECISIONS: set()}
        self._steps: list[tuple[_Conn, Step, int]] = []
        self._timers: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._live: dict[str, int] = {}
        self._generation: dict[str, int] = {}
        self._losses_pending = 0  # connections lost whose grace has not run out yet
        self._adopted: list[socket.socket] = []  # local connections to serve (local_client)

    # lifecycle

    def start(self) -> StoreServer:
        """Listen and serve on a background thread; returns the server."""
        with self._lock:
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
                listener.listen(512)
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
            os.set_blocking(self._wake[0], False)
            selector = self._selector = selectors.DefaultSelector()
            selector.register(listener, selectors.EVENT_READ, "listener")
            selector.register(self._wake[0], selectors.EVENT_READ, "wake")
            self._thread = threading.Thread(
                target=self._loop, name="clusterbook-store", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving: close every connection and join the server's thread. Idempotent."""
        with self._lock:
            first = not self._closed
            self._closed = True
            # Under the lock: the loop, once it sees the flag, may end and close the pipe
            # (taking it under the lock), and its number may then be another file's.
            if first and self._wake is not None:
                os.write(self._wake[1], b"x")
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN)

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
        """``tcp://host:port?fingerprint=sha256:HEX`` for :class:`TcpBackend`."""
        return format_url(*self.address, self._certificate.fingerprint)

    @property
    def fingerprint(self) -> str:
        """The SHA-256 fingerprint of the server's certificate, ``sha256:HEX``."""
        return self._certificate.fingerprint

    @property
    def certificate(self) -> Certificate:
        """The certificate the server shows, with its key."""
        return self._certificate

    @property
    def connected_nodes(self) -> frozenset[str]:
        """Node ids with a live connection now."""
        with self._lock:
            return frozenset(self._live)

    # the loop

    def _loop(self) -> None:
        selector = self._selector
        assert selector is not None
        try:
            while not self._closed:
                for key, mask in selector.select(self._timeout()):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            os.read(key.fd, 4096)
                        self._adopt()
                    else:
                        self._events(key.data, mask)
                self._run_steps()
                self._fire_timers()
        except Exception:
            _log.exception("The rendezvous store stopped on an error; it serves no more.")
        finally:
            self._shut()

    def _shut(self) -> None:
        with self._lock:
            self._closed = True
            self._live.clear()
            adopted, self._adopted = self._adopted, []
        for sock in adopted:
            sock.close()
        for conn in list(self._connections.values()):
            with contextlib.suppress(OSError):
                shutdown(conn.sock, socket.SHUT_RDWR)
            conn.sock.close()
        self._connections.clear()
        for held in self._waiting.values():
            held.clear()
        self._timers.clear()
        assert self._selector is not None
        assert self._listener is not None
        self._selector.close()
        self._listener.close()
        with self._lock:
            wake, self._wake = self._wake, None
        if wake is not None:
            for fd in wake:
                os.close(fd)

    def _timeout(self) -> float | None:
        if self._steps:
            return 0.0
        if not self._timers:
            return None
        return max(0.0, self._timers[0][0] - time.monotonic())

    def _later(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), callback, args))

    def _fire_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, callback, args = heapq.heappop(self._timers)
            callback(*args)

    # connections

    def _accept(self) -> None:
        assert self._listener is not None
        assert self._selector is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # out of file descriptors, say: try again later
                _log.warning("The rendezvous store could not accept a connection: %s", exc)
                return
            if len(self._connections) >= _MAX_CONNECTIONS:
                sock.close()
                continue
            try:
                tune(sock)
                sock.setblocking(False)
                tls = self._context.wrap_socket(
                    sock, server_side=True, do_handshake_on_connect=False
                )
            except (OSError, ValueError) as exc:
                _log.info("The rendezvous store dropped a connection: %s", exc)
                sock.close()
                continue
            conn = _Conn(tls)
            self._serve(conn)
            self._handshake(conn)

    def local_client(self, *, timeout: float = 5.0) -> TcpBackend:
        """A client of this store for this very process (the head's own): its connection is
        one end of a socket pair whose other end this server serves, so it needs no network,
        no port and no TLS (nothing it says leaves the process); the hello with the secret is
        said as on any connection."""
        from clusterbook.rendezvous.backends.tcp import TcpBackend

        return TcpBackend(self.url, self._secret, timeout=timeout, dial=self._local_socket)

    def _local_socket(self, deadline: float) -> socket.socket:
        ours, theirs = socket.socketpair()
        with self._lock:
            wake = self._wake
            if self._closed or wake is None:
                ours.close()
                theirs.close()
                raise ConnectionRefusedError("the store server is closed")
            self._adopted.append(theirs)
        with contextlib.suppress(OSError):
            os.write(wake[1], b"a")
        return ours

    def _adopt(self) -> None:
        """Serve the local connections made since the last look (on the server's thread)."""
        with self._lock:
            adopted, self._adopted = self._adopted, []
        for sock in adopted:
            sock.setblocking(False)
            conn = _Conn(sock, phase=_HELLO)
            self._serve(conn)
            self._read(conn)

    def _serve(self, conn: _Conn) -> None:
        """Take ``conn`` in: read it, and drop it if its hello is not in within the time."""
        self._connections[conn.sock.fileno()] = conn
        self._interest(conn, selectors.EVENT_READ)
        self._later(_HANDSHAKE_TIMEOUT, self._handshake_timeout, conn)

    def _interest(self, conn: _Conn, events: int) -> None:
        assert self._selector is not None
        if events == conn.events:
            return
        if conn.events:
            self._selector.modify(conn.sock, events, conn)
        else:
            self._selector.register(conn.sock, events, conn)
        conn.events = events

    def _wanted(self, conn: _Conn) -> int:
        events = 0 if conn.closing else selectors.EVENT_READ
        return events | (selectors.EVENT_WRITE if conn.outbuf else 0)

    def _events(self, conn: _Conn, mask: int) -> None:
        if conn.phase == _TLS:
            self._handshake(conn)
            return
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
        if mask & selectors.EVENT_READ and conn.sock.fileno() >= 0:
            self._read(conn)

    def _handshake(self, conn: _Conn) -> None:
        assert isinstance(conn.sock, ssl.SSLSocket)  # only TLS connections start in _TLS
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._interest(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._interest(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            _log.info("The rendezvous store dropped a connection: %s", exc)
            self._end(conn, clean=False)
            return
        conn.phase = _HELLO
        self._interest(conn, selectors.EVENT_READ)
        self._read(conn)  # the hello may have come with the handshake's last flight

    def _handshake_timeout(self, conn: _Conn) -> None:
        if conn.phase != _OPEN and conn.sock.fileno() >= 0:
            _log.info("The rendezvous store dropped a connection: no hello in time.")
            self._end(conn, clean=False)

    def _read(self, conn: _Conn) -> None:
        while not conn.closing:
            try:
                data = conn.sock.recv(_READ)
            except (ssl.SSLWantReadError, BlockingIOError):
                return
            except ssl.SSLWantWriteError:
                self._interest(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
                return
            except (OSError, ValueError) as exc:
                _log.info("The rendezvous store dropped a connection: %s", exc)
                self._end(conn, clean=False)
                return
            if not data:
                self._end(conn, clean=False)
                return
            conn.inbuf += data
            try:
                self._frames(conn)
            except (ProtocolError, UnicodeDecodeError) as exc:
                _log.info("The rendezvous store dropped a connection: %s", exc)
                self._end(conn, clean=False)
                return
            if conn.sock.fileno() < 0:
                return
            if len(data) < _READ and not _decrypted(conn.sock):
                # Drained, as far as can be told: one more read would only fail (a system
                # call and an exception per request). What comes meanwhile, the (level-
                # triggered) selector reports; only what TLS already decrypted, it would not.
                return

    def _frames(self, conn: _Conn) -> None:
        buf = conn.inbuf
        while len(buf) >= FRAME_HEADER.size and conn.sock.fileno() >= 0 and not conn.closing:
            (size,) = FRAME_HEADER.unpack_from(buf)
            limit = HELLO_MAX if conn.phase == _HELLO else MAX_FRAME
            if size > limit:
                raise ProtocolError(f"frame of {size} bytes (limit {limit})")
            end = FRAME_HEADER.size + size
            if len(buf) < end:
                return
            payload = bytes(buf[FRAME_HEADER.size : end])
            del buf[:end]
            self._frame(conn, payload)

    def _frame(self, conn: _Conn, payload: bytes) -> None:
        if conn.phase == _HELLO:
            try:
                node = check_hello(payload, self._secret)
            except AuthFailed:
                _log.warning("The rendezvous store refused a client: authentication failed.")
                self._send(conn, REFUSED)
                conn.closing = True
                self._after_send(conn)
                return
            conn.node, conn.phase, conn.announced = node, _OPEN, True
            self._session_started(node)
            self._send(conn, ACCEPTED)
            return
        if payload == b"B":
            self._end(conn, clean=True)
            return
        if conn.busy:
            raise ProtocolError("a request while another is answered")
        op, body = payload[:1], payload[1:]
        store = self._store
        if op == b"G" and not body:
            self._send(conn, self._reply_state())
        elif op == b"U":
            try:
                step = Step.from_wire(body)
            except StepFormatError as exc:
                raise ProtocolError(str(exc)) from None
            conn.busy = True
            self._steps.append((conn, step, len(body)))
        elif op in (b"S", b"W", b"D", b"M") and len(body) >= SPEC.size:
            kind, value = SPEC.unpack_from(body)
            if kind not in (TOKEN_NONE, TOKEN_INT, TOKEN_ANY):
                raise ProtocolError(f"token kind {kind}")
            if op == b"S":
                decisive = store.compare_and_set(kind, value, body[SPEC.size :])
                current = store.current()
                won = decisive is not None
                state = current[0] if current else b""
                self._send(conn, b"r" + HEAD.pack(won, store.token) + state)
                if won:
                    self._changed()
            elif len(body) == SPEC.size + SECONDS.size:
                (timeout,) = SECONDS.unpack_from(body, SPEC.size)
                self._hold(conn, _Wait(kind, value, _LEVELS[op]), timeout)
            else:
                raise ProtocolError(f"a watch of {len(body)} bytes")
        else:
            raise ProtocolError(f"unexpected request {op!r} of {len(payload)} bytes")

    def _send(self, conn: _Conn, payload: bytes) -> None:
        conn.outbuf += FRAME_HEADER.pack(len(payload))
        conn.outbuf += payload
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        out = conn.outbuf
        while out:
            chunk = memoryview(out)[:_CHUNK]
            try:
                sent = conn.sock.send(chunk)
            except (ssl.SSLWantWriteError, BlockingIOError):
                break
            except ssl.SSLWantReadError:
                break
            except (OSError, ValueError) as exc:
                chunk.release()
                _log.info("The rendezvous store dropped a connection: %s", exc)
                self._end(conn, clean=False)
                return
            chunk.release()
            del out[:sent]
        self._after_send(conn)

    def _after_send(self, conn: _Conn) -> None:
        if conn.sock.fileno() < 0:
            return
        if conn.closing and not conn.outbuf:
            self._end(conn, clean=False)
        else:
            self._interest(conn, self._wanted(conn))

    def _end(self, conn: _Conn, *, clean: bool) -> None:
        """Close ``conn``; a node's connection that ended without a goodbye is lost."""
        if self._connections.pop(conn.sock.fileno(), None) is None:
            return
        if conn.wait is not None:
            self._waiting[conn.wait.level].discard(conn)
        conn.wait = None
        if conn.events:
            assert self._selector is not None
            self._selector.unregister(conn.sock)
        if conn.announced:  # before the close: a client that saw it gone finds the node gone
            self._session_ended(conn.node, clean)
        conn.sock.close()

    # the store

    def _reply_state(self, level: int = ANY) -> bytes:
        """The stored state as an ``s`` reply: whole to a plain watch or a get (the head's),
        without the nodes' reports to a node's step or its decision or member watch."""
        current = self._store.current(reports=level == ANY)
        if current is None:
            return b"s" + HEAD.pack(0, 0)
        return b"s" + HEAD.pack(1, current[1]) + current[0]

    def _hold(self, conn: _Conn, wait: _Wait, timeout: float) -> None:
        """Answer ``conn`` once ``wait`` is settled, or after ``timeout`` seconds."""
        timeout = min(WATCH_MAX, timeout) if timeout > 0 else 0.0  # NaN -> 0
        if timeout <= 0 or self._store.settled(wait.kind, wait.value, level=wait.level):
            conn.busy = False
            self._send(conn, self._reply_state(wait.level))
            return
        conn.busy, conn.wait = True, wait
        self._waiting[wait.level].add(conn)
        self._later(timeout, self._release, conn, wait)

    def _release(self, conn: _Conn, wait: _Wait) -> None:
        if conn.wait is wait:
            self._answer(conn)

    def _answer(self, conn: _Conn) -> None:
        level = ANY if conn.wait is None else conn.wait.level
        self._waiting[level].discard(conn)
        conn.wait, conn.busy = None, False
        self._send(conn, self._reply_state(level))

    def _changed(self) -> None:
        """After a write: answer every held request it settles. Only those of the levels the
        write reached are looked at: while a round fills, each join is a write that settles
        none of the other nodes' held joins, and looking at them all made a round O(nodes^2)."""
        settled = self._store.settled
        for level in self._store.reached():
            for conn in [
                c
                for c in self._waiting[level]
                if c.wait is not None and settled(c.wait.kind, c.wait.value, level=level)
            ]:
                self._answer(conn)

    def _run_steps(self) -> None:
        while self._steps:
            batch, self._steps = self._steps[:BATCH], self._steps[BATCH:]
            holds, decisive = self._store.run([(step, size) for _, step, size in batch])
            if decisive is not None:
                self._changed()
            token = self._store.token
            for (conn, _, _), hold in zip(batch, holds, strict=True):
                if conn.sock.fileno() >= 0:
                    # Its node waits: answer once that may have changed, or after ``hold``.
                    self._hold(conn, _Wait(TOKEN_INT, token, DECISIONS), hold)

    # sessions

    def _session_started(self, node: str | None) -> None:
        if node is None:
            return
        with self._lock:
            self._live[node] = self._live.get(node, 0) + 1
            self._generation[node] = self._generation.get(node, 0) + 1

    def _session_ended(self, node: str | None, clean: bool) -> None:
        if node is None:
            return
        with self._lock:
            left = self._live.get(node, 0) - 1
            if left > 0:
                self._live[node] = left
                return
            self._live.pop(node, None)
            generation = self._generation.get(node, 0)
        if not clean and not self._closed and self._on_lost is not None:
            self._losses_pending += 1
            self._later(self._lost_grace, self._lost, node, generation)

    def _lost(self, node: str, generation: int) -> None:
        assert self._on_lost is not None
        self._losses_pending -= 1
        with self._lock:
            if self._closed or node in self._live or self._generation.get(node) != generation:
                return
        current = self._store.current()
        if current is None:
            return
        try:
            new = self._on_lost(node, current[0])
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
        self._store.write(new)
        self._changed()
