"""A rendezvous step: what one node does to the stored state, in one go.

A :class:`Step` names operations of :mod:`.ops` (join, exit, close, keep-alive), the node, the
settings, and the node's view of time (``now`` and the operations' ``deadline``, wall clock).
Run on a state, it drops dead nodes (:func:`~.ops.sanitize`) and applies the first operation's
actions until one that changes nothing (wait, finish, or an error); on finish, the next
operation's the same way (exit then join: leave the last round and join the next in one go).
The caller then decides itself on the resulting state. Running a step of one operation twice
has the effect of running it once (:attr:`Step.repeatable`).

A step that leaves its node waiting (``SYNC``) may say how long the node would wait (``wait``):
a store that runs it may then hold its answer until something that matters changes (or the
node's next wake-up, :meth:`Step.hold`), which saves the node a watch of its own.

A step is pure, and a :data:`~.api.StateChange`: a backend may run it wherever the state is.
The TCP store runs it on its side under its lock, so a join is one round trip however many nodes
join at once; other backends run it by compare-and-set (:meth:`~.api.RendezvousBackend.update`).
Steps travel as JSON, never pickle.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.info import Info
from clusterbook.rendezvous.ops import (
    MUTATING_ACTIONS,
    Action,
    close_action,
    exit_action,
    expire,
    join_action,
    keep_alive_action,
    mutate,
    next_wakeup,
    sanitize,
    set_info,
)
from clusterbook.rendezvous.state import Draft, RendezvousState, StateView, decode, encode

__all__ = ["DECISIONS", "WAKE_SLACK", "Operation", "Step", "StepFormatError", "settings_size"]

WAKE_SLACK = 0.005
"""Added to every wait until a wake-up time: decisions compare times strictly, so wake a hair
past the instant."""

_MAX_ACTIONS = 8
"""More mutating actions than any operation takes in a row (exit: 1; join: add, complete)."""
_REPORTS = frozenset({Action.ADD_TO_PARTICIPANTS, Action.ADD_TO_WAIT_LIST, Action.KEEP_ALIVE})
"""The writes that carry the node's own report (``info``): joining and heartbeats."""
_VERSION = 1


class Operation(enum.Enum):
    """What a node does to the rendezvous; each has its decision function in :data:`DECISIONS`."""

    JOIN = "join"
    EXIT = "exit"
    CLOSE = "close"
    KEEP_ALIVE = "keep_alive"


_OPERATIONS = {operation.value: operation for operation in Operation}

Decision = Callable[[StateView, str, RendezvousSettings, float, float], Action]

DECISIONS: dict[Operation, Decision] = {
    Operation.JOIN: join_action,
    Operation.EXIT: exit_action,
    Operation.CLOSE: close_action,
    Operation.KEEP_ALIVE: keep_alive_action,
}


class StepFormatError(ValueError):
    """A step on the wire is malformed."""


