"""The rendezvous handler: runs the decisions of :mod:`.ops` against a backend.

One handler per node. :meth:`RendezvousHandler.next_rendezvous` leaves the node's previous round
(if any), then loops: read the state, drop dead nodes, decide, and either write the decided
change with compare-and-set (a lost race just means deciding again on the newer state) or, when
there is nothing to do but wait, block in ``backend.watch`` until the state changes or until the
next moment a decision could change by time alone (the end of the last call, a heartbeat due, a
node expiring, the join deadline). Once the round is complete a daemon thread heartbeats every
``keep_alive_interval`` seconds until the next call, :meth:`shutdown`, or the process ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
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
from clusterbook.rendezvous.ops import (
    Action,
    apply,
    close_action,
    exit_action,
    join_action,
    keep_alive_action,
    next_wakeup,
    sanitize,
    with_info,
    world_size,
)
from clusterbook.rendezvous.state import RendezvousState, decode, encode

__all__ = ["RendezvousHandler", "RendezvousInfo"]

_log = logging.getLogger("clusterbook.rendezvous")

_WATCH_CAP = 1.0
"""Longest single wait in ``backend.watch``: a bound on how stale a waiter's clock view gets."""
_SLACK = 0.005
"""Added to every wait: decisions compare times strictly, so wake a hair past the instant."""
_REPORTS = frozenset({Action.ADD_TO_PARTICIPANTS, Action.ADD_TO_WAIT_LIST, Action.KEEP_ALIVE})
"""The writes that carry the node's own report (``info``): joining and heartbeats."""

Op = Callable[[RendezvousState, str, RendezvousSettings, float, float], Action]


