"""The head's side of the control channel (:mod:`clusterbook.head.control`): :class:`ControlServer`.

One thread does all the talking: a :class:`~clusterbook.rendezvous.backends.tcp_loop.FrameLoop`,
the event loop the rendezvous store runs on too. A connection costs a descriptor and a few
bytes, not a thread, until it has proved the secret and sent a request; each request then runs
on a thread of its own (a job's start, a ``wait_ready`` or a ``run_on_nodes`` may take minutes)
and its answer goes back through the loop. What a connection may cost is bounded, whoever
opened it (:class:`Limits`, the loop's):

- another user's connection (``SO_PEERCRED``) is closed as soon as it is accepted;
- a connection has :attr:`Limits.handshake` seconds to prove the secret; at most
  :attr:`Limits.pending` wait to, and a new one pushes the oldest out;
- at most :attr:`Limits.connections` are open at once; the next is closed at once;
- when ``accept`` fails (out of descriptors, say) the loop stops accepting for a moment, a
  little longer each time, and goes on; a request no thread can be started for is answered
  with an error, and the loop goes on.

The loop ends only when the server is closed. If anything else ends it, :attr:`failure`
says why and ``on_failure`` is called with that text: the head shows it as its problem.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import selectors
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from clusterbook.errors import ClusterStateError
from clusterbook.head.control import (
    ACCEPTED,
    MAGIC,
    NONCE,
    PROOF,
    REFUSED,
    SOCKET_FILE,
    TOKEN_FILE,
    Handler,
    answer,
    client_proof,
    error_reply,
    head_challenge,
    listen,
    nonce_of,
    peer_uid,
)
from clusterbook.rendezvous.backends.tcp_gate import Limits
from clusterbook.rendezvous.backends.tcp_loop import Connection, FrameLoop
from clusterbook.rendezvous.backends.wire import MAX_FRAME, ProtocolError, write_secret

__all__ = ["LIMITS", "ControlServer", "Limits"]

_log = logging.getLogger("clusterbook.head.control")
_HELLO = len(MAGIC) + NONCE


LIMITS = Limits()
"""What connections may cost the control server by default: 5 s to prove the secret, at most
64 waiting to (a new one pushes out the oldest), 256 in all."""


@dataclass(eq=False)
class _Conn(Connection):
    phase: str = "hello"  # then "proof", then "open"
    nonces: bytes = b""  # the client's, then the head's
    busy: bool = False  # a request of it runs


class _Protocol:
    """The head's side of the control channel, for a :class:`FrameLoop` to serve: the
    handshake, then requests, each run on a thread of its own. ``loop`` is set before the loop
    starts; ``stopped`` is told when it ends."""

    def __init__(
        self,
        secret: bytes,
        handlers: Mapping[str, Handler],
        stopped: Callable[[BaseException | None], None],
    ) -> None:
        self.loop: FrameLoop[_Conn] | None = None
        self._secret, self._handlers, self._stopped = secret, dict(handlers), stopped

    def connection(self, sock: socket.socket) -> _Conn:
        """A new connection, which may send its nonce and nothing more."""
        return _Conn(sock, _HELLO)

    def frame(self, conn: _Conn, payload: bytes) -> None:
        """Take the handshake's frames, then the requests, one at a time."""
        loop = self.loop
        assert loop is not None
        if conn.phase == "hello":
            theirs, mine = nonce_of(payload), secrets.token_bytes(NONCE)
            conn.nonces, conn.phase, conn.limit = theirs + mine, "proof", PROOF
            loop.send(conn, head_challenge(self._secret, theirs, mine))
        elif conn.phase == "proof":
            loop.let_in(conn)
            expected = client_proof(self._secret, conn.nonces[:NONCE], conn.nonces[NONCE:])
            if not hmac.compare_digest(payload, expected):
                loop.warn("auth", "The control server refused a client: bad proof of the secret.")
                loop.send(conn, REFUSED)
                loop.finish(conn)
                return
            conn.phase, conn.limit = "open", MAX_FRAME
            loop.send(conn, ACCEPTED)
        elif conn.busy:
            raise ProtocolError("a request while another is answered")
        else:
            conn.busy = True
            self._start(loop, conn, payload)

    def ended(self, conn: _Conn, clean: bool) -> None:
        """Nothing to do: a request running for it answers no one."""

    def stopped(self, failure: BaseException | None) -> None:
        """The loop ended."""
        self._stopped(failure)

    def _start(self, loop: FrameLoop[_Conn], conn: _Conn, payload: bytes) -> None:
        """Run the request ``payload`` on a thread of its own."""
        thread = threading.Thread(
            target=self._run, args=(loop, conn, payload), name="clusterbook-control-request",
            daemon=True,
        )  # fmt: skip
        try:
            thread.start()
        except RuntimeError as exc:  # can't start new thread: answer that, and go on
            loop.warn("thread", "The control server cannot start a thread: %s", exc)
            refusal = ClusterStateError(
                f"The cluster's head cannot start a thread for this request now ({exc}); "
                "try again later."
            )
            conn.busy = False
            loop.send(conn, json.dumps(error_reply(refusal)).encode())

    def _run(self, loop: FrameLoop[_Conn], conn: _Conn, payload: bytes) -> None:
        data = answer(self._handlers, payload)
        loop.submit(lambda: self._deliver(loop, conn, data))

    def _deliver(self, loop: FrameLoop[_Conn], conn: _Conn, data: bytes) -> None:
        if conn.sock.fileno() >= 0:  # still open
            conn.busy = False
            loop.send(conn, data)


