"""The rendezvous state, and its encoding for the store (JSON: never pickle, which would let
whoever can write the store run code on every node).

A :class:`RendezvousState` is immutable. Changes are made on a :class:`Draft`, a mutable copy
owned by whoever changes it (the store applying a batch of steps, or :func:`~.ops.apply` for
one action), and frozen back into a state without copying again: a batch of steps costs one
copy of the state, not one per step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any

from clusterbook.rendezvous.api import RendezvousStateError
from clusterbook.rendezvous.info import Info
from clusterbook.rendezvous.journal import Journal
from clusterbook.rendezvous.observed import Observed, StateView

__all__ = ["Draft", "Observed", "RendezvousState", "StateView", "decode", "encode", "from_data"]

_VERSION = 1


@dataclass(frozen=True, slots=True)
class RendezvousState:
    """One rendezvous, as every node sees it.

    Attributes
    ----------
    round
        Number of the current round; a new round starts when a complete one empties.
    complete
        Whether the current round is complete (ranks assigned).
    deadline
        Wall-clock time (epoch seconds) at which the last call ends, once ``min_nodes`` joined.
    closed
        Whether the rendezvous is closed for good.
    participants
        Node id -> rank (ranks meaningful once complete).
    wait_list
        Nodes that arrived while a round was complete: they join the next round.
    last_heartbeats
        Node id -> wall-clock time of its last heartbeat.
    node_info
        Node id -> what the node reports about itself (facts at join, load with heartbeats),
        as the text it sent (:class:`~.info.Info`; encoded as a JSON string).
    stop_jobs
        Job tokens whose processes every agent must stop on its node (newest last).
    """

    round: int = 0
    complete: bool = False
    deadline: float | None = None
    closed: bool = False
    participants: dict[str, int] = field(default_factory=dict)
    wait_list: Set[str] = frozenset()
    last_heartbeats: dict[str, float] = field(default_factory=dict)
    node_info: dict[str, Info] = field(default_factory=dict)
    stop_jobs: tuple[str, ...] = ()
    # The two oldest heartbeats (time, node), found once per state on first use: every node
    # deciding on the same state asks for them (expiry, wake-ups), and a scan is O(nodes).
    _oldest: tuple[tuple[float, str], ...] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    # Rank 0's node ("" for none), found once per state: every node's answer names it.
    _leader: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def joined(self) -> int:
        """How many nodes are participants of the current round."""
        return len(self.participants)

    @property
    def waiting(self) -> int:
        """How many nodes wait for the next round."""
        return len(self.wait_list)

    def leader(self) -> str | None:
        """The node of rank 0 of a complete round (None if the round is not complete, or its
        rank 0 left)."""
        if not self.complete:
            return None
        found = self._leader
        if found is None:
            # Ranks follow the sorted ids, and so does the order of the participants once the
            # round completed: rank 0 comes first unless it left.
            found = next((n for n, r in self.participants.items() if r == 0), "")
            object.__setattr__(self, "_leader", found)
        return found or None

    def oldest(self) -> tuple[tuple[float, str], ...]:
        """The two oldest heartbeats, ``(time, node)`` oldest first (fewer if fewer nodes)."""
        found = self._oldest
        if found is None:
            found = _two_oldest(self.last_heartbeats)
            object.__setattr__(self, "_oldest", found)
        return found

    def draft(self, *, shared: bool = False) -> Draft:
        """A mutable copy of this state, for one owner to change and :meth:`Draft.freeze`.
        ``shared``: no copy, the draft changes this state's own containers (for an owner that
        holds the only reference to this state and drops it, as the store does; its
        :class:`~.journal.Journal` undoes what must not stay)."""
        oldest = self.oldest()
        wait_list = self.wait_list
        return Draft(
            round=self.round,
            complete=self.complete,
            deadline=self.deadline,
            closed=self.closed,
            participants=self.participants if shared else dict(self.participants),
            wait_list=wait_list if shared and isinstance(wait_list, set) else set(wait_list),
            last_heartbeats=self.last_heartbeats if shared else dict(self.last_heartbeats),
            node_info=self.node_info if shared else dict(self.node_info),
            stop_jobs=self.stop_jobs,
            floor=oldest[0][0] if oldest else math.inf,
            oldest=oldest,
            shared=shared,
        )


@dataclass(slots=True, eq=False)
class Draft:
    """A rendezvous state being changed in place by its one owner (see the module docstring).

    Its containers change only through its methods, each change in its ``journal``, which
    :meth:`undo` takes back to a :meth:`mark`. ``floor`` is a lower bound of every heartbeat
    time (infinity when there is none): kept as heartbeats are written and nodes removed, it
    tells in O(1) that nobody has expired yet. ``left`` and ``moved`` say, in O(1), whether a
    node left the participants or the wait list, and whether either changed at all.
    """

    round: int
    complete: bool
    deadline: float | None
    closed: bool
    participants: dict[str, int]
    wait_list: set[str]
    last_heartbeats: dict[str, float]
    node_info: dict[str, Info]
    stop_jobs: tuple[str, ...]
    floor: float = math.inf
    # The two oldest heartbeats, kept as beats are written (None: not known any more, as when
    # one of them beat again); checked on freezing, since removals do not keep it.
    oldest: tuple[tuple[float, str], ...] | None = None
    shared: bool = False  # the containers are a state's own (:meth:`RendezvousState.draft`)
    left: bool = False
    moved: bool = False
    journal: Journal = field(default_factory=Journal)

    @property
    def joined(self) -> int:
        """How many nodes are participants of the current round."""
        return len(self.participants)

    @property
    def waiting(self) -> int:
        """How many nodes wait for the next round."""
        return len(self.wait_list)

    def beat(self, node: str, now: float) -> None:
        """Record a heartbeat of ``node`` at ``now``."""
        self.journal.set_item(self.last_heartbeats, node, now)
        if now < self.floor:
            self.floor = now
        pair = self.oldest
        if pair is not None:
            mine = any(who == node for _, who in pair)
            self.oldest = None if mine else tuple(sorted((*pair, (now, node)))[:2])

    def add_participant(self, node: str) -> None:
        """Make ``node`` a participant (rank 0 until the round completes), out of the wait list."""
        self.journal.set_item(self.participants, node, 0)
        self.moved = True
        if self.journal.discard(self.wait_list, node):
            self.left = True

    def add_waiter(self, node: str) -> None:
        """Put ``node`` in the wait list."""
        if self.journal.add(self.wait_list, node):
            self.moved = True

    def remove(self, node: str) -> bool:
        """Remove ``node`` from everything; whether it was a participant."""
        journal = self.journal
        was = journal.pop_item(self.participants, node)
        if journal.discard(self.wait_list, node) or was:
            self.left = self.moved = True
        journal.pop_item(self.last_heartbeats, node)
        journal.pop_item(self.node_info, node)
        return was

    def report(self, node: str, info: Info) -> None:
        """Take ``info`` as ``node``'s report."""
        self.journal.set_item(self.node_info, node, info)

    def mark(self) -> tuple[int, tuple[Any, ...]]:
        """Where :meth:`undo` goes back to: now."""
        scalars = (
            self.round,
            self.complete,
            self.deadline,
            self.closed,
            self.participants,  # a completed round's ranks are a new dict
            self.stop_jobs,
            self.floor,
            self.oldest,
            self.left,
            self.moved,
        )
        return self.journal.mark(), scalars

    def undo(self, mark: tuple[int, tuple[Any, ...]]) -> None:
        """Take back every change since ``mark``."""
        self.journal.undo(mark[0])
        for name, value in zip(_SCALARS, mark[1], strict=True):
            setattr(self, name, value)

    def freeze(self) -> RendezvousState:
        """The state this draft now holds. Its containers move into the state: the draft must
        not be changed afterwards."""
        state = RendezvousState(
            round=self.round,
            complete=self.complete,
            deadline=self.deadline,
            closed=self.closed,
            participants=self.participants,
            wait_list=self.wait_list if self.shared else frozenset(self.wait_list),
            last_heartbeats=self.last_heartbeats,
            node_info=self.node_info,
            stop_jobs=self.stop_jobs,
        )
        pair, beats = self.oldest, self.last_heartbeats
        # Still the two oldest if both are there with those times (a node removed, or beating
        # again, was one of them otherwise); one or none only if there are no more beats.
        if (
            pair is not None
            and len(pair) == min(2, len(beats))
            and all(beats.get(who) == t for t, who in pair)
        ):
            object.__setattr__(state, "_oldest", pair)
        return state


