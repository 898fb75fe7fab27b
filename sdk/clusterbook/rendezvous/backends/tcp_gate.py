"""Who gets into a :class:`~.tcp_loop.FrameLoop`, and what connections may cost it.

:class:`Limits` bound what anyone who can reach the listener may make the loop hold, whoever
they are (the secret is proved only after a connection is in):

- a connection has ``handshake`` seconds to be let in (its service says so once the peer
  proved the secret), else it is closed;
- at most ``pending`` wait to be let in; a new one then pushes out the oldest, once that one
  has waited ``patience`` seconds: until then newcomers wait in the listen backlog, where they
  cost no descriptor, so that a burst of genuine peers does not push itself out;
- at most ``connections`` are open at once; the next is closed at once;
- when ``accept`` fails (out of file descriptors, say) the loop stops accepting for a moment,
  a little longer each time (:func:`next_pause`), and goes on.

:func:`next_pause` and :func:`wait_for_room` decide (pure); :class:`Gate` keeps the
connections in and waiting, accepts, vets and wraps them, and pauses the listener.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from clusterbook.durations import duration
from clusterbook.errors import ConfigError
from clusterbook.rendezvous.backends.wire import shutdown

__all__ = ["LISTENER", "Entrant", "Gate", "Limits", "Quiet", "next_pause", "wait_for_room"]

LISTENER = "listener"
"""The selector data of the listening socket."""
_QUIET = 10.0  # seconds between two warnings of the same kind


@dataclass(frozen=True, slots=True)
class Limits:
    """What connections may cost (see the module's docstring); seconds and counts."""

    handshake: float = 5.0
    pending: int = 64
    patience: float = 0.0
    connections: int = 256
    backoff: tuple[float, float] = (0.05, 1.0)  # first and longest pause of accept

    def __post_init__(self) -> None:
        # Kept as seconds, whatever form of duration was given ("5s", a timedelta).
        object.__setattr__(self, "handshake", duration(self.handshake, "Limits.handshake"))
        patience = duration(self.patience, "Limits.patience", zero=True)
        object.__setattr__(self, "patience", patience)
        for name in ("pending", "connections"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"Limits.{name} must be a whole number of connections >= 1, got {value!r}."
                )
        backoff = self.backoff
        if not (isinstance(backoff, tuple) and len(backoff) == 2):
            raise ConfigError(
                f"Limits.backoff must be (first, longest) pause in seconds, got {backoff!r}."
            )
        first = duration(backoff[0], "Limits.backoff's first pause")
        longest = duration(backoff[1], "Limits.backoff's longest pause")
        if longest < first:
            raise ConfigError(
                f"Limits.backoff's longest pause must be at least its first, got {backoff!r}."
            )
        object.__setattr__(self, "backoff", (first, longest))


def next_pause(pause: float, limits: Limits) -> float:
    """How long accept pauses after it failed again, having paused ``pause`` (0: not)."""
    first, longest = limits.backoff
    return first if pause <= 0 else min(longest, pause * 2)


def wait_for_room(pending: int, oldest: float | None, limits: Limits, now: float) -> float | None:
    """Until when accept waits, with ``pending`` connections waiting to be let in, the
    oldest since ``oldest``; None: accept now (pushing out the oldest when they are full)."""
    if pending < limits.pending or oldest is None or now - oldest >= limits.patience:
        return None
    return oldest + limits.patience


class Entrant(Protocol):
    """What the gate keeps of a connection: its socket, and when it came in."""

    sock: socket.socket
    since: float


C = TypeVar("C", bound=Entrant)


class Quiet:
    """Warnings to ``log``, at most one of a kind in ten seconds: a flood says so once."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._until: dict[str, float] = {}

    def warn(self, kind: str, message: str, *args: object) -> None:
        """Log ``message % args``, unless a warning of this ``kind`` went out just before."""
        now = time.monotonic()
        if now >= self._until.get(kind, 0.0):
            self._until[kind] = now + _QUIET
            self.log.warning(message, *args)


class Gate(Generic[C]):
    """The connections of a loop, those not let in yet (the oldest first), and the way in.

    ``serve(sock)`` serves an accepted socket (vetted, wrapped in ``tls`` when given) and
    brings its connection in through :meth:`enter`; ``end(conn)`` closes one (it calls
    :meth:`leave`). ``vet(sock)`` looks at each accepted socket first (and may set its
    options): it says why it is refused, or None; an ``OSError`` drops it without a word.
    """

    def __init__(
        self,
        listener: socket.socket,
        selector: selectors.BaseSelector,
        limits: Limits,
        *,
        name: str,
        quiet: Quiet,
        serve: Callable[[socket.socket], None],
        end: Callable[[C], None],
        tls: ssl.SSLContext | None = None,
        vet: Callable[[socket.socket], str | None] | None = None,
    ) -> None:
        self.conns: set[C] = set()
        self.pending: dict[C, None] = {}  # not let in yet, the oldest first
        self._listener, self._selector, self._limits = listener, selector, limits
        self._name, self._quiet, self._serve, self._end = name, quiet, serve, end
        self._tls, self._vet = tls, vet
        self._pause = 0.0  # the last pause of accept after it failed (0: it did not)
        self._resume_at: float | None = None  # when accept goes on (None: it is on)
        self._full = False  # accept waits for room among the pending, not after an error
        listener.setblocking(False)
        selector.register(listener, selectors.EVENT_READ, LISTENER)

    def enter(self, conn: C) -> None:
        """``conn`` is in, and pending until :meth:`let_in`."""
        conn.since = time.monotonic()
        self.conns.add(conn)
        self.pending[conn] = None

    def let_in(self, conn: C) -> None:
        """``conn`` proved what its service asks: it no longer counts as pending."""
        if conn in self.pending:
            del self.pending[conn]
            if self._full:  # a place came free
                self._resume()

    def leave(self, conn: C) -> bool:
        """Forget ``conn``; False if it had left already."""
        if conn not in self.conns:
            return False
        self.conns.discard(conn)
        self.let_in(conn)
        return True

    def deadline(self) -> float | None:
        """When :meth:`tick` has something to do (``time.monotonic()``), None: nothing."""
        times = [] if self._resume_at is None else [self._resume_at]
        if self.pending:  # the oldest's deadline comes first
            times.append(next(iter(self.pending)).since + self._limits.handshake)
        return min(times) if times else None

    def tick(self, now: float) -> None:
        """End the connections not let in in time; accept again when the pause is over."""
        handshake = self._limits.handshake
        while self.pending and (oldest := next(iter(self.pending))).since + handshake <= now:
            self._quiet.log.info("%s dropped a connection: not let in within %g s.", self._name,
                                 handshake)  # fmt: skip
            self._end(oldest)
        if self._resume_at is not None and now >= self._resume_at:
            self._resume()

    def close(self) -> None:
        """Close every connection and the listener, telling no one."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                shutdown(conn.sock, socket.SHUT_RDWR)
            conn.sock.close()
        self.conns.clear()
        self.pending.clear()
        self._listener.close()

    def accept(self) -> None:
        """Take in the connections the listener holds, as far as the limits let it."""
        limits = self._limits
        while True:
            oldest = next(iter(self.pending), None)
            since = None if oldest is None else oldest.since
            until = wait_for_room(len(self.pending), since, limits, time.monotonic())
            if until is not None:
                self._pause_until(until, full=True)
                return
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS...: pause, then go on
                self._pause = next_pause(self._pause, limits)
                self._pause_until(time.monotonic() + self._pause)
                self._quiet.warn("accept", "%s cannot accept (%s); again in %.2f s.", self._name,
                                 exc, self._pause)  # fmt: skip
                return
            self._pause = 0.0
            self._take(sock, oldest if len(self.pending) >= limits.pending else None)

    def _take(self, sock: socket.socket, oldest: C | None) -> None:
        """Serve ``sock`` once vetted, ``oldest`` (pending too long, if given) making room."""
        try:
            refusal = None if self._vet is None else self._vet(sock)
        except OSError:
            sock.close()
            return
        if refusal is not None:
            self._quiet.warn("vet", "%s refused a connection: %s.", self._name, refusal)
            sock.close()
            return
        if oldest is not None:
            self._end(oldest)
        if len(self.conns) >= self._limits.connections:
            self._quiet.warn("full", "%s is full (%d connections).", self._name, len(self.conns))
            sock.close()
            return
        try:
            sock.setblocking(False)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as exc:
            self._quiet.log.info("%s dropped a connection: %s", self._name, exc)
            sock.close()
            return
        self._serve(sock)

    def _pause_until(self, when: float, *, full: bool = False) -> None:
        if self._resume_at is None:
            self._selector.unregister(self._listener)
        self._resume_at, self._full = when, full

    def _resume(self) -> None:
        if self._resume_at is not None:
            self._resume_at, self._full = None, False
            self._selector.register(self._listener, selectors.EVENT_READ, LISTENER)
