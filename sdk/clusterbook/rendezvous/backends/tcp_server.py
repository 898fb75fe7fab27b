"""The server side of the TCP rendezvous store: :class:`StoreServer`, which the head runs.

It holds the state and its fencing token (a :class:`~._store.StateStore`), serves the requests
of the protocol described in :mod:`clusterbook.rendezvous.backends._wire` over TLS with its own
self-signed certificate (:mod:`._tls`; rendezvous steps run here, under the store's lock), and
reports nodes whose connection was lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable

from clusterbook.errors import ClusterStateError, ConfigError
from clusterbook.rendezvous.backends._store import StateStore
from clusterbook.rendezvous.backends._tls import (
    Certificate,
    make_certificate,
    server_context,
    server_handshake,
    server_tls,
)
from clusterbook.rendezvous.backends._wire import (
    _ANY,
    _HEAD,
    _INT,
    _MAX_NODE,
    _NONE,
    _SECONDS,
    _SPEC,
    _WATCH_MAX,
    MAX_STATE,
    _AuthFailed,
    _Channel,
    _check_secret,
    _format_url,
    _PeerClosed,
    _ProtocolError,
    _seconds,
    _server_handshake,
    _shutdown,
    _tune,
)
from clusterbook.rendezvous.step import Step, StepFormatError
from clusterbook.spec import validate_port

__all__ = ["StoreServer"]

# The store's records keep the logger name of the public module, where users configure it.
_log = logging.getLogger("clusterbook.rendezvous.backends.tcp")

_HANDSHAKE_TIMEOUT = 10.0
_POLL = 0.05
_MAX_CONNECTIONS = 1024
_LOST_ATTEMPTS = 100
_JOIN = 5.0


class _Goodbye(Exception):
    """The client said goodbye."""


class _Stopping(Exception):
    """The server is closing."""


class StoreServer:
    """The rendezvous store the head serves: one state blob and its fencing token.

    ``on_lost(node, state)`` is called (on a thread of the server) when the connection of a
    node that announced its id ended without a goodbye and the node did not connect again within
    ``lost_grace`` seconds; bytes it returns become the new state (a new token; watchers wake),
    None leaves the state as it is. It is not called while no state was ever set. If the state
    changes while it runs, it is called again with the newer state.

    The traffic is TLS: the server shows ``certificate``, by default a new self-signed one made
    here; its fingerprint is in :attr:`url`, which is what clients pin. Give the certificate of
    an earlier server to serve as that one again (its clients reconnect).
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
        self._secret = _check_secret(secret)
        self._lost_grace = _seconds(lost_grace, "lost grace", zero=True)
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
        self._lock = threading.Lock()  # guards the store, the connections and the sessions
        self._store = StateStore(self._lock)
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
        with self._lock:
            first = not self._closed
            self._closed = True
            self._store.wake_all()
            for sock in self._connections:
                with contextlib.suppress(OSError):
                    _shutdown(sock, socket.SHUT_RDWR)
            threads = list(self._connections.values())
            timers = list(self._timers)
        if first and self._wake is not None:
            os.write(self._wake[1], b"x")
        for timer in timers:
            timer.cancel()
        for thread in [self._accepter, *threads, *timers]:
            if thread is not None and thread is not threading.current_thread():
                thread.join(_JOIN)
        with self._lock:
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
        """``tcp://host:port?fingerprint=sha256:HEX`` for :class:`TcpBackend`."""
        return _format_url(*self.address, self._certificate.fingerprint)

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
                try:  # no handshake yet: that is the connection's thread's work
                    sock = server_tls(self._context, sock)
                except (OSError, ValueError) as exc:
                    _log.info("The rendezvous store dropped a connection: %s", exc)
                    sock.close()
                    continue
                with self._lock:
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

    def _serve(self, sock: ssl.SSLSocket) -> None:
        node: str | None = None
        announced = clean = False
        try:
            sock.settimeout(_HANDSHAKE_TIMEOUT)
            _tune(sock)
            deadline = time.monotonic() + _HANDSHAKE_TIMEOUT
            server_handshake(sock, deadline)
            chan = _server_handshake(sock, self._secret, deadline)
            hello = chan.recv(deadline)
            if hello[:1] != b"H" or len(hello) > 1 + _MAX_NODE:
                raise _ProtocolError("expected a hello")
            node = hello[1:].decode("utf-8") or None
            self._session_started(node)
            announced = True
            chan.send(b"O")
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
            with self._lock:
                self._connections.pop(sock, None)
                sock.close()

    def _handle(self, chan: _Channel, request: bytes) -> bytes:
        op, body = request[:1], request[1:]
        if op == b"G" and not body:
            with self._lock:
                return self._reply_state()
        if op == b"U":
            try:
                step = Step.from_wire(body)
            except StepFormatError as exc:
                raise _ProtocolError(str(exc)) from None
            with self._lock:
                try:
                    hold = self._store.run(step, len(body))
                except Exception:
                    _log.exception("A rendezvous step of node %r failed; no change.", step.node)
                    hold = 0.0
                if hold <= 0:
                    return self._reply_state()
                token = self._store.token
            # The step left its node waiting: answer once that may have changed.
            return self._watch(chan, _INT, token, hold, decisions=True)
        if op in (b"S", b"W", b"D") and len(body) >= _SPEC.size:
            kind, value = _SPEC.unpack_from(body)
            if kind not in (_NONE, _INT, _ANY):
                raise _ProtocolError(f"token kind {kind}")
            if op == b"S":
                return self._set(kind, value, body[_SPEC.size :])
            if len(body) == _SPEC.size + _SECONDS.size:
                (timeout,) = _SECONDS.unpack_from(body, _SPEC.size)
                return self._watch(chan, kind, value, timeout, decisions=op == b"D")
        raise _ProtocolError(f"unexpected request {op!r} of {len(request)} bytes")

    # the store

    def _reply_state(self) -> bytes:
        """The stored state as an ``s`` reply (call with the lock held)."""
        current = self._store.current()
        if current is None:
            return b"s" + _HEAD.pack(0, 0)
        return b"s" + _HEAD.pack(1, current[1]) + current[0]

    def _set(self, kind: int, value: int, state: bytes) -> bytes:
        with self._lock:
            won = self._store.compare_and_set(kind, value, state)
            current = self._store.current()
            return b"r" + _HEAD.pack(won, self._store.token) + (current[0] if current else b"")

    def _watch(
        self, chan: _Channel, kind: int, value: int, timeout: float, *, decisions: bool
    ) -> bytes:
        timeout = min(_WATCH_MAX, timeout) if timeout > 0 else 0.0  # NaN -> 0
        deadline = time.monotonic() + timeout
        store = self._store
        while True:
            with self._lock:
                for waited in (False, True):
                    if self._closed:
                        raise _Stopping
                    left = deadline - time.monotonic()
                    if store.settled(kind, value, decisions=decisions) or left <= 0:
                        return self._reply_state()
                    if not waited:
                        store.wait(min(left, _POLL), decisions=decisions)
            # A waiting client sends nothing but a goodbye: notice it, or the end of the
            # connection, while waiting, so a node that dies in a watch is seen as lost.
            if chan.readable():
                if chan.recv(None) == b"B":
                    raise _Goodbye
                raise _ProtocolError("a request during a watch")

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
            with self._lock:
                current = self._store.current()
                if not self._still_lost(node, generation) or current is None:
                    return
                state, token = current
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
            with self._lock:
                if not self._still_lost(node, generation):
                    return
                if self._store.token == token:
                    self._store.write(new)
                    return
        _log.warning("on_lost(%r): the state kept changing; gave up.", node)
