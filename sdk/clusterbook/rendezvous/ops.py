"""Rendezvous decisions: pure functions of a state, a node, the settings and the time.

Nothing here sleeps, reads a clock or opens a socket. The caller passes ``now`` (wall-clock
epoch seconds, the clock the state's ``deadline`` and ``last_heartbeats`` use) and the
``deadline`` of the operation it runs, on the same clock. Each operation (join, exit, close,
keep-alive) looks at the state and returns the next :class:`Action`; the caller applies the
mutating ones with :func:`apply`, writes the new state with compare-and-set, and repeats until
``FINISH`` (or an error). On ``SYNC`` the caller waits for a change of the stored state, at most
until :func:`next_wakeup`, when the decision could change by the passing of time alone.

The semantics follow torch elastic's dynamic rendezvous: a node joins the participants of the
current round; once ``min_nodes`` joined, a last call of ``timeout.last_call`` seconds starts,
after which the round completes (at once when ``max_nodes`` joined); ranks are assigned by
sorted node id. A node arriving at a complete round waits in the wait list for the next one,
which starts when every participant of the complete round has left. Nodes whose last heartbeat
is older than ``keep_alive_interval * keep_alive_max_attempt`` are removed by whoever reads the
state next (:func:`sanitize`). Unlike torch there is no redundancy list: every node that cannot
be a participant now (the round is complete, or full) waits in the wait list.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from clusterbook.rendezvous.api import RendezvousSettings
from clusterbook.rendezvous.info import Info
from clusterbook.rendezvous.state import Draft, Observed, RendezvousState, StateView

__all__ = [
    "MUTATING_ACTIONS",
    "ROLLBACK_PERIOD",
    "Action",
    "apply",
    "close_action",
    "decisions_may_change",
    "exit_action",
    "expire",
    "expired_nodes",
    "join_action",
    "keep_alive_action",
    "members_may_change",
    "mutate",
    "next_expiry",
    "next_wakeup",
    "rank_of",
    "remove_node",
    "sanitize",
    "set_info",
    "with_info",
    "world_size",
]

ROLLBACK_PERIOD = 5.0
"""Seconds after a join deadline during which a node still removes itself from the state (its
keep-alive would expire anyway, but leaving at once lets the others go on sooner)."""


class Action(enum.Enum):
    """The next step of an operation, decided from the state."""

    KEEP_ALIVE = 1
    ADD_TO_PARTICIPANTS = 2
    ADD_TO_WAIT_LIST = 3
    REMOVE_FROM_PARTICIPANTS = 4
    REMOVE_FROM_WAIT_LIST = 5
    MARK_RENDEZVOUS_COMPLETE = 6
    MARK_RENDEZVOUS_CLOSED = 7
    SYNC = 8
    ERROR_CLOSED = 9
    ERROR_TIMEOUT = 10
    FINISH = 11


MUTATING_ACTIONS = frozenset(
    {
        Action.KEEP_ALIVE,
        Action.ADD_TO_PARTICIPANTS,
        Action.ADD_TO_WAIT_LIST,
        Action.REMOVE_FROM_PARTICIPANTS,
        Action.REMOVE_FROM_WAIT_LIST,
        Action.MARK_RENDEZVOUS_COMPLETE,
        Action.MARK_RENDEZVOUS_CLOSED,
    }
)
"""The actions :func:`apply` turns into a new state (the others change nothing)."""


# --- decisions -------------------------------------------------------------------------------


def _should_keep_alive(
    state: StateView, node: str, settings: RendezvousSettings, now: float
) -> bool:
    """Whether ``node`` is known to the state and its heartbeat is due."""
    last = state.last_heartbeats.get(node)
    return last is not None and last <= now - settings.keep_alive_interval


def join_action(
    state: StateView, node: str, settings: RendezvousSettings, now: float, deadline: float
) -> Action:
    """The next step for ``node`` to become a participant of a complete round."""
    if state.closed:
        return Action.ERROR_CLOSED

    is_participant = node in state.participants
    if state.complete and is_participant:
        return Action.FINISH

    if now > deadline:
        # Within the rollback period, leave the state so the others need not wait for our
        # keep-alive to expire; after it (or once out), give up.
        if now <= deadline + ROLLBACK_PERIOD:
            if is_participant:
                return Action.REMOVE_FROM_PARTICIPANTS
            if node in state.wait_list:
                return Action.REMOVE_FROM_WAIT_LIST
        return Action.ERROR_TIMEOUT

    if state.complete:
        # Not a participant of the complete round: wait for the next one.
        if node not in state.wait_list:
            return Action.ADD_TO_WAIT_LIST
    elif is_participant:
        if (
            state.joined >= settings.min_nodes
            and state.deadline is not None
            and state.deadline < now
        ):
            return Action.MARK_RENDEZVOUS_COMPLETE
    elif state.joined < settings.max_nodes:
        return Action.ADD_TO_PARTICIPANTS
    elif node not in state.wait_list:
        return Action.ADD_TO_WAIT_LIST

    if _should_keep_alive(state, node, settings, now):
        return Action.KEEP_ALIVE

    # Either a participant waiting for the others (or for the last call to end), or a node in
    # the wait list waiting for the next round.
    return Action.SYNC


def exit_action(
    state: StateView, node: str, settings: RendezvousSettings, now: float, deadline: float
) -> Action:
    """The next step for ``node`` to leave the rendezvous (its round, or the wait list)."""
    if node in state.participants:
        if now > deadline:
            return Action.ERROR_TIMEOUT
        return Action.REMOVE_FROM_PARTICIPANTS
    if node in state.wait_list:
        if now > deadline:
            return Action.ERROR_TIMEOUT
        return Action.REMOVE_FROM_WAIT_LIST
    return Action.FINISH


def close_action(
    state: StateView, node: str, settings: RendezvousSettings, now: float, deadline: float
) -> Action:
    """The next step to close the rendezvous for good."""
    if state.closed:
        return Action.FINISH
    if now > deadline:
        return Action.ERROR_TIMEOUT
    return Action.MARK_RENDEZVOUS_CLOSED


def keep_alive_action(
    state: StateView, node: str, settings: RendezvousSettings, now: float, deadline: float
) -> Action:
    """The next step of a heartbeat: write one if due (and the node is still known)."""
    if _should_keep_alive(state, node, settings, now):
        if now > deadline:
            return Action.ERROR_TIMEOUT
        return Action.KEEP_ALIVE
    return Action.FINISH


# --- mutations -------------------------------------------------------------------------------


def mutate(
    action: Action, draft: Draft, node: str, settings: RendezvousSettings, now: float
) -> None:
    """Apply ``action`` of ``node`` at ``now`` to ``draft``, in place (see :func:`apply`)."""
    if action is Action.KEEP_ALIVE:
        draft.beat(node, now)
    elif action is Action.ADD_TO_PARTICIPANTS:
        draft.add_participant(node)  # ranks are set on completion
        draft.beat(node, now)
        joined = len(draft.participants)
        if joined >= settings.min_nodes and draft.deadline is None:
            draft.deadline = now + settings.timeout.last_call
        if joined >= settings.max_nodes:
            _mark_complete(draft)
    elif action is Action.ADD_TO_WAIT_LIST:
        draft.add_waiter(node)
        draft.beat(node, now)
    elif action is Action.REMOVE_FROM_PARTICIPANTS:
        if node not in draft.participants:
            raise ValueError(f"Node {node!r} is not a participant; it cannot leave the round.")
        _remove_nodes(draft, {node}, settings)
    elif action is Action.REMOVE_FROM_WAIT_LIST:
        if node not in draft.wait_list:
            raise ValueError(f"Node {node!r} is not in the wait list; it cannot leave it.")
        _remove_nodes(draft, {node}, settings)
    elif action is Action.MARK_RENDEZVOUS_COMPLETE:
        _mark_complete(draft)
    elif action is Action.MARK_RENDEZVOUS_CLOSED:
        draft.closed = True
    else:
        raise ValueError(f"{action} does not change the state; only {_names()} do.")


def apply(
    action: Action, state: RendezvousState, node: str, settings: RendezvousSettings, now: float
) -> RendezvousState:
    """The state after ``node`` took ``action`` at ``now`` (a new state; ``state`` is kept)."""
    if action not in MUTATING_ACTIONS:
        raise ValueError(f"{action} does not change the state; only {_names()} do.")
    draft = state.draft()
    mutate(action, draft, node, settings, now)
    return draft.freeze()


def _mark_complete(draft: Draft) -> None:
    # A new dict (the draft's undo puts the old one back).
    draft.participants = {node: rank for rank, node in enumerate(sorted(draft.participants))}
    draft.complete = True
    draft.deadline = None


def _names() -> str:
    return ", ".join(sorted(a.name for a in MUTATING_ACTIONS))


def set_info(draft: Draft, node: str, info: Mapping[str, Any]) -> None:
    """Replace ``node``'s report by ``info`` in ``draft`` (only for a node it knows)."""
    if node in draft.last_heartbeats:
        draft.report(node, Info.of(info))