_SCALARS: tuple[str, ...] = ("round", "complete", "deadline", "closed", "participants")
_SCALARS += ("stop_jobs", "floor", "oldest", "left", "moved")  # as Draft.mark lists them


def _two_oldest(beats: Mapping[str, float]) -> tuple[tuple[float, str], ...]:
    first: tuple[float, str] | None = None
    second: tuple[float, str] | None = None
    # (time, node) pairs compare by time, then node: the same two whatever the order of the
    # beats (a draft keeps them as it writes, :meth:`Draft.beat`).
    for node, t in beats.items():
        if second is None or (t, node) < second:
            if first is None or (t, node) < first:
                first, second = (t, node), first
            else:
                second = (t, node)
    return tuple(pair for pair in (first, second) if pair is not None)


def encode(state: RendezvousState) -> bytes:
    """The state as compact JSON bytes (its keys sorted, the nodes' reports last)."""
    data = {
        "v": _VERSION,
        "round": state.round,
        "complete": state.complete,
        "deadline": state.deadline,
        "closed": state.closed,
        "participants": state.participants,
        "wait_list": sorted(state.wait_list),
        "last_heartbeats": state.last_heartbeats,
        "stop_jobs": list(state.stop_jobs),
    }
    core = json.dumps(data, sort_keys=True, separators=(",", ":"))
    # The reports last, each a JSON string escaped once (Info.quoted), never encoded again.
    quote = encode_basestring_ascii
    infos = ",".join(f"{quote(n)}:{Info.of(i).quoted}" for n, i in state.node_info.items())
    return f'{core[:-1]},"node_info":{{{infos}}}}}'.encode()


