"""What the TCP store server holds: one state blob, its fencing token, and waits on them.

No sockets here: :class:`~clusterbook.rendezvous.backends.tcp_server.StoreServer` serves a
:class:`StateStore` over the network, guarding it with its own lock (every method is called
with that lock held, waits release it meanwhile).

Besides the blob, the store keeps it decoded (when it is a rendezvous state) so that rendezvous
steps run on it without decoding it each time, and the token of the last write that may change
a rendezvous decision (:func:`~clusterbook.rendezvous.ops.decisions_may_change`), which is what
a decision watch waits for: a heartbeat wakes only the plain watches.
"""

from __future__ import annotations

import logging
import threading

from clusterbook.rendezvous.api import RendezvousStateError, Token
from clusterbook.rendezvous.backends._wire import _INT, _NONE, MAX_STATE
from clusterbook.rendezvous.ops import decisions_may_change
from clusterbook.rendezvous.state import RendezvousState, decode, encode
from clusterbook.rendezvous.step import Step

__all__ = ["StateStore"]

_log = logging.getLogger("clusterbook.rendezvous.backends.tcp")


class StateStore:
    """The blob, its token, and two conditions on ``lock``: any write, decisive writes."""

    def __init__(self, lock: threading.Lock) -> None:
        self._changed = threading.Condition(lock)
        self._decided = threading.Condition(lock)
        self.token: Token = 0  # 0: nothing stored yet
        # The stored state is the blob, or the decoded state when a step wrote it: encoded on
        # the first read (the answers to steps held meanwhile all get the last one).
        self._blob: bytes | None = None
        self._decoded: RendezvousState | None = None  # None: nothing stored, or not a state
        self._size = 0  # the blob's size, or a bound of it while it is not encoded
        self._decisive: Token = 0  # the token of the last write that may change a decision

    def current(self) -> tuple[bytes, Token] | None:
        if self.token == 0:
            return None
        if self._blob is None:
            assert self._decoded is not None
            self._blob = encode(self._decoded)
            self._size = len(self._blob)
        return self._blob, self.token

    def matches(self, kind: int, value: int) -> bool:
        """Whether the token ``kind, value`` (see ``_wire._spec``) is the stored one."""
        current = None if self.token == 0 else self.token
        if kind == _NONE:
            return current is None
        return kind == _INT and current == value

    def settled(self, kind: int, value: int, *, decisions: bool) -> bool:
        """Whether a watch from the token ``kind, value`` returns now: the token differs (a
        plain watch), or a decisive write came after it (a decision watch; a token this store
        never gave out counts as differing)."""
        if decisions and kind == _INT and 0 < value <= self.token:
            return self._decisive > value
        return not self.matches(kind, value)

    def wait(self, timeout: float, *, decisions: bool) -> None:
        (self._decided if decisions else self._changed).wait(timeout)

    def wake_all(self) -> None:
        self._changed.notify_all()
        self._decided.notify_all()

    def write(
        self, state: bytes | None, decoded: RendezvousState | None = None, size: int = 0
    ) -> None:
        """Store ``state``, or ``decoded`` (then encoded when first read) if ``state`` is None,
        with ``size`` a bound of its encoded size."""
        self._size = size if state is None else len(state)
        if decoded is None:
            assert state is not None
            try:
                decoded = decode(state)
            except RendezvousStateError:
                decoded = None  # not a rendezvous state: every write of it is decisive
        before = self._decoded
        self._blob, self._decoded = state, decoded
        self.token += 1
        decisive = before is None or decoded is None or decisions_may_change(before, decoded)
        if decisive:
            self._decisive = self.token
            self._decided.notify_all()
        self._changed.notify_all()

    def compare_and_set(self, kind: int, value: int, state: bytes) -> bool:
        won = self.matches(kind, value)
        if won:
            self.write(state)
        return won

    def run(self, step: Step, size: int) -> float:
        """Run ``step`` (``size`` bytes on the wire) on the stored state and store what it
        writes; return how long the answer may be held (:meth:`Step.hold`). A stored blob that
        is not a rendezvous state is left alone: the client reports it when it decodes it."""
        if self.token == 0:
            base = RendezvousState()
        elif self._decoded is None:
            return 0.0
        else:
            base = self._decoded
        new = step.run(base)
        if new is None:
            return step.hold(base)
        # A step adds its node id to at most four places, and its report: a bound of the new
        # size without encoding it; near the limit, the exact size decides.
        bound = self._size + 4 * size + 256
        if bound <= MAX_STATE:
            self.write(None, new, bound)
            return step.hold(new)
        blob = encode(new)
        if len(blob) > MAX_STATE:
            _log.error(
                "A rendezvous step of node %r made a state of %d bytes, over the store's limit "
                "of %d; it is not stored.",
                step.node,
                len(blob),
                MAX_STATE,
            )
            return 0.0
        self.write(blob, new)
        return step.hold(new)