def with_info(state: RendezvousState, node: str, info: Mapping[str, Any]) -> RendezvousState:
    """The state with ``node``'s report replaced by ``info`` (only for a node it knows)."""
    if node not in state.last_heartbeats:
        return state
    return replace(state, node_info={**state.node_info, node: Info.of(info)})


def remove_node(state: RendezvousState, node: str, settings: RendezvousSettings) -> RendezvousState:
    """The state without ``node`` at all (participant, wait list, heartbeat), as when its
    connection to the store was lost; the same epilogue as a participant leaving. Returns
    ``state`` itself for a node it does not know."""
    if not _knows(state, node):
        return state
    draft = state.draft()
    _remove_nodes(draft, {node}, settings)
    return draft.freeze()


def _knows(state: StateView, node: str) -> bool:
    return node in state.participants or node in state.wait_list or node in state.last_heartbeats


def expired_nodes(state: StateView, settings: RendezvousSettings, now: float) -> set[str]:
    """Nodes whose last heartbeat is more than ``dead_after`` seconds before ``now``."""
    dead_after = settings.dead_after
    return {node for node, last in state.last_heartbeats.items() if last + dead_after < now}


def sanitize(state: RendezvousState, settings: RendezvousSettings, now: float) -> RendezvousState:
    """The state without the nodes that missed ``keep_alive_max_attempt`` heartbeats.

    A node is removed once ``now`` is past ``last heartbeat + interval * attempts`` (strictly:
    not at that instant). Returns ``state`` itself when nobody expired (known in O(1) from the
    state's oldest heartbeat).
    """
    oldest = state.oldest()
    if not oldest or oldest[0][0] + settings.dead_after >= now:
        return state
    draft = state.draft()
    expire(draft, settings, now)
    return draft.freeze()


