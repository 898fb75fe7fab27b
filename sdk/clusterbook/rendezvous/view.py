"""A node's view of the rendezvous state: what the node decides on, in a size that does not
grow with the cluster.

The state names every node (participants, wait list, heartbeats, reports): answering it to
every node makes a round cost O(nodes^2) bytes (0.5 MB per answer at 10,000 nodes). A node
decides on much less: the round, whether it is complete, closed, or in its last call, how many
joined and wait, its own place (rank, wait list, last heartbeat), the two oldest heartbeats (the
next expiry), the jobs to stop, and where rank 0 is. A :class:`NodeView` holds just that; the
TCP store answers a node's steps and its decision and member watches with it
(:func:`view_of`, :func:`encode_view`), and the head, which needs the whole state, reads it
whole (``get_state``, ``watch``). The decisions of :mod:`.ops` take either: a view names only its
own node in ``participants``, ``wait_list`` and ``last_heartbeats`` and counts the others
(``joined``, ``waiting``).

A view cannot drop a node whose heartbeat expired, as :func:`~.ops.sanitize` does to a state,
since it does not know that node's place; :func:`fresh` says when a view is that old, and the
node then asks the store again with a step, which drops the node there for good.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

from clusterbook.rendezvous.api import RendezvousSettings, RendezvousStateError
from clusterbook.rendezvous.ops import sanitize
from clusterbook.rendezvous.state import RendezvousState, decode, from_data

__all__ = [
    "NodeView",
    "Observation",
    "decode_answer",
    "encode_view",
    "fresh",
    "view_of",
    "views_of",
]

_VERSION = 1
_ADDRESSES = 8
"""The most of rank 0's addresses a view carries (a view's size must not depend on a report)."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node's view of a rendezvous state (see the module docstring).

    Attributes
    ----------
    node
        The node whose view this is.
    round, complete, deadline, closed, stop_jobs
        As in :class:`~.state.RendezvousState`.
    joined, waiting
        How many nodes are participants of the round, and in the wait list.
    rank
        The node's rank once the round is complete (0 before), None when not a participant.
    listed
        Whether the node is in the wait list.
    beat
        The node's last heartbeat (wall clock), None when the state does not know the node.
    oldest_beats
        The two oldest heartbeats of the state, ``(time, node)`` oldest first.
    leader
        The node of rank 0 of a complete round (None before, or when it left).
    leader_host, leader_addresses
        Where rank 0 is, as its report says: its hostname and addresses (the first few).
    """

    node: str
    round: int = 0
    complete: bool = False
    deadline: float | None = None
    closed: bool = False
    joined: int = 0
    waiting: int = 0
    rank: int | None = None
    listed: bool = False
    beat: float | None = None
    oldest_beats: tuple[tuple[float, str], ...] = ()
    stop_jobs: tuple[str, ...] = ()
    leader: str | None = None
    leader_host: str | None = None
    leader_addresses: tuple[str, ...] = ()

    @property
    def participants(self) -> Mapping[str, int]:
        """The participants this view names: its node, when it is one."""
        return {} if self.rank is None else {self.node: self.rank}

    @property
    def wait_list(self) -> Set[str]:
        """The waiting nodes this view names: its node, when it waits."""
        return frozenset((self.node,)) if self.listed else frozenset()

    @property
    def last_heartbeats(self) -> Mapping[str, float]:
        """The heartbeats this view names: its node's."""
        return {} if self.beat is None else {self.node: self.beat}

    def oldest(self) -> tuple[tuple[float, str], ...]:
        """The two oldest heartbeats of the state, ``(time, node)`` oldest first."""
        return self.oldest_beats


Observation = RendezvousState | NodeView
"""What a node observes of the rendezvous: the state whole (from a store that answers it), or
its own view of it (the TCP store answers a node's steps and watches so)."""


def view_of(state: RendezvousState, node: str) -> NodeView:
    """``node``'s view of ``state``: O(1) work once the state's oldest heartbeats and rank 0
    are known (found once per state)."""
    leader = state.leader()
    report = state.node_info.get(leader) if leader is not None else None
    host = report.get("hostname") if report is not None else None
    addresses = report.get("addresses") if report is not None else None
    return NodeView(
        node=node,
        round=state.round,
        complete=state.complete,
        deadline=state.deadline,
        closed=state.closed,
        joined=len(state.participants),
        waiting=len(state.wait_list),
        rank=state.participants.get(node),
        listed=node in state.wait_list,
        beat=state.last_heartbeats.get(node),
        oldest_beats=state.oldest(),
        stop_jobs=state.stop_jobs,
        leader=leader,
        leader_host=host if isinstance(host, str) else None,
        leader_addresses=tuple(a for a in addresses[:_ADDRESSES] if isinstance(a, str))
        if isinstance(addresses, list)
        else (),
    )