@dataclass(frozen=True, slots=True)
class Step:
    """``node`` runs ``operations`` in turn at ``now`` (wall clock), with their ``deadline``;
    each one after the previous finished.

    ``info`` is the node's report, stored with the writes that join or heartbeat (kept as an
    :class:`~.info.Info`, whose text travels after the step and which the store does not
    parse). ``wait`` is the longest the node would wait if the step leaves it waiting (see
    :meth:`hold`).
    """

    operations: tuple[Operation, ...]
    node: str
    settings: RendezvousSettings
    now: float
    deadline: float
    info: Mapping[str, Any] | None = None
    wait: float = 0.0

    def __post_init__(self) -> None:
        if self.info is not None and not isinstance(self.info, Info):
            object.__setattr__(self, "info", Info.of(self.info))
        if not self.operations or not all(isinstance(o, Operation) for o in self.operations):
            raise TypeError(f"a step needs one or more operations, got {self.operations!r}")
        if not 0 <= self.wait < math.inf:
            raise ValueError(f"a step's wait must be a number of seconds >= 0, got {self.wait!r}")

    @property
    def repeatable(self) -> bool:
        """Whether running the step again right after it ran changes nothing: true of each
        operation alone, not of leaving then joining (it would leave the round it joined)."""
        return len(self.operations) == 1

    def run(self, state: RendezvousState) -> RendezvousState | None:
        """The state after this step, or None when the step writes nothing."""
        draft = state.draft()
        return draft.freeze() if self.run_on(draft) else None

    def run_on(self, draft: Draft) -> bool:
        """Run this step on ``draft``, in place; whether it wrote anything (dropping dead
        nodes counts: the store keeps them dropped, so that the views it answers, which
        cannot drop them, are without them). A store runs the steps that come together on one
        draft."""
        node, settings, now = self.node, self.settings, self.now
        wrote = expire(draft, settings, now)
        for operation in self.operations:
            decide = DECISIONS[operation]
            for _ in range(_MAX_ACTIONS):
                action = decide(draft, node, settings, now, self.deadline)
                if action not in MUTATING_ACTIONS:
                    break
                mutate(action, draft, node, settings, now)
                if self.info is not None and action in _REPORTS:
                    set_info(draft, node, self.info)
                wrote = True
            if action is not Action.FINISH:
                break
        return wrote

    def hold(self, state: RendezvousState) -> float:
        """Seconds the node would wait on ``state`` (the state after this step) before it
        looks again, at most ``wait``; 0 when it would not wait (it is done, or must write)."""
        if self.wait <= 0:
            return 0.0
        node, settings, now, deadline = self.node, self.settings, self.now, self.deadline
        current = sanitize(state, settings, now)
        if (
            DECISIONS[self.operations[-1]](current, node, settings, now, deadline)
            is not Action.SYNC
        ):
            return 0.0
        wakeup = next_wakeup(current, node, settings, now, deadline)
        return min(self.wait, max(wakeup - now, 0.0) + WAKE_SLACK)

    def __call__(self, blob: bytes | None) -> bytes | None:
        """The step as a change of the stored bytes (see :data:`~.api.StateChange`)."""
        new = self.run(RendezvousState() if blob is None else decode(blob))
        return None if new is None else encode(new)

    def to_wire(self) -> bytes:
        """The step as compact JSON bytes, then its report's text on a line of its own: the
        store keeps that text as it came, without parsing it (see :mod:`.info`)."""
        data = {
            "v": _VERSION,
            "ops": [operation.value for operation in self.operations],
            "node": self.node,
            "now": self.now,
            "deadline": self.deadline,
            "wait": self.wait,
        }
        # The settings are the same at every step of a handler: encoded once.
        head = json.dumps(data, separators=(",", ":"))
        wire = f'{head[:-1]},"settings":{_settings_json(self.settings)}}}'
        if self.info is not None:
            wire = f"{wire}\n{Info.of(self.info).text}"  # JSON's own text holds no bare newline
        return wire.encode()

    @classmethod
    def from_wire(cls, blob: bytes) -> Step:
        """Decode what :meth:`to_wire` made; raise :class:`StepFormatError` on anything else."""
        try:
            blob, lined, report = blob.partition(b"\n")
            data, settings = _parse(blob)
            node, ops = data["node"], data["ops"]
            if not isinstance(node, str) or not node:
                raise ValueError(f"node id {node!r}")
            if "info" in data:
                raise ValueError("a report in the step (it follows the step, on its own line)")
            if not isinstance(ops, list) or not 1 <= len(ops) <= len(Operation):
                raise ValueError(f"operations {ops!r}")
            return cls(
                tuple(_OPERATIONS[op] for op in ops),
                node,
                settings,
                _time(data["now"]),
                _time(data["deadline"]),
                Info(report.decode()) if lined else None,
                _time(data["wait"]),
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:  # ConfigError too
            raise StepFormatError(f"malformed rendezvous step: {exc}") from None


_MARK = b',"settings":'
_SETTINGS_TEXT: dict[bytes, RendezvousSettings] = {}


def _parse(blob: bytes) -> tuple[dict[str, Any], RendezvousSettings]:
    """A step's JSON object and its settings. Every node of a rendezvous sends the same
    settings, last (:meth:`Step.to_wire`): once seen, their text is looked up, not parsed and
    checked again (a JSON string cannot hold the mark's bare quotes, so the last mark is the
    object's own key; with duplicate keys, the last counts, as in ``json.loads``)."""
    at = blob.rfind(_MARK)
    text = blob[at + len(_MARK) : -1] if at > 0 and blob.endswith(b"}") else b""
    known = _SETTINGS_TEXT.get(text) if text else None
    data = json.loads(blob if known is None else blob[:at] + b"}")
    if not isinstance(data, dict) or data.get("v") != _VERSION:
        raise ValueError("unknown step format")
    if known is not None:
        return data, known
    settings = _settings(data["settings"])
    if text and _settings(json.loads(text)) is settings:  # the text is those settings'
        if len(_SETTINGS_TEXT) >= 64:
            _SETTINGS_TEXT.clear()
        _SETTINGS_TEXT[text] = settings
    return data, settings


_SETTINGS: dict[tuple[Any, ...], RendezvousSettings] = {}
_SETTINGS_KEYS = (
    "run_id",
    "min_nodes",
    "max_nodes",
    "join",
    "last_call",
    "close",
    "heartbeat",
    "keep_alive_interval",
    "keep_alive_max_attempt",
)


_SETTINGS_JSON: dict[int, tuple[RendezvousSettings, str]] = {}


def settings_size(s: RendezvousSettings) -> int:
    """The bytes of ``s`` in a step on the wire."""
    return len(_settings_json(s))


def _settings_json(s: RendezvousSettings) -> str:
    """``s`` as a step carries it (JSON), kept for the settings objects seen lately."""
    known = _SETTINGS_JSON.get(id(s))
    if known is not None and known[0] is s:
        return known[1]
    values = (
        s.run_id,
        s.min_nodes,
        s.max_nodes,
        s.timeout.join,
        s.timeout.last_call,
        s.timeout.close,
        s.timeout.heartbeat,
        s.keep_alive_interval,
        s.keep_alive_max_attempt,
    )
    text = json.dumps(dict(zip(_SETTINGS_KEYS, values, strict=True)), separators=(",", ":"))
    if len(_SETTINGS_JSON) >= 64:
        _SETTINGS_JSON.clear()
    _SETTINGS_JSON[id(s)] = (s, text)  # (holding ``s``: its id stays its own)
    return text


def _settings(data: object) -> RendezvousSettings:
    """The settings a step carries; every node of a rendezvous sends the same ones, so those
    seen lately are kept, already validated."""
    if not isinstance(data, dict):
        raise TypeError(f"settings {data!r}")
    values = tuple(data[key] for key in _SETTINGS_KEYS)
    key = tuple((type(v), v) for v in values)  # 1 and 1.0 and True are different settings
    known = _SETTINGS.get(key)
    if known is not None:
        return known
    run_id, min_nodes, max_nodes, join, last_call, close, heartbeat, interval, attempts = values
    settings = RendezvousSettings(
        run_id=run_id,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        timeout=RendezvousTimeout(join=join, last_call=last_call, close=close, heartbeat=heartbeat),
        keep_alive_interval=interval,
        keep_alive_max_attempt=attempts,
    )
    if len(_SETTINGS) >= 64:
        _SETTINGS.clear()
    _SETTINGS[key] = settings
    return settings


def _time(value: object) -> float:
    if type(value) is float and math.isfinite(value):  # as every step sends its times
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"time {value!r}")
    return float(value)