@dataclass(frozen=True, slots=True)
class RendezvousInfo:
    """This node's place in a complete round."""

    rank: int
    world_size: int
    round: int
    participants: Mapping[str, int]
    """Node id -> rank of every participant of the round (read-only)."""


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
        Called with each new state this handler observes, outside its locks, from whichever
        thread observed it (the caller's or the heartbeat thread). Exceptions are logged.
    """

    def __init__(
        self,
        backend: RendezvousBackend,
        settings: RendezvousSettings,
        node: str,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_change: Callable[[RendezvousState], None] | None = None,
        info: Callable[[], dict[str, Any]] | None = None,
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
        self._state = RendezvousState()
        self._token: Token | None = None
        self._heartbeat_lock = threading.Lock()  # guards the heartbeat thread and its event
        self._heartbeat_stop: threading.Event | None = None
        self._heartbeat_thread: threading.Thread | None = None

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
        join_timeout = self._settings.timeout.join
        deadline = self._monotonic() + join_timeout
        self._run(exit_action, deadline, lambda s: self._leave_timeout(s, "join", join_timeout))
        state = self._run(join_action, deadline, self._join_timeout)
        self._start_heartbeats()
        return RendezvousInfo(
            rank=state.participants[self._node],
            world_size=world_size(state),
            round=state.round,
            participants=MappingProxyType(dict(state.participants)),
        )

    def set_closed(self) -> None:
        """Close the rendezvous for good: no node may join it any more."""
        close = self._settings.timeout.close

        def timeout(_: RendezvousState) -> RendezvousTimeoutError:
            return RendezvousTimeoutError(
                f"Node {self._node!r} could not close the rendezvous {self._settings.run_id!r} "
                f"within the close timeout of {close:g} s: the store kept changing under it or "
                "did not answer. Try again, or raise timeout.close."
            )

        self._run(close_action, self._monotonic() + close, timeout)

    def is_closed(self) -> bool:
        """Whether the rendezvous is closed (reads the store)."""
        return self._read().closed

    def num_nodes_waiting(self) -> int:
        """How many live nodes wait for the next round (reads the store)."""
        return len(self._read().wait_list)

    def state(self) -> RendezvousState:
        """The last state this handler observed (dead nodes already removed); no I/O."""
        with self._lock:
            return self._state

    def shutdown(self) -> bool:
        """Stop heartbeating and leave the rendezvous (round or wait list) within
        ``timeout.close``. Returns whether the node left cleanly; safe to call again."""
        self._stop_heartbeats()
        close = self._settings.timeout.close
        try:
            self._run(
                exit_action,
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
        op: Op,
        deadline: float,
        on_timeout: Callable[[RendezvousState], RendezvousTimeoutError],
    ) -> RendezvousState:
        """Run ``op`` until it says FINISH; ``deadline`` is on the monotonic clock."""
        settings, node = self._settings, self._node
        current = self._backend.get_state()
        raw, token = self._decode(current)
        in_time = raw
        while True:
            now = self._clock()
            # The op deadline on the wall clock, recomputed each time so that a jump of the
            # wall clock does not stretch or shrink this node's own timeout.
            wall_deadline = now + (deadline - self._monotonic())
            state = sanitize(raw, settings, now)
            self._observe(state, token)
            if now <= wall_deadline:
                in_time = state
            action = op(state, node, settings, now, wall_deadline)

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
                wait = min(max(wakeup - now, 0.0) + _SLACK, _WATCH_CAP)
                raw, token = self._decode(self._backend.watch(token, wait))
                continue

            new = apply(action, state, node, settings, now)
            if self._info is not None and action in _REPORTS:
                new = with_info(new, node, self._info())
            _, new_token, won = self._backend.set_state(encode(new), token)
            if won:
                raw, token = new, new_token
            else:
                # Someone wrote first: decide again on what is there now.
                raw, token = self._decode(self._backend.get_state())

    def _read(self) -> RendezvousState:
        raw, token = self._decode(self._backend.get_state())
        state = sanitize(raw, self._settings, self._clock())
        self._observe(state, token)
        return state

    @staticmethod
    def _decode(current: tuple[bytes, Token] | None) -> tuple[RendezvousState, Token | None]:
        if current is None:
            return RendezvousState(), None
        blob, token = current
        return decode(blob), token

    def _observe(self, state: RendezvousState, token: Token | None) -> None:
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

    def _join_timeout(self, state: RendezvousState) -> RendezvousTimeoutError:
        settings, node = self._settings, self._node
        joined = sorted(state.participants)
        names = ", ".join(repr(n) for n in joined) or "none"
        if state.complete:
            return RendezvousTimeoutError(
                f"Node {node!r} waited {settings.timeout.join:g} s (the join timeout) for the "
                f"next round of the rendezvous {settings.run_id!r}, but round {state.round} "
                f"kept running with {len(joined)} node(s) ({names}) and never ended. Stop that "
                "round's nodes, or raise timeout.join."
            )
        return RendezvousTimeoutError(
            f"The rendezvous {settings.run_id!r} did not complete within the join timeout of "
            f"{settings.timeout.join:g} s: {len(joined)} node(s) joined round {state.round} "
            f"({names}) but it needs at least min_nodes={settings.min_nodes}. Start more "
            "nodes, lower min_nodes, or raise timeout.join."
        )

    def _leave_timeout(
        self, state: RendezvousState, name: str, seconds: float
    ) -> RendezvousTimeoutError:
        return RendezvousTimeoutError(
            f"Node {self._node!r} could not leave round {state.round} of the rendezvous "
            f"{self._settings.run_id!r} within the {name} timeout of {seconds:g} s: the store "
            "kept changing under it or did not answer. Its heartbeat will expire and the "
            "others will drop it."
        )

    # --- heartbeats ---------------------------------------------------------------------------

    def _start_heartbeats(self) -> None:
        stop = threading.Event()
        thread = threading.Thread(
            target=self._heartbeat_loop,
            args=(stop,),
            name=f"clusterbook-rendezvous-heartbeat-{self._node}",
            daemon=True,
        )
        with self._heartbeat_lock:
            old = self._heartbeat_stop
            self._heartbeat_stop, self._heartbeat_thread = stop, thread
        if old is not None:
            old.set()
        thread.start()

    def _stop_heartbeats(self) -> None:
        """Stop the heartbeat thread (if any) and wait for it; the node stays in the state
        (until it leaves, or its heartbeat expires)."""
        with self._heartbeat_lock:
            stop, thread = self._heartbeat_stop, self._heartbeat_thread
            self._heartbeat_stop = self._heartbeat_thread = None
        if stop is not None:
            stop.set()
        if thread is not None and thread is not threading.current_thread():
            # A heartbeat in flight finishes within its timeout; if the store hangs longer,
            # the thread exits after it (a late write loses its compare-and-set anyway).
            thread.join(timeout=self._settings.timeout.heartbeat + _WATCH_CAP)

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        settings = self._settings
        delay = self._heartbeat_delay(self.state())
        while not stop.wait(delay):
            try:
                state = self._run(
                    keep_alive_action,
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
                delay = settings.keep_alive_interval
            except Exception:
                _log.exception("The rendezvous heartbeat of node %r failed.", self._node)
                delay = settings.keep_alive_interval
            else:
                delay = self._heartbeat_delay(state)

    def _heartbeat_delay(self, state: RendezvousState) -> float:
        interval = self._settings.keep_alive_interval
        last = state.last_heartbeats.get(self._node)
        if last is None:
            return interval
        return min(interval, max(last + interval - self._clock(), 0.0) + _SLACK)

    def _heartbeat_timeout(self, _: RendezvousState) -> RendezvousTimeoutError:
        return RendezvousTimeoutError(
            f"Node {self._node!r} could not write its heartbeat within "
            f"{self._settings.timeout.heartbeat:g} s."
        )
