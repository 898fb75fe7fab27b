"""The backend the nodes of a rendezvous use to reach the store the head serves over TCP.

The head runs a :class:`~.tcp_server.StoreServer`; every node (the head too) talks to it
through a :class:`TcpBackend`. The traffic is TLS, with the server's self-signed certificate
pinned by the fingerprint in the store's URL (``tcp://host:port?fingerprint=sha256:HEX``, see
:mod:`._tls`); inside it, the client's first message shows the per-cluster secret
(:func:`write_secret` makes the token file, :func:`read_secret` reads it back). The wire
protocol is described in :mod:`clusterbook.rendezvous.backends.wire`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.api import (
    RendezvousBackend,
    RendezvousConnectionError,
    StateChange,
    Token,
)
from clusterbook.rendezvous.backends._tls import (
    FINGERPRINT_PREFIX,
    Certificate,
    _WrongCertificate,
    client_tls,
)
from clusterbook.rendezvous.backends.url import format_url, parse_store_url, parse_url
from clusterbook.rendezvous.backends.wire import (
    HEAD,
    MAX_FRAME,
    MAX_NODE,
    MAX_STATE,
    MAX_WHOLE,
    PART,
    SECONDS,
    WATCH_MAX,
    AuthFailed,
    Channel,
    PeerClosed,
    ProtocolError,
    check_seconds,
    check_secret,
    next_part,
    open_channel,
    read_secret,
    shutdown,
    token_spec,
    tune,
    unpack_part,
    write_secret,
)
from clusterbook.rendezvous.step import Step

__all__ = [
    "FINGERPRINT_PREFIX",
    "MAX_FRAME",
    "MAX_STATE",
    "MAX_WHOLE",
    "Certificate",
    "TcpBackend",
    "parse_url",
    "read_secret",
    "write_secret",
]


class TcpBackend(RendezvousBackend):
    """A client of a :class:`StoreServer` at ``url`` (``tcp://host:port?fingerprint=sha256:HEX``,
    the server's :attr:`~StoreServer.url`).

    The connection is TLS; the server must show the certificate whose fingerprint the URL
    names, else the client hangs up before it sends anything.

    Keeps one connection, made on first use and again whenever it was lost; calls from several
    threads take turns on it. ``node`` announces this client as that node, for the server's
    connection-loss fast path; :meth:`close` says goodbye so a node that leaves is not taken
    for lost. Every call raises :class:`RendezvousConnectionError` within ``timeout`` seconds
    (a watch: its own timeout plus that) when the store cannot be reached or does not answer.
    """

    name = "tcp"

    def __init__(
        self,
        url: str,
        secret: bytes,
        *,
        node: str | None = None,
        timeout: float = 5.0,
        dial: Callable[[float], socket.socket] | None = None,
        apply: Callable[[StateChange, float], tuple[bytes, Token] | None] | None = None,
    ) -> None:
        self._host, self._port, fingerprint = parse_store_url(url)
        # How the server's own process reaches the store without the network (a connected
        # socket by the deadline, no TLS) and changes the state there (a change of a state
        # larger than a frame cannot go by compare-and-set): StoreServer.local_client's.
        self._dial, self._apply = dial, apply
        self._secret = check_secret(secret)
        if node is not None and (
            not isinstance(node, str) or not node or len(node.encode("utf-8")) > MAX_NODE
        ):
            raise ConfigError(
                f"The node id must be a non-empty string of at most {MAX_NODE} bytes, got {node!r}."
            )
        self._node = node
        self._timeout = check_seconds(timeout, "store timeout")
        if fingerprint is None:
            raise ConfigError(
                f"The rendezvous store URL {url!r} names no certificate fingerprint. The store "
                "encrypts its traffic with TLS, and its clients check the head's certificate "
                f"against the fingerprint in the URL (...?fingerprint={FINGERPRINT_PREFIX}HEX): "
                "use the whole URL the head gives now (StoreServer.url, or the join URL in "
                "the `clusterbook worker join` command it prints); a URL without it, from an "
                "older clusterbook, no longer works."
            )
        self._fingerprint = fingerprint
        self._url = format_url(self._host, self._port, fingerprint)
        self._lock = threading.Lock()
        self._chan: Channel | None = None
        self._closed = False

    @property
    def url(self) -> str:
        return self._url

    @property
    def node(self) -> str | None:
        return self._node

    def get_state(self) -> tuple[bytes, Token] | None:
        current: tuple[bytes, Token] | None = self._call(lambda _left: b"G", b"s", idempotent=True)
        return current

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool]:
        if not isinstance(state, bytes):
            raise TypeError(f"state must be bytes, got {type(state).__name__}")
        if len(state) > MAX_WHOLE:
            raise ConfigError(
                f"The rendezvous state is {len(state)} bytes; one write to the store carries at "
                f"most {MAX_WHOLE} bytes (larger states are written by steps, on the store's side)."
            )
        request = b"S" + token_spec(token) + state
        result: tuple[bytes, Token, bool] = self._call(
            lambda _left: request, b"r", idempotent=False
        )
        return result

    def update(self, change: StateChange) -> tuple[bytes, Token] | None:
        """A rendezvous :class:`~clusterbook.rendezvous.step.Step` runs on the store's side,
        atomically, in one round trip (whose answer the store holds while the step leaves the
        node waiting, up to ``step.wait``); any other change goes by compare-and-set."""
        if not isinstance(change, Step):
            if self._apply is not None:
                return self._apply(change, self._timeout)
            return super().update(change)
        request = b"U" + change.to_wire()
        if len(request) > MAX_FRAME:
            raise ConfigError(
                f"The rendezvous step of node {change.node!r} is {len(request)} bytes; frames "
                f"hold at most {MAX_FRAME} bytes (is its report that large?)."
            )
        after: tuple[bytes, Token] | None = self._call(
            lambda _left: request, b"s", idempotent=change.repeatable, wait=change.wait
        )
        return after

    def watch(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        current: tuple[bytes, Token] | None = self._watch(b"W", token, timeout)
        return current

    def read_state(
        self, token: Token | None, timeout: float, *, since: Token | None = None
    ) -> tuple[bytes, Token] | None:
        """A watch (``R``) whose answer comes in parts, each of the one state it answered (a
        call of another thread between two parts breaks the read off: it is read again);
        ``since``: the store sends only the reports written after that token."""
        extra = b"" if since is None else PART.pack(max(0, int(since)))
        for attempt in (1, 2, 3):
            first = self._watch(b"R", token, timeout, extra)
            if first is None:
                return None
            total, state, read = first
            parts = [state]
            try:
                while (got := sum(map(len, parts))) < total:
                    parts.append(self._call(next_part(got), b"p", idempotent=False)[1])
            except RendezvousConnectionError:
                if attempt == 3:
                    raise
                continue
            return b"".join(parts), read
        raise AssertionError("unreachable")  # pragma: no cover

    def watch_decisions(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        current: tuple[bytes, Token] | None = self._watch(b"D", token, timeout)
        return current

    def watch_members(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        current: tuple[bytes, Token] | None = self._watch(b"M", token, timeout)
        return current

    def _watch(self, op: bytes, token: Token | None, timeout: float, extra: bytes = b"") -> Any:
        wait = min(WATCH_MAX, float(timeout)) if timeout > 0 else 0.0  # NaN -> 0
        spec = token_spec(token)
        kind = b"p" if op == b"R" else b"s"
        return self._call(
            lambda left: op + spec + SECONDS.pack(left) + extra, kind, idempotent=True, wait=wait
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
            for chan in {c for c in (first, self._chan) if c is not None}:
                with contextlib.suppress(OSError):
                    shutdown(chan.sock, socket.SHUT_RDWR)

    def __enter__(self) -> TcpBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # internals

    def _drop(self) -> None:
        chan, self._chan = self._chan, None
        if chan is not None:
            chan.sock.close()

    def _connect(self, deadline: float) -> Channel:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        if self._dial is not None:
            local = self._dial(deadline)
            try:
                return open_channel(local, self._secret, self._node, deadline)
            except BaseException:
                local.close()
                raise
        sock = socket.create_connection((self._host, self._port), timeout=left)
        try:
            tune(sock)
            tls = client_tls(sock, self._fingerprint, deadline)
        except BaseException:
            sock.close()
            raise
        try:
            return open_channel(tls, self._secret, self._node, deadline)
        except BaseException:
            tls.close()
            raise

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
                if chan is not None and _stale(chan):
                    self._drop()
                    chan, reused = None, False
                if self._closed:
                    # close() began: its goodbye may not have gone out yet, and a connection
                    # ended without one is a node lost to the store.
                    if chan is not None:
                        _goodbye(chan)
                    self._drop()
                    raise self._closed_error()
                try:
                    if chan is None:
                        chan = self._chan = self._connect(start + self._timeout)
                        if self._closed:  # close() began meanwhile and may not have seen it
                            _goodbye(chan)
                            self._drop()
                            raise self._closed_error()
                    chan.send(
                        request(max(0.0, start + wait - time.monotonic())), start + self._timeout
                    )
                    return _decode(chan.recv(start + self._timeout + wait), kind)
                except _WrongCertificate as exc:
                    self._drop()
                    raise RendezvousConnectionError(
                        f"The rendezvous store at {self._url} is not the one its URL names: "
                        f"the certificate fingerprint does not match ({exc}). Nothing was sent "
                        "to it. Use the join URL of the cluster's head as it prints it now (a "
                        "head that started again has a new certificate); if it is that URL, "
                        "something else answers at that address."
                    ) from None
                except AuthFailed as exc:
                    self._drop()
                    raise RendezvousConnectionError(
                        f"Authentication with the rendezvous store at {self._url} failed: {exc}. "
                        "Every node must use the cluster's secret: read_secret() on the token "
                        "file the head wrote with write_secret()."
                    ) from None
                except (OSError, ProtocolError) as exc:
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
        elif isinstance(exc, PeerClosed):
            reason = "the store closed the connection"
        elif isinstance(exc, ProtocolError):
            reason = f"protocol error: {exc}"
        else:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return RendezvousConnectionError(
            f"Cannot reach the rendezvous store at {self._url} ({reason}). Check that the head's "
            f"store server is running and listening there, and that this machine can reach "
            f"{self._host} port {self._port} (address, firewall)."
        )


def _stale(chan: Channel) -> bool:
    """Whether a connection between calls is unusable: nothing may arrive then, so anything
    readable means the store closed it (or broke the protocol)."""
    try:
        return chan.readable()
    except (OSError, ValueError):
        return True


def _goodbye(chan: Channel) -> None:
    try:
        chan.send(b"B", time.monotonic() + 1.0)
        shutdown(chan.sock, socket.SHUT_WR)
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
    if reply[:1] != kind or len(reply) < 1 + HEAD.size:
        raise ProtocolError(f"unexpected reply {reply[:1]!r}")
    flag, token = HEAD.unpack_from(reply, 1)
    state = reply[1 + HEAD.size :]
    if kind == b"p":  # a part: the whole state's length, and the part's bytes
        return (*unpack_part(state), token) if flag else None
    if kind == b"r":
        return state, token, bool(flag)
    return (state, token) if flag else None
