"""What the TCP store server holds: one state blob, its fencing token, and what wakes waiters.

No sockets and no locks here: :class:`~clusterbook.rendezvous.backends.tcp_server.StoreServer`
owns a :class:`StateStore` on its one thread and serves it over the network.

Besides the blob, the store keeps it decoded (when it is a rendezvous state) so that rendezvous
steps run on it without decoding it each time, and the token of the last write that may change
a rendezvous decision (:func:`~clusterbook.rendezvous.ops.decisions_may_change`), which is what
a decision watch waits for, and of the last write that changed more than heartbeats and reports
(:func:`~clusterbook.rendezvous.ops.members_may_change`), which is what a member watch waits
for: a heartbeat wakes only the plain watches. The steps that arrive
together run as one batch (:meth:`StateStore.run`): on one draft of the state, stored as one
write, encoded once when first read. A node's own requests are answered with its view of the
state (:meth:`StateStore.view`), whose size does not grow with the cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from json.encoder import encode_basestring_ascii

from clusterbook.rendezvous.api import RendezvousStateError, Token
from clusterbook.rendezvous.backends.wire import MAX_STATE, TOKEN_INT, TOKEN_NONE
from clusterbook.rendezvous.info import Info
from clusterbook.rendezvous.ops import decisions_may_change, members_may_change
from clusterbook.rendezvous.state import Draft, RendezvousState, decode, encode
from clusterbook.rendezvous.step import Step, settings_size
from clusterbook.rendezvous.view import views_of

__all__ = ["ANY", "DECISIONS", "MEMBERS", "StateStore"]

_log = logging.getLogger("clusterbook.rendezvous.backends.tcp")

_GROWTH = 64
"""Bytes a step may add to the encoded state besides its own wire size (which holds its report,
which the state holds escaped, its node id once, and its settings and times, which the state
does not hold) and three more copies of its node id (it may be in up to four places): numbers
and punctuation. A bound that spares encoding the state at every write."""
_RANK_DIGITS = 7
"""What completing a round may add per participant: its rank's digits (up to 7: ranks below
10 million), in place of the 0 it had."""


def _growth(step: Step, size: int) -> int:
    """A bound of the bytes ``step`` (``size`` bytes on the wire, of which its settings, which
    the state does not hold) adds to the encoded state."""
    node = len(encode_basestring_ascii(step.node))  # as JSON writes it
    growth = size - settings_size(step.settings) + 3 * node + _GROWTH
    info = step.info
    if isinstance(info, Info):  # its text came as it is, and is stored escaped
        growth += len(info.quoted) - len(info.text) - 1  # (its bytes: at least its length)
    return growth


ANY, MEMBERS, DECISIONS = 0, 1, 2
"""What a watch waits for: any write; one that changes more than heartbeats and reports; one
that may change a rendezvous decision (each is also the one before)."""


class StateStore:
    """The blob and its token; the tokens of the last writes that may change what members
    follow and a decision."""

    def __init__(self, limit: int = MAX_STATE) -> None:
        self.limit = limit  # the largest state stored, in bytes
        self.token: Token = 0  # 0: nothing stored yet
        self.decisive: Token = 0  # the token of the last write that may change a decision
        self.eventful: Token = 0  # ... that changed more than heartbeats and reports
        # The stored state is the blob, or the decoded state when steps wrote it: encoded on
        # the first read (the answers to steps held meanwhile all get the last one).
        self._blob: bytes | None = None
        self._view: bytes | None = None  # the state without the reports, once asked for
        self._decoded: RendezvousState | None = None  # None: nothing stored, or not a state
        self._views: Callable[[str], bytes] | None = None  # views of it, once asked for
        self._size = 0  # the blob's size, or a bound of it while it is not encoded

    def current(
        self, *, reports: bool = True, since: Token | None = None
    ) -> tuple[bytes, Token] | None:
        """The stored state and its token (None before the first write). Without ``reports``,
        the state as a node's own requests are answered: without the nodes' reports
        (``node_info``: facts and load, most of the state's bytes), which only the head reads
        and which no node's decisions look at. With ``since`` (a token of this store), with
        only the reports written after it (see :meth:`.RendezvousBackend.read_state`)."""
        if self.token == 0:
            return None
        decoded = self._decoded
        if decoded is not None and since is not None and 0 < since < self.token:
            changed = {n: i for n, i in decoded.node_info.items() if i.version > since}
            if len(changed) < len(decoded.node_info):
                return encode(replace(decoded, node_info=changed)), self.token
        elif since == self.token:  # nothing written since: as a watch that timed out asks
            reports = False
        if reports or decoded is None or not decoded.node_info:
            if self._blob is None:
                assert decoded is not None
                self._blob = encode(decoded)
                self._size = len(self._blob)
            return self._blob, self.token
        if self._view is None:
            self._view = encode(replace(decoded, node_info={}))
        return self._view, self.token

    @property
    def decoded(self) -> RendezvousState | None:
        """The stored state, decoded (None before the first write, or when the stored blob is
        not a rendezvous state). Its containers are the store's: read, never change them."""
        return self._decoded

    def view(self, node: str) -> tuple[bytes, Token] | None:
        """``node``'s view of the stored state (:func:`~clusterbook.rendezvous.view.view_of`)
        and its token: what a node's own requests are answered, in a size that does not grow
        with the cluster. A stored blob that is not a rendezvous state is answered as it is."""
        if self.token == 0:
            return None
        if self._decoded is None:
            return self.current()
        if self._views is None:  # a write answers every node that waits: encoded once per state
            self._views = views_of(self._decoded)
        return self._views(node), self.token

    def matches(self, kind: int, value: int) -> bool:
        """Whether the token ``kind, value`` (see :func:`.wire.token_spec`) is the stored one."""
        current = None if self.token == 0 else self.token
        if kind == TOKEN_NONE:
            return current is None
        return kind == TOKEN_INT and current == value

    def settled(self, kind: int, value: int, *, level: int = ANY) -> bool:
        """Whether a watch from the token ``kind, value`` returns now: the token differs (a
        plain watch, ``ANY``), or a write of the watch's ``level`` came after it (``MEMBERS``,
        ``DECISIONS``; a token this store never gave out counts as differing)."""
        if level != ANY and kind == TOKEN_INT and 0 < value <= self.token:
            return (self.decisive if level == DECISIONS else self.eventful) > value
        return not self.matches(kind, value)

    def reached(self) -> tuple[int, ...]:
        """The watch levels the last write reached: held watches of other levels cannot have
        been settled by it (see :meth:`settled`)."""
        if self.decisive == self.token:
            return (ANY, MEMBERS, DECISIONS)
        if self.eventful == self.token:
            return (ANY, MEMBERS)
        return (ANY,)

    def write(
        self,
        state: bytes | None,
        decoded: RendezvousState | None = None,
        size: int = 0,
        *,
        levels: tuple[bool, bool] | None = None,
    ) -> bool:
        """Store ``state``, or ``decoded`` (then encoded when first read) if ``state`` is None,
        with ``size`` a bound of its encoded size; return whether the write is decisive.
        ``levels``: whether it may change a decision and what members follow, when the writer
        knows (a batch of steps, from its draft in O(1)); else the states are compared."""
        self._size = size if state is None else len(state)
        if decoded is None:
            assert state is not None
            try:
                decoded = decode(state)
            except RendezvousStateError:
                decoded = None  # not a rendezvous state: every write of it is decisive
        before = self._decoded
        self._blob, self._decoded, self._view, self._views = state, decoded, None, None
        self.token += 1
        if levels is None and decoded is not None:  # a whole new state: every report is new
            for info in decoded.node_info.values():
                info.version = self.token
        if levels is None:
            if before is None or decoded is None or decisions_may_change(before, decoded):
                levels = True, True
            else:
                levels = False, members_may_change(before, decoded)
        decisive, eventful = levels
        if decisive:
            self.decisive = self.eventful = self.token
        elif eventful:
            self.eventful = self.token
        return decisive

    def compare_and_set(self, kind: int, value: int, state: bytes) -> bool | None:
        """Write ``state`` if the token ``kind, value`` is the stored one: None if not, else
        whether the write is decisive."""
        if not self.matches(kind, value):
            return None
        return self.write(state)

    def run(self, steps: Sequence[tuple[Step, int]]) -> tuple[list[float], bool | None]:
        """Run ``steps`` (each with its size on the wire) in turn on the stored state and store
        what they wrote as one write. Returns how long each answer may be held
        (:meth:`Step.hold` on the state after them all) and None if nothing was written, else
        whether the write is decisive. A stored blob that is not a rendezvous state is left
        alone: each client reports it when it decodes it.

        The steps change the stored state's own containers (no copy of a whole cluster's
        state per batch): a step that fails (a bug) is taken back and logged, the others
        stand; a batch whose state would be over the limit is taken back whole."""
        if self.token == 0:
            base = RendezvousState()
        elif self._decoded is None:
            return [0.0] * len(steps), None
        else:
            base = self._decoded
        draft = base.draft(shared=True)
        start = draft.mark()
        wrote, failed = False, set()
        for i, (step, _) in enumerate(steps):
            mark = draft.mark()
            try:
                wrote |= step.run_on(draft)
            except Exception:
                _log.exception("A rendezvous step of node %r failed; no change.", step.node)
                draft.undo(mark)
                failed.add(i)
        decisive = None
        state = base
        if wrote:
            new = draft.freeze()
            bound = self._size + sum(_growth(step, size) for step, size in steps)
            if new.complete and not base.complete:
                bound += _RANK_DIGITS * len(new.participants)
            decisive = self._store(new, bound, steps, _levels(base, new, draft))
            if decisive is None:
                draft.undo(start)  # the stored state's containers as they were
            else:
                state = new
                for step, _ in steps:  # the reports this write stored: for reads since
                    info = step.info
                    if isinstance(info, Info) and new.node_info.get(step.node) is info:
                        info.version = self.token
        holds = [0.0 if i in failed else step.hold(state) for i, (step, _) in enumerate(steps)]
        return holds, decisive

    def _store(
        self,
        new: RendezvousState,
        bound: int,
        steps: Sequence[tuple[Step, int]],
        levels: tuple[bool, bool],
    ) -> bool | None:
        if bound <= self.limit:
            return self.write(None, new, bound, levels=levels)
        blob = encode(new)  # near the limit, the exact size decides
        if len(blob) > self.limit:
            _log.error(
                "Rendezvous steps of %s made a state of %d bytes, over the store's limit of %d; "
                "it is not stored.",
                ", ".join(sorted({repr(step.node) for step, _ in steps})),
                len(blob),
                self.limit,
            )
            return None
        return self.write(blob, new, levels=levels)


def _levels(before: RendezvousState, after: RendezvousState, draft: Draft) -> tuple[bool, bool]:
    """What :func:`~clusterbook.rendezvous.ops.decisions_may_change` and
    :func:`~clusterbook.rendezvous.ops.members_may_change` say of the write from ``before``
    to ``after`` that ``draft`` made, in O(1): from what the draft saw leave and move (a node
    that left and came back in the batch counts as gone: waking more is allowed)."""
    decisive = (
        draft.left
        or before.round != after.round
        or before.complete != after.complete
        or before.closed != after.closed
        or before.deadline != after.deadline
    )
    return decisive, decisive or draft.moved or before.stop_jobs != after.stop_jobs
