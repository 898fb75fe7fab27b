"""One thread that serves framed connections: :class:`FrameLoop`, the event loop under the
rendezvous store (:mod:`.tcp_server`) and the head's control server
(:mod:`clusterbook.head.control_server`).

It knows sockets and frames, nothing of what they carry. Around one ``selectors`` loop it
accepts connections on a listening socket (TCP or Unix) as its :class:`~.tcp_gate.Gate` lets
them in (within :class:`~.tcp_gate.Limits`, whoever opens them), runs their TLS handshakes
when it is given a context, reads frames (:data:`~.wire.FRAME_HEADER` and a payload of at most
the connection's ``limit`` bytes) and hands each to its :class:`Service`, writes what the
service sends, and runs timers and the work other threads hand it (:meth:`FrameLoop.submit`).
A connection costs a descriptor and a few bytes, not a thread.

The loop ends only when it is closed. Should anything else end it, the error is logged and the
service is told (:meth:`Service.stopped`).
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
from typing import Any, Generic, Protocol, TypeVar

from clusterbook.rendezvous.backends.tcp_gate import LISTENER, Gate, Limits, Quiet
from clusterbook.rendezvous.backends.wire import FRAME_HEADER, ProtocolError

__all__ = ["Connection", "FrameLoop", "Service"]

_READ = 256 * 1024  # bytes read from one connection at a time
_CHUNK = 256 * 1024  # bytes written to one connection at a time
_JOIN = 5.0  # seconds close() waits for the loop's thread
_WAKE = "wake"


@dataclass(eq=False)
class Connection:
    """A connection the loop serves. A service subclasses it for what it keeps of one, and
    raises :attr:`limit` once the peer is let in."""

    sock: socket.socket
    limit: int  # the largest frame the peer may send now, in bytes
    since: float = 0.0  # when the loop took it in (time.monotonic())
    handshaking: bool = False  # its TLS handshake is not done yet
    closing: bool = False  # close once what is queued went out; read nothing more
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    events: int = 0  # what the selector watches it for


C = TypeVar("C", bound=Connection)


class Service(Protocol[C]):
    """What a :class:`FrameLoop` serves, called on the loop's thread: ``connection(sock)``
    makes the record of a new connection (with its frame limit before it is let in);
    ``frame(conn, payload)`` takes a frame (a :class:`~.wire.ProtocolError` or
    ``UnicodeDecodeError`` ends the connection); ``ended(conn, clean)`` says a connection is
    about to be closed (``clean``: as its service asked, after a goodbye); ``stopped(failure)``
    says the loop ended and closed everything (closed, or on ``failure``)."""

    def connection(self, sock: socket.socket) -> C: ...

    def frame(self, conn: C, payload: bytes) -> None: ...

    def ended(self, conn: C, clean: bool) -> None: ...

    def stopped(self, failure: BaseException | None) -> None: ...


def _decrypted(sock: socket.socket) -> bool:
    """Whether ``sock`` holds bytes already decrypted (TLS), which no selector sees."""
    return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0


class FrameLoop(Generic[C]):
    """Serve ``service`` on ``listener`` (bound and listening) on a thread of its own, named
    ``thread``, once started. ``name`` begins its log messages (``"The control server"``);
    ``limits``, ``tls`` and ``vet`` say who gets in (:class:`~.tcp_gate.Gate`); ``selector``
    makes the selector."""

    def __init__(
        self,
        listener: socket.socket,
        service: Service[C],
        *,
        name: str,
        thread: str,
        log: logging.Logger,
        limits: Limits,
        tls: ssl.SSLContext | None = None,
        vet: Callable[[socket.socket], str | None] | None = None,
        selector: Callable[[], selectors.BaseSelector] = selectors.DefaultSelector,
    ) -> None:
        self._service, self._name, self._log = service, name, log
        self._quiet = Quiet(log)
        self._timers: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()  # guards what other threads hand in, and the wake pipe
        self._adopted: list[socket.socket] = []
        self._submitted: list[Callable[[], None]] = []
        self._closing = False
        self._shut_done = False
        self._wake_r, self._wake_w = os.pipe()
        self._selector = selector()
        try:
            for fd in (self._wake_r, self._wake_w):
                os.set_blocking(fd, False)
            self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
            self._gate: Gate[C] = Gate(
                listener, self._selector, limits, name=name, quiet=self._quiet,
                serve=self._accepted, end=self.end, tls=tls, vet=vet,
            )  # fmt: skip
        except BaseException:
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise
        self._thread = threading.Thread(target=self._run, name=thread, daemon=True)

    def start(self) -> None:
        """Serve on the loop's thread."""
        self._thread.start()

    @property
    def connections(self) -> int:
        """How many connections it serves now."""
        return len(self._gate.conns)

    @property
    def closed(self) -> bool:
        """Whether the loop was closed (or ended by itself)."""
        return self._closing

    def close(self) -> None:
        """Stop serving: close every connection and the listener, and join the loop's thread.
        Idempotent."""
        with self._lock:
            self._closing = True
            self._wake_locked()
        thread = self._thread
        if thread.ident is None:  # never started
            self._shut()
            self._service.stopped(None)
        elif thread is not threading.current_thread():
            thread.join(_JOIN)

    def submit(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` on the loop's thread soon; False when the loop is closed."""
        with self._lock:
            if self._closing:
                return False
            self._submitted.append(callback)
            self._wake_locked()
        return True

    def adopt(self, sock: socket.socket) -> bool:
        """Serve ``sock``, connected by this very process (no TLS, not vetted); False when the
        loop is closed (``sock`` is then the caller's to close)."""
        with self._lock:
            if self._closing:
                return False
            self._adopted.append(sock)
            self._wake_locked()
        return True

    def _wake_locked(self) -> None:
        # Under the lock: once the loop has shut, the pipe's number may be another file's.
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):  # full: it wakes anyway
                os.write(self._wake_w, b"x")

    def send(self, conn: C, payload: bytes) -> None:
        """Queue a frame of ``payload`` to ``conn`` and write what can go now."""
        conn.outbuf += FRAME_HEADER.pack(len(payload))
        conn.outbuf += payload
        self._flush(conn)

    def finish(self, conn: C) -> None:
        """Close ``conn`` once what is queued went out; read nothing more from it."""
        conn.closing = True
        self._after_send(conn)

    def let_in(self, conn: C) -> None:
        """``conn`` proved what its service asks: it no longer counts as pending."""
        self._gate.let_in(conn)

    def later(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        """Call ``callback(*args)`` in ``delay`` seconds (0: once the events at hand are
        handled, before the loop waits)."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), callback, args))

    def warn(self, kind: str, message: str, *args: object) -> None:
        """Log a warning, unless one of the same ``kind`` was logged in the last seconds."""
        self._quiet.warn(kind, message, *args)

    def end(self, conn: C, clean: bool = False) -> None:
        """Close ``conn`` now, telling the service (``clean``: see :meth:`Service.ended`)."""
        if not self._gate.leave(conn):
            return
        if conn.events:
            self._selector.unregister(conn.sock)
            conn.events = 0
        self._service.ended(conn, clean)
        conn.sock.close()

    def _run(self) -> None:
        failure: BaseException | None = None
        try:
            while not self._closing:
                for key, mask in self._selector.select(self._timeout()):
                    if key.data is LISTENER:
                        self._gate.accept()
                    elif key.data is _WAKE:
                        self._woken()
                    else:
                        self._events(key.data, mask)
                self._after_pass()
        except Exception as exc:
            failure = exc
            self._log.exception("%s stopped on an error; it serves no more.", self._name)
        finally:
            self._shut()
        self._service.stopped(failure)

    def _timeout(self) -> float | None:
        due = self._gate.deadline()
        if self._timers and (due is None or self._timers[0][0] < due):
            due = self._timers[0][0]
        return None if due is None else max(0.0, due - time.monotonic())

    def _after_pass(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, callback, args = heapq.heappop(self._timers)
            callback(*args)
        self._gate.tick(now)

    def _woken(self) -> None:
        with contextlib.suppress(OSError):
            os.read(self._wake_r, 4096)
        with self._lock:
            adopted, self._adopted = self._adopted, []
            submitted, self._submitted = self._submitted, []
        for sock in adopted:
            sock.setblocking(False)
            conn = self._service.connection(sock)
            self._enter(conn)
            self._read(conn)
        for callback in submitted:
            callback()

    def _shut(self) -> None:
        with self._lock:
            if self._shut_done:
                return
            self._shut_done = self._closing = True
            adopted, self._adopted = self._adopted, []
            self._submitted.clear()
            wake, self._wake_w = (self._wake_r, self._wake_w), -1
        for sock in adopted:
            sock.close()
        self._gate.close()
        self._timers.clear()
        with contextlib.suppress(Exception):
            self._selector.close()
        for fd in wake:
            os.close(fd)

    def _accepted(self, sock: socket.socket) -> None:
        conn = self._service.connection(sock)
        conn.handshaking = isinstance(sock, ssl.SSLSocket)
        self._enter(conn)
        if conn.handshaking:
            self._handshake(conn)

    def _enter(self, conn: C) -> None:
        self._gate.enter(conn)
        self._interest(conn, selectors.EVENT_READ)

    def _interest(self, conn: C, events: int) -> None:
        if events == conn.events:
            return
        if conn.events:
            self._selector.modify(conn.sock, events, conn)
        else:
            self._selector.register(conn.sock, events, conn)
        conn.events = events

    def _events(self, conn: C, mask: int) -> None:
        if conn.sock.fileno() < 0:  # ended by what came before it in this pass
            return
        if conn.handshaking:
            self._handshake(conn)
            return
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
        if mask & selectors.EVENT_READ and conn.sock.fileno() >= 0:
            self._read(conn)

    def _dropped(self, conn: C, why: object) -> None:
        self._log.info("%s dropped a connection: %s", self._name, why)
        self.end(conn)

    def _handshake(self, conn: C) -> None:
        assert isinstance(conn.sock, ssl.SSLSocket)  # only TLS connections shake hands
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._interest(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._interest(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            self._dropped(conn, exc)
            return
        conn.handshaking = False
        self._interest(conn, selectors.EVENT_READ)
        self._read(conn)  # the first frame may have come with the handshake's last flight

    def _read(self, conn: C) -> None:
        while not conn.closing:
            try:
                data = conn.sock.recv(_READ)
            except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
                return
            except ssl.SSLWantWriteError:
                self._interest(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
                return
            except (OSError, ValueError) as exc:
                self._dropped(conn, exc)
                return
            if not data:
                self.end(conn)
                return
            conn.inbuf += data
            try:
                self._frames(conn)
            except (ProtocolError, UnicodeDecodeError) as exc:
                self._dropped(conn, exc)
                return
            if conn.sock.fileno() < 0:
                return
            if len(data) < _READ and not _decrypted(conn.sock):
                # Drained, as far as can be told: one more read would only fail (a system
                # call and an exception per request). What comes meanwhile, the (level-
                # triggered) selector reports; only what TLS already decrypted, it would not.
                return

    def _frames(self, conn: C) -> None:
        buf = conn.inbuf
        while len(buf) >= FRAME_HEADER.size and conn.sock.fileno() >= 0 and not conn.closing:
            (size,) = FRAME_HEADER.unpack_from(buf)
            if size > conn.limit:
                raise ProtocolError(f"frame of {size} bytes (limit {conn.limit})")
            end = FRAME_HEADER.size + size
            if len(buf) < end:
                return
            payload = bytes(buf[FRAME_HEADER.size : end])
            del buf[:end]
            self._service.frame(conn, payload)

    def _flush(self, conn: C) -> None:
        out = conn.outbuf
        while out:
            chunk = memoryview(out)[:_CHUNK]
            try:
                sent = conn.sock.send(chunk)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                chunk.release()
                break
            except (OSError, ValueError) as exc:
                chunk.release()
                self._dropped(conn, exc)
                return
            chunk.release()
            del out[:sent]
        self._after_send(conn)

    def _after_send(self, conn: C) -> None:
        if conn.sock.fileno() < 0:
            return
        if conn.closing and not conn.outbuf:
            self.end(conn)
            return
        reading = 0 if conn.closing else selectors.EVENT_READ
        self._interest(conn, reading | (selectors.EVENT_WRITE if conn.outbuf else 0))
