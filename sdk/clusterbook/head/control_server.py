"""The head's side of the control channel (:mod:`clusterbook.head.control`): :class:`ControlServer`.

One thread does all the talking, around one ``selectors`` loop (as the rendezvous store's
server does): a connection costs a descriptor and a few bytes, not a thread, until it has
proved the secret and sent a request; each request then runs on a thread of its own (a job's
start, a ``wait_ready`` or a ``run_on_nodes`` may take minutes) and its answer goes back
through the loop. What a connection may cost is bounded, whoever opened it:

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

import contextlib
import hmac
import json
import logging
import os
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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
from clusterbook.rendezvous.backends.wire import (
    FRAME_HEADER,
    MAX_FRAME,
    ProtocolError,
    write_secret,
)

__all__ = ["ControlServer", "Limits"]

_log = logging.getLogger("clusterbook.head.control")
_HELLO = len(MAGIC) + NONCE
_READ = 64 * 1024
_JOIN = 5.0
_QUIET = 10.0  # seconds between two warnings of the same kind


@dataclass(frozen=True, slots=True)
class Limits:
    """What the control server lets connections cost (see the module's docstring)."""

    handshake: float = 5.0
    pending: int = 64
    connections: int = 256
    backoff: tuple[float, float] = (0.05, 1.0)  # first and longest pause of accept


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    deadline: float  # to have proved the secret by
    phase: str = "hello"  # then "proof", then "open"
    nonces: bytes = b""  # the client's, then the head's
    busy: bool = False  # a request of it runs
    closing: bool = False  # close once what is queued went out
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    events: int = 0


def next_pause(pause: float, limits: Limits) -> float:
    """How long accept pauses after it failed again, having paused ``pause`` (0: not)."""
    first, longest = limits.backoff
    return first if pause <= 0 else min(longest, pause * 2)


class ControlServer:
    """Serve ``handlers`` (op name to function of the request) to the processes of this user
    that prove they hold the secret it writes to ``directory/token``, on ``directory``'s
    control socket. ``selector`` makes its selector (tests give one that fails)."""

    def __init__(
        self,
        directory: Path,
        handlers: Mapping[str, Handler],
        *,
        on_failure: Callable[[str], None] | None = None,
        limits: Limits = Limits(),
        selector: Callable[[], selectors.BaseSelector] = selectors.DefaultSelector,
    ) -> None:
        self._handlers = dict(handlers)
        self._on_failure = on_failure
        self._limits = limits
        self._uid = os.geteuid()
        self._token = directory / TOKEN_FILE
        self._path = directory / SOCKET_FILE
        self._token.unlink(missing_ok=True)
        self._secret = write_secret(self._token)
        try:
            self._listener = listen(self._path)
        except BaseException:
            self._token.unlink(missing_ok=True)
            raise
        self.failure: str | None = None
        self._closed = threading.Event()
        self._conns: dict[int, _Conn] = {}
        self._pending: dict[int, _Conn] = {}  # by age: the oldest first
        self._answers: list[tuple[_Conn, bytes]] = []  # from the requests' threads
        self._answers_lock = threading.Lock()
        self._pause = 0.0
        self._resume_at: float | None = None
        self._quiet_until: dict[str, float] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector = selector()
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name="clusterbook-control", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str | None:
        """The control socket's path while it takes requests, else None."""
        return None if self._closed.is_set() else str(self._path)

    def close(self) -> None:
        """Stop taking requests; remove the socket and the token file."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(_JOIN)

    # the loop

    def _loop(self) -> None:
        try:
            while not self._closed.is_set():
                for key, mask in self._selector.select(self._timeout()):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 4096)
                        self._deliver()
                    else:
                        self._events(key.data, mask)
                self._expire()
        except Exception as exc:
            self.failure = (
                f"The control server stopped ({type(exc).__name__}: {exc}): attached handles "
                "cannot reach the head. Its stop file (clusterbook stop ID) still stops it."
            )
            _log.exception("The control server stopped on an error; it takes no more requests.")
        finally:
            self._closed.set()
            self._shut()
        if self.failure is not None and self._on_failure is not None:
            self._on_failure(self.failure)

    def _shut(self) -> None:
        for conn in list(self._conns.values()):
            conn.sock.close()
        self._conns.clear()
        self._pending.clear()
        with contextlib.suppress(Exception):
            self._selector.close()
        self._listener.close()
        self._path.unlink(missing_ok=True)
        self._token.unlink(missing_ok=True)
        with self._answers_lock:
            pipe, self._wake_w = (self._wake_r, self._wake_w), -1
        for fd in pipe:
            os.close(fd)

    def _timeout(self) -> float | None:
        times = [self._resume_at] if self._resume_at is not None else []
        if self._pending:  # the oldest's deadline comes first
            times.append(next(iter(self._pending.values())).deadline)
        return max(0.0, min(times) - time.monotonic()) if times else None

    def _expire(self) -> None:
        now = time.monotonic()
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if oldest.deadline > now:
                break
            self._end(oldest)
        if self._resume_at is not None and now >= self._resume_at:
            self._resume_at = None
            self._selector.register(self._listener, selectors.EVENT_READ, "listener")

    def _wake(self) -> None:
        # Under the lock: once the loop has shut, the pipe's number may be another file's.
        with self._answers_lock:
            if self._wake_w >= 0:
                with contextlib.suppress(OSError):  # full: it wakes anyway
                    os.write(self._wake_w, b"x")

    def _warn(self, kind: str, message: str, *args: object) -> None:
        """Log a warning, unless one of the same kind was logged in the last seconds."""
        now = time.monotonic()
        if now >= self._quiet_until.get(kind, 0.0):
            self._quiet_until[kind] = now + _QUIET
            _log.warning(message, *args)

    # connections

    def _accept(self) -> None:
        limits = self._limits
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS...: pause, then go on
                self._pause = next_pause(self._pause, limits)
                self._resume_at = time.monotonic() + self._pause
                self._selector.unregister(self._listener)
                self._warn("accept", "The control server cannot accept (%s); again in %.2f s.",
                           exc, self._pause)  # fmt: skip
                return
            self._pause = 0.0
            try:
                uid = peer_uid(sock)
            except OSError:
                sock.close()
                continue
            if uid is not None and uid != self._uid:
                self._warn("uid", "The control server refused a connection of uid %d.", uid)
                sock.close()
                continue
            if len(self._conns) >= limits.connections:
                self._warn("full", "The control server is full (%d connections).", len(self._conns))
                sock.close()
                continue
            if len(self._pending) >= limits.pending:
                self._end(next(iter(self._pending.values())))
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic() + limits.handshake)
            self._conns[sock.fileno()] = conn
            self._pending[sock.fileno()] = conn
            self._interest(conn, selectors.EVENT_READ)

    def _interest(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        if conn.events:
            self._selector.modify(conn.sock, events, conn)
        else:
            self._selector.register(conn.sock, events, conn)
        conn.events = events

    def _events(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
        if mask & selectors.EVENT_READ and self._conns.get(conn.sock.fileno()) is conn:
            self._read(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_READ)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._end(conn)
            return
        if not data:
            self._end(conn)
            return
        conn.inbuf += data
        try:
            self._frames(conn)
        except ProtocolError as exc:
            _log.info("The control server dropped a connection: %s", exc)
            self._end(conn)

    def _frames(self, conn: _Conn) -> None:
        buf = conn.inbuf
        while len(buf) >= FRAME_HEADER.size and not conn.closing and conn.sock.fileno() >= 0:
            (size,) = FRAME_HEADER.unpack_from(buf)
            limit = {"hello": _HELLO, "proof": PROOF}.get(conn.phase, MAX_FRAME)
            if size > limit:
                raise ProtocolError(f"frame of {size} bytes (limit {limit})")
            end = FRAME_HEADER.size + size
            if len(buf) < end:
                return
            payload = bytes(buf[FRAME_HEADER.size : end])
            del buf[:end]
            self._frame(conn, payload)

    def _frame(self, conn: _Conn, payload: bytes) -> None:
        if conn.phase == "hello":
            theirs, mine = nonce_of(payload), secrets.token_bytes(NONCE)
            conn.nonces, conn.phase = theirs + mine, "proof"
            self._send(conn, head_challenge(self._secret, theirs, mine))
        elif conn.phase == "proof":
            self._pending.pop(conn.sock.fileno(), None)
            expected = client_proof(self._secret, conn.nonces[:NONCE], conn.nonces[NONCE:])
            if not hmac.compare_digest(payload, expected):
                self._warn("auth", "The control server refused a client: bad proof of the secret.")
                conn.closing = True
                self._send(conn, REFUSED)
                return
            conn.phase = "open"
            self._send(conn, ACCEPTED)
        elif conn.busy:
            raise ProtocolError("a request while another is answered")
        else:
            conn.busy = True
            self._start(conn, payload)

    def _start(self, conn: _Conn, payload: bytes) -> None:
        """Run the request ``payload`` on a thread of its own."""
        thread = threading.Thread(
            target=self._run, args=(conn, payload), name="clusterbook-control-request",
            daemon=True,
        )  # fmt: skip
        try:
            thread.start()
        except RuntimeError as exc:  # can't start new thread: answer that, and go on
            self._warn("thread", "The control server cannot start a thread: %s", exc)
            refusal = ClusterStateError(
                f"The cluster's head cannot start a thread for this request now ({exc}); "
                "try again later."
            )
            conn.busy = False
            self._send(conn, json.dumps(error_reply(refusal)).encode())

    def _run(self, conn: _Conn, payload: bytes) -> None:
        data = answer(self._handlers, payload)
        with self._answers_lock:
            self._answers.append((conn, data))
        self._wake()

    def _deliver(self) -> None:
        with self._answers_lock:
            answers, self._answers = self._answers, []
        for conn, data in answers:
            if self._conns.get(conn.sock.fileno()) is conn:  # still open
                conn.busy = False
                self._send(conn, data)

    def _send(self, conn: _Conn, payload: bytes) -> None:
        conn.outbuf += FRAME_HEADER.pack(len(payload))
        conn.outbuf += payload
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        out = conn.outbuf
        while out:
            try:
                sent = conn.sock.send(out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._end(conn)
                return
            del out[:sent]
        if conn.closing and not out:
            self._end(conn)
            return
        reading = 0 if conn.closing else selectors.EVENT_READ
        self._interest(conn, reading | (selectors.EVENT_WRITE if out else 0))

    def _end(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if self._conns.get(fd) is not conn:
            return
        del self._conns[fd]
        self._pending.pop(fd, None)
        if conn.events:
            self._selector.unregister(conn.sock)
        conn.sock.close()
