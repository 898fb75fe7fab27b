"""The rendezvous handler: runs the decisions of :mod:`.ops` against a backend.

One handler per node. :meth:`RendezvousHandler.next_rendezvous` leaves the node's previous round
(if any), then joins the next. Each operation sends a :class:`~.step.Step` to the store
(``backend.update``), which applies the decisions atomically and returns the state after them,
or the node's view of it (:mod:`.view`; the TCP store, on its side, in one round trip; other
stores by a compare-and-set loop). The handler decides on that itself: done, an error, another
step, or, when there is nothing to do but wait, a block in ``backend.watch_decisions`` until a
change that matters or the next moment a decision could change by time alone (the end of the
last call, a heartbeat due, a node expiring, the join deadline); the TCP store holds the answer
to a join step until then. Once the round is complete the handler's heartbeat thread
(:mod:`.beats`) beats every ``keep_alive_interval`` seconds until the next call,
:meth:`shutdown`, or the process ends; with ``beat_thread=False``, the caller beats.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.api import (
    RendezvousBackend,
    RendezvousClosedError,
    RendezvousError,
    RendezvousSettings,
    RendezvousTimeoutError,
    Token,
)
from clusterbook.rendezvous.beats import Heartbeats
from clusterbook.rendezvous.ops import Action, next_wakeup, sanitize, world_size
from clusterbook.rendezvous.state import RendezvousState, decode
from clusterbook.rendezvous.step import DECISIONS, WAKE_SLACK, Operation, Step
from clusterbook.rendezvous.view import NodeView, Observation, decode_answer, fresh, view_of
from clusterbook.wording import spell_or

__all__ = ["RendezvousHandler", "RendezvousInfo"]

_log = logging.getLogger("clusterbook.rendezvous")

_WATCH_CAP = 1.0
"""Longest single wait for the store (a watch, or a held join step): a bound on how stale a
waiter's clock view gets."""
_REPORTING = frozenset({Operation.JOIN, Operation.KEEP_ALIVE})  # writes with the node's report


@dataclass(frozen=True, slots=True)
class RendezvousInfo:
    """This node's place in a complete round, and where rank 0 is: its node (``leader``, None
    if it left the round already), and its hostname and first few addresses as it reported
    them (None and empty if it reported none)."""

    rank: int
    world_size: int
    round: int
    leader: str | None
    leader_host: str | None = None
    leader_addresses: tuple[str, ...] = ()