class ControlServer:
    """Serve ``handlers`` (op name to function of the request) to the processes of this user
    that prove they hold the secret it writes to ``directory/token``, on ``directory``'s
    control socket. ``limits`` bound what connections may cost (:data:`LIMITS` by default);
    ``selector`` makes its selector (tests give one that fails)."""

    def __init__(
        self,
        directory: Path,
        handlers: Mapping[str, Handler],
        *,
        on_failure: Callable[[str], None] | None = None,
        limits: Limits = LIMITS,
        selector: Callable[[], selectors.BaseSelector] = selectors.DefaultSelector,
    ) -> None:
        self._on_failure = on_failure
        self._uid = os.geteuid()
        self._token = directory / TOKEN_FILE
        self._path = directory / SOCKET_FILE
        self._token.unlink(missing_ok=True)
        protocol = _Protocol(write_secret(self._token), handlers, self._stopped)
        try:
            listener = listen(self._path)
            try:
                self._loop: FrameLoop[_Conn] = FrameLoop(
                    listener, protocol, name="The control server", thread="clusterbook-control",
                    log=_log, limits=limits, vet=self._vet, selector=selector,
                )  # fmt: skip
            except BaseException:
                listener.close()
                self._path.unlink(missing_ok=True)
                raise
        except BaseException:
            self._token.unlink(missing_ok=True)
            raise
        self.failure: str | None = None
        self._closed = threading.Event()
        protocol.loop = self._loop
        self._loop.start()

    @property
    def address(self) -> str | None:
        """The control socket's path while it takes requests, else None."""
        return None if self._closed.is_set() else str(self._path)

    def close(self) -> None:
        """Stop taking requests; remove the socket and the token file."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._loop.close()

    def _stopped(self, failure: BaseException | None) -> None:
        """The loop ended: remove the socket and the token; say why if it was not closed."""
        if failure is not None:
            self.failure = (
                f"The control server stopped ({type(failure).__name__}: {failure}): attached "
                "handles cannot reach the head. Its stop file (clusterbook stop ID) still stops it."
            )
        self._closed.set()
        self._path.unlink(missing_ok=True)
        self._token.unlink(missing_ok=True)
        if self.failure is not None and self._on_failure is not None:
            self._on_failure(self.failure)

    def _vet(self, sock: socket.socket) -> str | None:
        uid = peer_uid(sock)
        if uid is not None and uid != self._uid:
            return f"its peer runs as uid {uid}, not as this user"
        return None