def encode_view(view: NodeView) -> bytes:
    """The view as compact JSON bytes (told apart from a state by its ``view`` key)."""
    return _own(view.node, view.rank, view.listed, view.beat, _shared(view))


def views_of(state: RendezvousState) -> Callable[[str], bytes]:
    """An encoder of the views of ``state`` (``encode_view(view_of(state, node))`` for a node):
    what every node's view shares is encoded once, the node's own place each time. A store
    that answers every node after a write makes one per state."""
    shared = _shared(view_of(state, ""))
    participants, wait_list, beats = state.participants, state.wait_list, state.last_heartbeats

    def encode(node: str) -> bytes:
        return _own(node, participants.get(node), node in wait_list, beats.get(node), shared)

    return encode


def _shared(view: NodeView) -> str:
    """What the views of one state share, as JSON object members. Written out by hand: a store
    encodes a view per answer, and ``json.dumps`` of a dict costs twice as much."""
    text = _text
    oldest = ",".join(f"[{_number(t)},{text(n)}]" for t, n in view.oldest_beats)
    return (
        f'"view":{_VERSION},"round":{view.round},"complete":{_flag_json(view.complete)},'
        f'"deadline":{_number(view.deadline)},"closed":{_flag_json(view.closed)},'
        f'"joined":{view.joined},"waiting":{view.waiting},"oldest":[{oldest}],'
        f'"stop_jobs":{_texts(view.stop_jobs)},'
        f'"leader":{text(view.leader)},"leader_host":{text(view.leader_host)},'
        f'"leader_addresses":{_texts(view.leader_addresses)}'
    )


def _own(node: str, rank: int | None, listed: bool, beat: float | None, shared: str) -> bytes:
    return (
        f'{{"node":{encode_basestring_ascii(node)},"rank":{"null" if rank is None else rank},'
        f'"listed":{_flag_json(listed)},"beat":{_number(beat)},{shared}}}'
    ).encode()


def _text(value: str | None) -> str:
    return "null" if value is None else encode_basestring_ascii(value)


def _texts(values: tuple[str, ...]) -> str:
    return f"[{','.join(map(encode_basestring_ascii, values))}]"


def _number(value: float | None) -> str:
    return "null" if value is None else float.__repr__(float(value))


def _flag_json(value: bool) -> str:
    return "true" if value else "false"


def decode_answer(blob: bytes) -> RendezvousState | NodeView:
    """Decode a store's answer: a node's view (:func:`encode_view`) or a whole state
    (:func:`~.state.encode`); raise :class:`RendezvousStateError` on anything else."""
    try:
        data: Any = json.loads(blob)
    except (ValueError, UnicodeDecodeError):
        return decode(blob)  # raises the state's own error, naming the cause
    if not isinstance(data, dict) or "view" not in data:
        return from_data(data)
    try:
        if data["view"] != _VERSION:
            raise ValueError(f"unknown view format {data['view']!r}")
        return NodeView(
            node=_string(data["node"]),
            round=_whole(data["round"]),
            complete=_flag(data["complete"]),
            deadline=None if data["deadline"] is None else _time(data["deadline"]),
            closed=_flag(data["closed"]),
            joined=_whole(data["joined"]),
            waiting=_whole(data["waiting"]),
            rank=None if data["rank"] is None else _whole(data["rank"]),
            listed=_flag(data["listed"]),
            beat=None if data["beat"] is None else _time(data["beat"]),
            oldest_beats=tuple((_time(t), _string(n)) for t, n in data["oldest"]),
            stop_jobs=tuple(_string(t) for t in data["stop_jobs"]),
            leader=None if data["leader"] is None else _string(data["leader"]),
            leader_host=None if data["leader_host"] is None else _string(data["leader_host"]),
            leader_addresses=tuple(_string(a) for a in data["leader_addresses"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise RendezvousStateError(
            f"A node's view of the rendezvous state from the store is corrupt ({exc}); the "
            "store is not of this version of clusterbook. Use the clusterbook of the head."
        ) from exc


def fresh(observed: Observation, settings: RendezvousSettings, now: float) -> Observation | None:
    """What a node decides on at ``now``: a state without its expired nodes
    (:func:`~.ops.sanitize`), a view as it is, or None for a view in which a node's heartbeat
    has expired (ask the store again: a step drops that node there)."""
    if isinstance(observed, RendezvousState):
        return sanitize(observed, settings, now)
    oldest = observed.oldest_beats
    if oldest and oldest[0][0] + settings.dead_after < now:
        return None
    return observed


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _time(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)