def expire(draft: Draft, settings: RendezvousSettings, now: float) -> bool:
    """Remove the nodes of ``draft`` that expired by ``now`` (see :func:`sanitize`), in place;
    whether any did."""
    dead_after = settings.dead_after
    if draft.floor + dead_after >= now:
        return False
    dead = {node for node, last in draft.last_heartbeats.items() if last + dead_after < now}
    if dead:
        _remove_nodes(draft, dead, settings)
    draft.floor = min(draft.last_heartbeats.values(), default=math.inf)
    return bool(dead)


def _remove_nodes(draft: Draft, nodes: set[str], settings: RendezvousSettings) -> None:
    """Remove ``nodes`` from ``draft``; then a complete round that emptied gives way to the
    next round, and an incomplete one that fell below ``min_nodes`` has no last call any more.
    (Removing heartbeats never lowers ``draft.floor``: it stays a lower bound.)"""
    was_participant = False
    for node in nodes:
        was_participant |= draft.remove(node)
    if not was_participant:
        return
    if draft.complete:
        if not draft.participants:
            draft.complete = False
            draft.round += 1
    elif len(draft.participants) < settings.min_nodes and draft.deadline is not None:
        draft.deadline = None


# --- timing and queries ----------------------------------------------------------------------


def next_wakeup(
    state: Observed, node: str, settings: RendezvousSettings, now: float, deadline: float
) -> float:
    """The earliest wall time at which a decision of ``node`` could change without any write.

    That is the soonest of: the end of the last call (of an incomplete round), this node's next
    heartbeat, the expiry of any other node's heartbeat, and the operation's ``deadline``.
    The caller should wait a hair past it: the comparisons at those instants are strict.
    """
    times = [deadline]
    if not state.complete and state.deadline is not None:
        times.append(state.deadline)
    own = state.last_heartbeats.get(node)
    if own is not None:
        times.append(own + settings.keep_alive_interval)
    # The oldest heartbeat of another node expires first.
    other = next((t for t, who in state.oldest() if who != node), None)
    if other is not None:
        times.append(other + settings.dead_after)
    return min(times)


def next_expiry(state: RendezvousState, settings: RendezvousSettings) -> float:
    """The wall time at which the oldest heartbeat of ``state`` expires (its node then counts
    as dead: :func:`sanitize` drops it a hair later), or ``math.inf`` with no heartbeat."""
    oldest = state.oldest()
    return oldest[0][0] + settings.dead_after if oldest else math.inf


def decisions_may_change(before: RendezvousState, after: RendezvousState) -> bool:
    """Whether a write from ``before`` to ``after`` may change the decision of a node waiting
    in a join (``SYNC``): whether waiters must wake, or may sleep on until :func:`next_wakeup`.

    They must when the round, its completion, its last-call deadline or the closing changes, or
    when a node leaves the participants or the wait list (room for a waiter, a waiter dropped,
    fewer than ``min_nodes``). Nothing else changes their decisions: a node joining changes them
    only through the deadline (at ``min_nodes``) or completion (at ``max_nodes``); heartbeats,
    reports and stop requests never do (heartbeats expire by time, which waiters keep anyway).
    """
    return (
        before.round != after.round
        or before.complete != after.complete
        or before.closed != after.closed
        or before.deadline != after.deadline
        or not before.participants.keys() <= after.participants.keys()
        or not before.wait_list <= after.wait_list
    )


def members_may_change(before: RendezvousState, after: RendezvousState) -> bool:
    """Whether a write from ``before`` to ``after`` changes anything a node that follows a
    round (an agent between joins) reacts to: anything but heartbeats and reports.

    That is a decision (:func:`decisions_may_change`), or a change of the participants, of the
    wait list (a newcomer may mean a new round with room for it) or of the jobs to stop.
    """
    return (
        decisions_may_change(before, after)
        or before.participants != after.participants
        or before.wait_list != after.wait_list
        or before.stop_jobs != after.stop_jobs
    )


def rank_of(state: StateView, node: str) -> int | None:
    """The rank of ``node`` in a complete round, or None (not complete, or not a participant)."""
    if not state.complete:
        return None
    return state.participants.get(node)


def world_size(state: StateView) -> int:
    """The number of participants of the current round."""
    return state.joined