def decode(blob: bytes) -> RendezvousState:
    """Decode what :func:`encode` made; raise :class:`RendezvousStateError` on anything else."""
    try:
        data: Any = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _corrupt(exc) from exc
    return from_data(data)


def from_data(data: Any) -> RendezvousState:
    """The state of decoded JSON ``data`` (see :func:`decode`)."""
    try:
        if not isinstance(data, dict) or data.get("v") != _VERSION:
            raise ValueError(
                f"unknown format {data.get('v') if isinstance(data, dict) else data!r}"
            )
        state = RendezvousState(
            round=_int(data["round"]),
            complete=_bool(data["complete"]),
            deadline=None if data["deadline"] is None else float(data["deadline"]),
            closed=_bool(data["closed"]),
            participants=_ranks(_dict(data["participants"])),
            wait_list=frozenset(str(n) for n in _list(data["wait_list"])),
            last_heartbeats=_times(_dict(data["last_heartbeats"])),
            node_info=_infos(_dict(data.get("node_info", {}))),
            stop_jobs=tuple(str(t) for t in _list(data.get("stop_jobs", []))),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise _corrupt(exc) from exc
    return state


def _corrupt(exc: Exception) -> RendezvousStateError:
    return RendezvousStateError(
        f"The rendezvous state in the store is corrupt ({exc}); it was not written by this "
        "version of clusterbook. Start a new rendezvous (a new run id) or clear the store."
    )


# JSON object keys are always strings; the checks below look at the values only, in one pass
# where the types are already exact (every node decodes the state after every change).


def _ranks(data: dict[str, Any]) -> dict[str, int]:
    if all(type(v) is int for v in data.values()):
        return data
    return {k: _int(v) for k, v in data.items()}


def _times(data: dict[str, Any]) -> dict[str, float]:
    if all(type(v) is float for v in data.values()):
        return data
    return {k: float(v) for k, v in data.items()}


def _infos(data: dict[str, Any]) -> dict[str, Info]:
    # Text, as this version writes it; an object, as states of older versions held reports.
    return {k: Info(v) if type(v) is str else Info.of(_dict(v)) for k, v in data.items()}


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _dict(value: object) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {value!r}")
    return value


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r}")
    return value
