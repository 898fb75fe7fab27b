"""The store's side of the wire protocol (:mod:`.wire`), served by a
:class:`~.tcp_loop.FrameLoop` on its thread: :class:`StoreProtocol`.

A connection shows the secret in its hello before anything else; then it asks one request at a
time. Watches, and steps that leave their node waiting, are held until a write settles them or
their time is up, each in the set of the level it waits for (:mod:`._store`), so that a write
looks only at the held requests it may settle. The steps read in one pass of the loop run as one
batch (:data:`BATCH`) on one copy of the state. A node whose connection ends without a goodbye
is lost once ``lost_grace`` has passed without it coming back (``on_lost``).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

from clusterbook.rendezvous.api import RendezvousStateError
from clusterbook.rendezvous.backends._store import ANY, DECISIONS, MEMBERS, StateStore
from clusterbook.rendezvous.backends.tcp_loop import Connection, FrameLoop
from clusterbook.rendezvous.backends.wire import (
    ACCEPTED,
    HEAD,
    HELLO_MAX,
    MAX_FRAME,
    MAX_STATE,
    MAX_WHOLE,
    PART,
    PART_SIZE,
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
)
from clusterbook.rendezvous.step import Step, StepFormatError

__all__ = ["BATCH", "StoreConnection", "StoreProtocol"]

# The store's records keep the logger name of the public module, where users configure it.
_log = logging.getLogger("clusterbook.rendezvous.backends.tcp")

BATCH = 1024
"""The most rendezvous steps the server runs as one write (those read in one pass of its loop,
in this many at a time)."""
_LEVELS = {b"W": ANY, b"M": MEMBERS, b"D": DECISIONS, b"R": ANY}  # what each watch waits for


@dataclass(eq=False)
class _Wait:
    """A request held until the state changes (a watch, or a step that left its node waiting)."""

    kind: int
    value: int
    level: int  # _store.ANY, MEMBERS or DECISIONS
    node: str | None = None  # answered with this node's view of the state (None: the state)
    parts: bool = False  # answered in parts (``R``)
    since: int | None = None  # ... with the reports written after this token only


@dataclass(eq=False)
class StoreConnection(Connection):
    """A connection to the store, and what it asked."""

    node: str | None = None
    open: bool = False  # its hello was accepted
    busy: bool = False  # a request is being answered (a step in the batch, or a wait)
    wait: _Wait | None = None
    reading: tuple[bytes, int] | None = None  # the state an ``R`` answers in parts, its token


class StoreProtocol:
    """The store's side of the wire protocol, for a :class:`~.tcp_loop.FrameLoop` to serve
    (see the module's docstring); :attr:`live` and :attr:`lock` tell other threads who is
    connected. ``loop`` is set before the loop starts."""

    def __init__(
        self,
        secret: bytes,
        store: StateStore,
        lost_grace: float,
        on_lost: Callable[[str, bytes], bytes | None] | None,
    ) -> None:
        self.loop: FrameLoop[StoreConnection] | None = None
        self.lock = threading.Lock()  # guards the sessions (read by other threads)
        self.live: dict[str, int] = {}  # node -> its connections now
        # Nodes whose last connection ended without a goodbye and whose grace has not run
        # out yet, with the generation of that connection.
        self._pending: dict[str, int] = {}
        self._secret, self._store = secret, store
        self._lost_grace, self._on_lost = lost_grace, on_lost
        # The held requests, by what they wait for: a write wakes only the levels it reaches.
        self._waiting: dict[int, set[StoreConnection]] = {
            ANY: set(),
            MEMBERS: set(),
            DECISIONS: set(),
        }
        self._steps: list[tuple[StoreConnection, Step, int]] = []
        self._generation: dict[str, int] = {}

    def _loop(self) -> FrameLoop[StoreConnection]:
        assert self.loop is not None
        return self.loop

    @property
    def losses_pending(self) -> int:
        """Connections lost whose grace has not run out yet."""
        with self.lock:
            return len(self._pending)

    def lose_now(self, node: str) -> bool:
        """Call ``node`` lost now, on the loop's thread, if its connection ended without a
        goodbye and has not come back: the caller knows its work there ended (a reconnect
        within the grace could not save it). False when its grace was not running."""
        with self.lock:
            generation = self._pending.get(node)
        if generation is None:
            return False
        self._lost(node, generation)
        return True

    # what the loop calls

    def connection(self, sock: socket.socket) -> StoreConnection:
        """A new connection, which may send its hello and nothing more."""
        return StoreConnection(sock, HELLO_MAX)

    def frame(self, conn: StoreConnection, payload: bytes) -> None:
        """Take a hello, or a request once the hello was accepted."""
        if not conn.open:
            self._hello(conn, payload)
            return
        if payload == b"B":
            self._loop().end(conn, clean=True)
            return
        if conn.busy:
            raise ProtocolError("a request while another is answered")
        if payload[:1] == b"N" and len(payload) == 1 + PART.size:
            (offset,) = PART.unpack_from(payload, 1)
            self._loop().send(conn, self._part(conn, offset))
            return
        conn.reading = None  # a read in parts ends with any other request
        if payload == b"G":
            self._send(conn, self._reply_state())
        elif payload[:1] == b"U":
            try:
                step = Step.from_wire(payload[1:])
            except StepFormatError as exc:
                raise ProtocolError(str(exc)) from None
            conn.busy = True
            if not self._steps:
                self._loop().later(0.0, self._run_steps)
            self._steps.append((conn, step, len(payload) - 1))
        elif payload[:1] in (b"S", b"W", b"D", b"M", b"R") and len(payload) > SPEC.size:
            self._request(conn, payload[:1], payload[1:])
        else:
            raise ProtocolError(f"unexpected request {payload[:1]!r} of {len(payload)} bytes")

    def ended(self, conn: StoreConnection, clean: bool) -> None:
        """A node's connection that ended without a goodbye is lost."""
        if conn.wait is not None:
            self._waiting[conn.wait.level].discard(conn)
        conn.wait = None
        if conn.open:  # before the close: a client that saw it gone finds the node gone
            self._session_ended(conn.node, clean)

    def stopped(self, failure: BaseException | None) -> None:
        """The loop ended: no node is connected, nothing is held."""
        with self.lock:
            self.live.clear()
        for held in self._waiting.values():
            held.clear()
        self._steps.clear()

    # requests

    def _hello(self, conn: StoreConnection, payload: bytes) -> None:
        loop = self._loop()
        try:
            node = check_hello(payload, self._secret)
        except AuthFailed:
            loop.warn("auth", "The rendezvous store refused a client: authentication failed.")
            loop.send(conn, REFUSED)
            loop.finish(conn)
            return
        conn.node, conn.open, conn.limit = node, True, MAX_FRAME
        loop.let_in(conn)
        self._session_started(node)
        loop.send(conn, ACCEPTED)

    def _request(self, conn: StoreConnection, op: bytes, body: bytes) -> None:
        kind, value = SPEC.unpack_from(body)
        if kind not in (TOKEN_NONE, TOKEN_INT, TOKEN_ANY):
            raise ProtocolError(f"token kind {kind}")
        store = self._store
        if op == b"S":
            decisive = store.compare_and_set(kind, value, body[SPEC.size :])
            current = store.current()
            won = decisive is not None
            state = current[0] if current else b""
            self._send(conn, b"r" + HEAD.pack(won, store.token) + state)
            if won:
                self._changed()
        elif len(body) == SPEC.size + SECONDS.size or (
            op == b"R" and len(body) == SPEC.size + SECONDS.size + PART.size
        ):
            (timeout,) = SECONDS.unpack_from(body, SPEC.size)
            since = None
            if len(body) > SPEC.size + SECONDS.size:  # a read of the reports since a token
                (since,) = PART.unpack_from(body, SPEC.size + SECONDS.size)
            level = _LEVELS[op]
            node = None if level == ANY else conn.node
            wait = _Wait(kind, value, level, node, parts=op == b"R", since=since)
            self._hold(conn, wait, timeout)
        else:
            raise ProtocolError(f"a watch of {len(body)} bytes")

    def _reply_state(self, wait: _Wait | None = None) -> bytes:
        """The stored state as an ``s`` reply: whole to a plain watch or a get (the head's);
        to a node's step or its decision or member watch, the node's view of it (whose size
        does not grow with the cluster), or without the nodes' reports to a client that
        named no node."""
        store = self._store
        if wait is None or wait.level == ANY:
            current = store.current()
        elif wait.node is not None:
            current = store.view(wait.node)
        else:
            current = store.current(reports=False)
        if current is None:
            return b"s" + HEAD.pack(0, 0)
        return b"s" + HEAD.pack(1, current[1]) + current[0]

    def _answer_wait(self, conn: StoreConnection, wait: _Wait | None) -> None:
        """Answer a held request: the state (or a view), or the first part of it."""
        if wait is None or not wait.parts:
            self._send(conn, self._reply_state(wait))
            return
        current = self._store.current(since=wait.since)
        conn.reading = None if current is None else current
        self._loop().send(conn, self._part(conn, 0))

    def _part(self, conn: StoreConnection, offset: int) -> bytes:
        """The part of the state ``conn`` reads that begins at ``offset``, as a ``p`` reply."""
        reading = conn.reading
        if reading is None:
            if offset:
                raise ProtocolError("a part of no read in parts")
            return b"p" + HEAD.pack(0, 0) + PART.pack(0)
        state, token = reading
        if offset > len(state):
            raise ProtocolError(f"a part at {offset} of a state of {len(state)} bytes")
        part = state[offset : offset + PART_SIZE]
        if offset + len(part) >= len(state):
            conn.reading = None  # the last part: nothing more to keep
        return b"p" + HEAD.pack(1, token) + PART.pack(len(state)) + part

    def _send(self, conn: StoreConnection, reply: bytes) -> None:
        """Send ``reply``, or end ``conn`` when it is over a frame (a state read whole that
        grew larger than one: only a read in parts takes it)."""
        loop = self._loop()
        if len(reply) <= MAX_FRAME:
            loop.send(conn, reply)
            return
        loop.warn(
            "whole",
            "The rendezvous state is %d bytes, over the %d one answer holds (MAX_WHOLE): a "
            "client that read it whole was disconnected; read it with read_state().",
            len(reply) - 1 - HEAD.size,
            MAX_WHOLE,
        )
        loop.end(conn)

    def apply(self, change: Callable[[bytes | None], bytes | None]) -> tuple[bytes, int] | None:
        """Run ``change`` on the stored state here (on the loop's thread) and store what it
        returns: a change of this process's, whatever the size of the state."""
        current = self._store.current()
        new = change(None if current is None else current[0])
        if new is None:
            return current
        if not isinstance(new, bytes) or len(new) > MAX_STATE:
            size = len(new) if isinstance(new, bytes) else 0
            raise RendezvousStateError(
                f"A change of the rendezvous state made {type(new).__name__} of {size} bytes; "
                f"the store holds bytes, at most {MAX_STATE} of them. Nothing was written."
            )
        self._store.write(new)
        self._changed()
        return self._store.current()

    def _hold(self, conn: StoreConnection, wait: _Wait, timeout: float) -> None:
        """Answer ``conn`` once ``wait`` is settled, or after ``timeout`` seconds."""
        timeout = min(WATCH_MAX, timeout) if timeout > 0 else 0.0  # NaN -> 0
        if timeout <= 0 or self._store.settled(wait.kind, wait.value, level=wait.level):
            conn.busy = False
            self._answer_wait(conn, wait)
            return
        conn.busy, conn.wait = True, wait
        self._waiting[wait.level].add(conn)
        self._loop().later(timeout, self._release, conn, wait)

    def _release(self, conn: StoreConnection, wait: _Wait) -> None:
        if conn.wait is wait:
            self._answer(conn)

    def _answer(self, conn: StoreConnection) -> None:
        wait = conn.wait
        self._waiting[ANY if wait is None else wait.level].discard(conn)
        conn.wait, conn.busy = None, False
        self._answer_wait(conn, wait)

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
            for (conn, step, _), hold in zip(batch, holds, strict=True):
                if conn.sock.fileno() >= 0:
                    # Its node waits: answer once that may have changed, or after ``hold``.
                    self._hold(conn, _Wait(TOKEN_INT, token, DECISIONS, step.node), hold)

    # sessions

    def _session_started(self, node: str | None) -> None:
        if node is None:
            return
        with self.lock:
            self.live[node] = self.live.get(node, 0) + 1
            self._generation[node] = self._generation.get(node, 0) + 1

    def _session_ended(self, node: str | None, clean: bool) -> None:
        if node is None:
            return
        with self.lock:
            left = self.live.get(node, 0) - 1
            if left > 0:
                self.live[node] = left
                return
            self.live.pop(node, None)
            generation = self._generation.get(node, 0)
        if not clean and not self._loop().closed and self._on_lost is not None:
            with self.lock:
                self._pending[node] = generation
            self._loop().later(self._lost_grace, self._lost, node, generation)

    def _lost(self, node: str, generation: int) -> None:
        assert self._on_lost is not None
        with self.lock:
            if self._pending.get(node) != generation:
                return  # called lost already (lose_now), or a later loss's grace runs
            del self._pending[node]
            if node in self.live or self._generation.get(node) != generation:
                return
        if self._loop().closed or (current := self._store.current()) is None:
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