class RendezvousHandler:
    """Joins, heartbeats in and leaves one rendezvous as the node ``node``.

    Parameters
    ----------
    backend
        The store shared by all nodes of the rendezvous.
    settings
        The same settings on every node.
    node
        This node's id, unique in the rendezvous; ranks follow the sorted ids.
    clock
        Wall-clock time (epoch seconds), the clock of the state's deadlines and heartbeats.
    monotonic
        A monotonic clock for this node's own timeouts (join, close, heartbeat).
    on_change
        Called with each new state (or view of it: :data:`Observation`) this handler observes,
        outside its locks, from whichever thread observed it (the caller's or the heartbeat
        thread). Exceptions are logged.
    beat_thread
        Heartbeat from a thread of the handler's own while a round holds the node (default).
        False: the caller beats, with :meth:`heartbeat` when :meth:`heartbeat_due` says (an
        agent does, between its watches, so that one connection serves it all).
    """

    def __init__(
        self,
        backend: RendezvousBackend,
        settings: RendezvousSettings,
        node: str,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_change: Callable[[Observation], None] | None = None,
        info: Callable[[], dict[str, Any]] | None = None,
        beat_thread: bool = True,
    ) -> None:
        if not isinstance(node, str) or not node:
            raise ConfigError(f"The node id must be a non-empty string, got {node!r}.")
        self._backend = backend
        self._settings = settings
        self._node = node
        self._clock = clock
        self._monotonic = monotonic
        self._on_change = on_change
        self._info = info
        self._lock = threading.Lock()  # guards the last observed state and token
        self._state: Observation = RendezvousState()
        self._token: Token | None = None
        # Started now, idle until a round is complete (see .beats).
        self._beats = (
            Heartbeats(
                f"clusterbook-rendezvous-heartbeat-{node}",
                self._first_beat,
                self._beat,
                idle=settings.keep_alive_interval,
            )
            if beat_thread
            else None
        )

    @property
    def node(self) -> str:
        return self._node

    @property
    def settings(self) -> RendezvousSettings:
        return self._settings

    # --- public API ---------------------------------------------------------------------------

    def next_rendezvous(self) -> RendezvousInfo:
        """Leave the previous round (if in one), join the next and wait until it is complete.

        Raises :class:`RendezvousClosedError` if the rendezvous is closed,
        :class:`RendezvousTimeoutError` if no round took this node within ``timeout.join``,
        :class:`RendezvousStateError` if the stored state is corrupt.
        """
        self._stop_heartbeats()
        deadline = self._monotonic() + self._settings.timeout.join
        # Leaving and joining go to the store as one step: within the deadline, leaving always
        # finishes there, and joining then goes on from the state it left.
        state = self._run(Operation.JOIN, deadline, self._join_timeout, leave_first=True)
        if self._beats is not None:
            self._beats.start()
        view = state if isinstance(state, NodeView) else view_of(state, self._node)
        return RendezvousInfo(
            rank=state.participants[self._node],
            world_size=world_size(state),
            round=state.round,
            leader=view.leader,
            leader_host=view.leader_host,
            leader_addresses=view.leader_addresses,
        )

    def set_closed(self) -> None:
        """Close the rendezvous for good: no node may join it any more."""
        close = self._settings.timeout.close

        def timeout(_: Observation) -> RendezvousTimeoutError:
            return RendezvousTimeoutError(
                f"Node {self._node!r} could not close the rendezvous {self._settings.run_id!r} "
                f"within the close timeout of {close:g} s: the store kept changing under it or "
                "did not answer. Try again."
            )

        self._run(Operation.CLOSE, self._monotonic() + close, timeout)

    def is_closed(self) -> bool:
        """Whether the rendezvous is closed (reads the store)."""
        return self._read().closed

    def num_nodes_waiting(self) -> int:
        """How many live nodes wait for the next round (reads the store)."""
        return len(self._read().wait_list)

    def state(self) -> Observation:
        """The last state this handler observed (dead nodes already removed), or this node's
        view of it; no I/O."""
        with self._lock:
            return self._state

    def observed(self) -> tuple[Observation, Token | None]:
        """The last state (or view) this handler observed and its fencing token (None before
        any); no I/O. A watch from that token wakes at the first change after it."""
        with self._lock:
            return self._state, self._token

    def shutdown(self) -> bool:
        """Stop heartbeating (its thread ends) and leave the rendezvous (round or wait list)
        within ``timeout.close``. Returns whether the node left cleanly; safe to call again."""
        if self._beats is not None:
            self._beats.close(self._settings.timeout.heartbeat + _WATCH_CAP)
        close = self._settings.timeout.close
        try:
            self._run(
                Operation.EXIT,
                self._monotonic() + close,
                lambda s: self._leave_timeout(s, "close", close),
            )
        except RendezvousError as exc:
            _log.warning(
                "Node %r could not leave the rendezvous %r (%s: %s); the others will drop it "
                "once its heartbeat expires.",
                self._node,
                self._settings.run_id,
                type(exc).__name__,
                exc,
            )
            return False
        return True

    # --- the op loop --------------------------------------------------------------------------

    def _run(
        self,
        op: Operation,
        deadline: float,
        on_timeout: Callable[[Observation], RendezvousTimeoutError],
        *,
        leave_first: bool = False,
    ) -> Observation:
        """Run ``op`` until it says FINISH (after leaving the rendezvous, if ``leave_first``);
        ``deadline`` is on the monotonic clock."""
        settings, node, decide = self._settings, self._node, DECISIONS[op]
        raw, token = self._step((Operation.EXIT, op) if leave_first else (op,), deadline)
        in_time = raw
        while True:
            now = self._clock()
            wall_deadline = self._wall_deadline(now, deadline)
            state = fresh(raw, settings, now)
            if state is None:  # a view in which a node expired: a step drops it in the store
                raw, token = self._step((op,), deadline)
                continue
            self._observe(state, token)
            if now <= wall_deadline:
                in_time = state
            action = decide(state, node, settings, now, wall_deadline)

            if action is Action.FINISH:
                return state
            if action is Action.ERROR_CLOSED:
                raise RendezvousClosedError(
                    f"The rendezvous {settings.run_id!r} is closed: node {node!r} cannot join "
                    "it. Start a new rendezvous (a new run id) to run again."
                )
            if action is Action.ERROR_TIMEOUT:
                raise on_timeout(in_time)
            if action is Action.SYNC:
                wakeup = next_wakeup(state, node, settings, now, wall_deadline)
                wait = min(max(wakeup - now, 0.0) + WAKE_SLACK, _WATCH_CAP)
                raw, token = self._decode(self._backend.watch_decisions(token, wait))
            else:
                # Something to write: the step decides again on the store's current state.
                raw, token = self._step((op,), deadline)

    def _step(
        self, ops: tuple[Operation, ...], deadline: float
    ) -> tuple[Observation, Token | None]:
        """Send one step of ``ops`` to the store; the state after it (kept: no re-read)."""
        now = self._clock()
        info = None
        if self._info is not None and not _REPORTING.isdisjoint(ops):
            info = self._info()
        # A join that must wait for the others lets the store hold the answer until then.
        wait = _WATCH_CAP if Operation.JOIN in ops else 0.0
        wall_deadline = self._wall_deadline(now, deadline)
        step = Step(ops, self._node, self._settings, now, wall_deadline, info, wait)
        return self._decode(self._backend.update(step))

    def _wall_deadline(self, now: float, deadline: float) -> float:
        # The op deadline on the wall clock, recomputed each time so that a jump of the wall
        # clock does not stretch or shrink this node's own timeout.
        return now + (deadline - self._monotonic())

    def _read(self) -> RendezvousState:
        current = self._backend.read_state(None, 0.0)  # whole, whatever the store and size
        raw = RendezvousState() if current is None else decode(current[0])
        token = None if current is None else current[1]
        state = sanitize(raw, self._settings, self._clock())
        self._observe(state, token)
        return state

    @staticmethod
    def _decode(current: tuple[bytes, Token] | None) -> tuple[Observation, Token | None]:
        if current is None:
            return RendezvousState(), None
        blob, token = current
        return decode_answer(blob), token

    def _observe(self, state: Observation, token: Token | None) -> None:
        with self._lock:
            if token is not None and self._token is not None and token < self._token:
                return  # an older state than one already seen (another thread raced ahead)
            changed = state != self._state
            self._state, self._token = state, token
        if changed and self._on_change is not None:
            try:
                self._on_change(state)
            except Exception:
                _log.exception("A rendezvous on_change callback of node %r failed.", self._node)

    # --- error messages -----------------------------------------------------------------------

    def _join_timeout(self, state: Observation) -> RendezvousTimeoutError:
        settings, node = self._settings, self._node
        count = state.joined
        names = ", ".join(repr(n) for n in sorted(state.participants)) or "none"
        if isinstance(state, NodeView):  # it names only this node
            names = "this one" if node in state.participants else "not this one"
        longer = spell_or(
            "join_timeout", 2 * settings.timeout.join, "the join timeout where the cluster is made"
        )
        if state.complete:
            return RendezvousTimeoutError(
                f"Node {node!r} waited {settings.timeout.join:g} s (the join timeout) for the "
                f"next round of the rendezvous {settings.run_id!r}, but round {state.round} "
                f"kept running with {count} node(s) ({names}) and never ended. Stop that "
                f"round's nodes, or raise {longer}."
            )
        return RendezvousTimeoutError(
            f"The rendezvous {settings.run_id!r} did not complete within the join timeout of "
            f"{settings.timeout.join:g} s: {count} node(s) joined round {state.round} "
            f"({names}) but it needs at least {settings.min_nodes}. Start more nodes, lower "
            f"{spell_or('min_nodes', count or 1, 'its minimum of nodes')}, or raise "
            f"{longer}."
        )

    def _leave_timeout(
        self, state: Observation, name: str, seconds: float
    ) -> RendezvousTimeoutError:
        return RendezvousTimeoutError(
            f"Node {self._node!r} could not leave round {state.round} of the rendezvous "
            f"{self._settings.run_id!r} within the {name} timeout of {seconds:g} s: the store "
            "kept changing under it or did not answer. Its heartbeat will expire and the "
            "others will drop it."
        )

    # --- heartbeats ---------------------------------------------------------------------------

    def _stop_heartbeats(self) -> None:
        """Beat no more (a beat in flight finishes within its timeout; if the store hangs
        longer, a late write loses its compare-and-set anyway); the node stays in the state
        until it leaves, or its heartbeat expires."""
        if self._beats is not None:
            self._beats.pause(self._settings.timeout.heartbeat + _WATCH_CAP)

    def heartbeat_due(self) -> float:
        """Seconds until this node's next heartbeat is due (0: now), by the last state seen;
        for a caller that beats itself (``beat_thread=False``). No I/O."""
        return self._heartbeat_delay(self.state())

    def heartbeat(self) -> float:
        """Write this node's heartbeat now; the seconds until the next is due. A failed beat
        is logged, not raised (the next may succeed; the node's others see it expire if not)."""
        return self._beat()

    def _first_beat(self) -> float:
        return self._heartbeat_delay(self.state())

    def _beat(self) -> float:
        """One heartbeat; the seconds until the next."""
        settings = self._settings
        try:
            state = self._run(
                Operation.KEEP_ALIVE,
                self._monotonic() + settings.timeout.heartbeat,
                self._heartbeat_timeout,
            )
        except RendezvousError as exc:
            _log.warning(
                "Node %r missed a heartbeat in the rendezvous %r (%s: %s).",
                self._node,
                settings.run_id,
                type(exc).__name__,
                exc,
            )
        except Exception:
            _log.exception("The rendezvous heartbeat of node %r failed.", self._node)
        else:
            return self._heartbeat_delay(state)
        return settings.keep_alive_interval

    def _heartbeat_delay(self, state: Observation) -> float:
        interval = self._settings.keep_alive_interval
        last = state.last_heartbeats.get(self._node)
        if last is None:
            return interval
        return min(interval, max(last + interval - self._clock(), 0.0) + WAKE_SLACK)

    def _heartbeat_timeout(self, _: Observation) -> RendezvousTimeoutError:
        return RendezvousTimeoutError(
            f"Node {self._node!r} could not write its heartbeat within "
            f"{self._settings.timeout.heartbeat:g} s."
        )
