"""The rendezvous state, and its encoding for the store (JSON: never pickle, which would let
whoever can write the store run code on every node)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from clusterbook.rendezvous.api import RendezvousStateError

__all__ = ["RendezvousState", "decode", "encode"]

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
        Node id -> what the node reports about itself (facts at join, load with heartbeats).
    stop_jobs
        Job tokens whose processes every agent must stop on its node (newest last).
    """

    round: int = 0
    complete: bool = False
    deadline: float | None = None
    closed: bool = False
    participants: dict[str, int] = field(default_factory=dict)
    wait_list: frozenset[str] = frozenset()
    last_heartbeats: dict[str, float] = field(default_factory=dict)
    node_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    stop_jobs: tuple[str, ...] = ()


def encode(state: RendezvousState) -> bytes:
    """The state as compact, canonical JSON bytes."""
    data = {
        "v": _VERSION,
        "round": state.round,
        "complete": state.complete,
        "deadline": state.deadline,
        "closed": state.closed,
        "participants": state.participants,
        "wait_list": sorted(state.wait_list),
        "last_heartbeats": state.last_heartbeats,
        "node_info": state.node_info,
        "stop_jobs": list(state.stop_jobs),
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def decode(blob: bytes) -> RendezvousState:
    """Decode what :func:`encode` made; raise :class:`RendezvousStateError` on anything else."""
    try:
        data: Any = json.loads(blob)
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
            node_info={str(k): _dict(v) for k, v in _dict(data.get("node_info", {})).items()},
            stop_jobs=tuple(str(t) for t in _list(data.get("stop_jobs", []))),
        )
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise RendezvousStateError(
            f"The rendezvous state in the store is corrupt ({exc}); it was not written by this "
            "version of clusterbook. Start a new rendezvous (a new run id) or clear the store."
        ) from exc
    return state


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
