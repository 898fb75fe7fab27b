"""The server side of the TCP rendezvous store: :class:`StoreServer`, which the head runs.

It holds the state and its fencing token (a :class:`~._store.StateStore`) and serves the
protocol described in :mod:`clusterbook.rendezvous.backends.wire` over TLS with its own
self-signed certificate (:mod:`._tls`), on one thread: a :class:`~.tcp_loop.FrameLoop`, whose
gate bounds what connections that have not shown the secret may cost (:data:`LIMITS`). TLS
handshakes and reads that wait do not hold anyone up, a round that completes answers every
waiting node from that thread without waking one thread per node, and the rendezvous steps read
in one pass of the loop run as one batch on one copy of the state. It reports nodes whose
connection was lost.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from clusterbook.errors import ClusterStateError, ConfigError
from clusterbook.rendezvous.api import RendezvousConnectionError, StateChange, Token
from clusterbook.rendezvous.backends._store import StateStore
from clusterbook.rendezvous.backends._tls import Certificate, make_certificate, server_context
from clusterbook.rendezvous.backends.tcp_gate import Limits
from clusterbook.rendezvous.backends.tcp_loop import FrameLoop
from clusterbook.rendezvous.backends.tcp_protocol import StoreConnection, StoreProtocol
from clusterbook.rendezvous.backends.url import format_url
from clusterbook.rendezvous.backends.wire import check_seconds, check_secret, tune
from clusterbook.spec import validate_port

if TYPE_CHECKING:
    from clusterbook.rendezvous.backends.tcp import TcpBackend

__all__ = ["LIMITS", "StoreServer"]

# The store's records keep the logger name of the public module, where users configure it.
_log = logging.getLogger("clusterbook.rendezvous.backends.tcp")

LIMITS = Limits(handshake=10.0, pending=128, patience=1.0, connections=1024)
"""What connections may cost a store by default: 10 s to show the secret, at most 128 waiting
to (a newcomer pushes out the oldest once that one has waited a second), 1,024 in all."""


def _vet(sock: socket.socket) -> str | None:
    tune(sock)  # every connection is let in, to show the secret
    return None


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
    reconnect). ``limits`` bound what connections may cost (:data:`LIMITS` by default);
    ``store`` holds the state (a new, empty :class:`~._store.StateStore` by default).
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
        limits: Limits = LIMITS,
        store: StateStore | None = None,
    ) -> None:
        if not isinstance(host, str) or not host:
            raise ConfigError(
                f"The store server's host must be a host name or address, got {host!r}."
            )
        validate_port(port, "The store server's port", free="any free one")
        if on_lost is not None and not callable(on_lost):
            raise ConfigError(f"on_lost must be a callable or None, got {on_lost!r}.")
        if not isinstance(limits, Limits):
            raise ConfigError(
                f"limits must be a Limits (clusterbook.rendezvous.backends.tcp_gate), got "
                f"{limits!r}; leave it out for the default, tcp_server.LIMITS."
            )
        self._host, self._port, self._limits = host, port, limits
        self._secret = check_secret(secret)
        lost_grace = check_seconds(lost_grace, "lost grace", zero=True)
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
        store = StateStore() if store is None else store
        self._protocol = StoreProtocol(self._secret, store, lost_grace, on_lost)
        self._lock = threading.Lock()  # guards the lifecycle
        self._closed = False
        self._loop: FrameLoop[StoreConnection] | None = None
        self._address: tuple[str, int] | None = None

    # lifecycle

    def start(self) -> StoreServer:
        """Listen and serve on a background thread; returns the server."""
        with self._lock:
            if self._closed:
                raise ClusterStateError("This store server is closed; start a new StoreServer.")
            if self._loop is not None:
                return self
            listener = self._listen()
            try:
                loop = FrameLoop(
                    listener, self._protocol, name="The rendezvous store",
                    thread="clusterbook-store", log=_log, limits=self._limits,
                    tls=self._context, vet=_vet,
                )  # fmt: skip
            except BaseException:
                listener.close()
                raise
            self._address = (self._host, listener.getsockname()[1])
            self._loop = self._protocol.loop = loop
            loop.start()
        return self

    def _listen(self) -> socket.socket:
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
        except OSError as exc:
            listener.close()
            raise ConfigError(
                f"The store server cannot listen on {self._host}:{self._port} "
                f"({exc.strerror or exc}); pick another port (0 picks a free one)."
            ) from None
        return listener

    def close(self) -> None:
        """Stop serving: close every connection and join the server's thread. Idempotent."""
        with self._lock:
            self._closed = True
            loop = self._loop
        if loop is not None:
            loop.close()

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
        with self._protocol.lock:
            return frozenset(self._protocol.live)

    def lose_now(self, nodes: Collection[str], *, timeout: float = 5.0) -> list[str]:
        """Of ``nodes``, call those lost now whose connection ended without a goodbye and has
        not come back (``on_lost`` runs for each, as once the grace runs out): for a caller who
        knows their work ended, so that a reconnect within the grace could not save it. A
        node still connected, or gone cleanly, is left alone. Returns the nodes called lost."""
        done = threading.Event()
        lost: list[str] = []

        def run() -> None:
            try:
                lost.extend(n for n in nodes if self._protocol.lose_now(n))
            finally:
                done.set()

        loop = self._loop
        if loop is None or not loop.submit(run) or not done.wait(timeout):
            return []
        return lost

    def local_client(self, *, timeout: float = 5.0) -> TcpBackend:
        """A client of this store for this very process (the head's own): its connection is
        one end of a socket pair whose other end this server serves, so it needs no network,
        no port and no TLS (nothing it says leaves the process); the hello with the secret is
        said as on any connection."""
        from clusterbook.rendezvous.backends.tcp import TcpBackend

        return TcpBackend(
            self.url, self._secret, timeout=timeout, dial=self._local_socket, apply=self._apply
        )

    def _apply(self, change: StateChange, timeout: float) -> tuple[bytes, Token] | None:
        """Run ``change`` on the store's thread, as a step runs there: one write, whatever the
        size of the state (a compare-and-set carries one frame)."""
        done = threading.Event()
        answer: list[tuple[bytes, Token] | None] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                answer.append(self._protocol.apply(change))
            except BaseException as exc:  # handed to the caller, whatever it is
                failure.append(exc)
            finally:
                done.set()

        loop = self._loop
        if loop is None or not loop.submit(run):
            raise RendezvousConnectionError("The rendezvous store server is closed.")
        if not done.wait(timeout):
            raise RendezvousConnectionError(
                f"The rendezvous store server did not apply a change within {timeout:g} s."
            )
        if failure:
            raise failure[0]
        return answer[0]

    def _local_socket(self, deadline: float) -> socket.socket:
        ours, theirs = socket.socketpair()
        loop = self._loop
        if loop is None or not loop.adopt(theirs):
            ours.close()
            theirs.close()
            raise ConnectionRefusedError("the store server is closed")
        return ours
