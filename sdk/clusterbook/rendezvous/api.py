"""The rendezvous store contract, its settings and its errors.

A :class:`RendezvousBackend` is a tiny compare-and-set store for one opaque state blob, the
way torch elastic's dynamic rendezvous keeps its state:

- ``get_state()`` returns ``(state, token)`` or ``None`` when no state was ever set.
- ``set_state(state, token)`` writes ``state`` only if ``token`` is the token of the state
  currently stored (or ``None`` when nothing is stored yet). It returns ``(state, token,
  won)``: the state and token stored *after* the call, and whether this call wrote them.
- Tokens are fencing tokens: every successful write gets a new token, strictly greater than
  all before it, so a writer holding an old token can never overwrite a newer state. A stale,
  ``None`` (once a state exists) or malformed token never wins.
- ``watch(token, timeout)`` returns as soon as the stored token differs from ``token``, or at
  ``timeout``, with the current ``(state, token)``: waiters wake on change instead of polling.
- ``watch_decisions(token, timeout)`` is the same, except that it may sleep through writes that
  change no rendezvous decision (:func:`~.ops.decisions_may_change`: heartbeats, reports, a node
  joining before the last call). Waking on every change, as ``watch`` does, is allowed.
- ``watch_members(token, timeout)`` may sleep through writes that change only heartbeats and
  reports (:func:`~.ops.members_may_change`): what an agent following its round waits with, so
  that the nodes' heartbeats do not wake every node. Waking on every change is allowed here too.
- ``read_state(token, timeout)`` waits as ``watch`` does and returns the state whole, which it
  may read in parts (each of the one state it returns, never a mix of two): how the head reads
  a state larger than one message of the store (the TCP store's frames hold 16 MB; its states
  up to 256 MB). The default is ``watch``. With ``since`` (the token of a state the reader
  read before), the state's reports (``node_info``) may hold only those written after that
  state: the reader keeps the others as it read them (the TCP store does so; the head reads
  so, and a round of many nodes does not send it every node's report after every write).
- ``update(change)`` applies a :data:`StateChange` (a pure function of the stored state)
  atomically and returns the stored ``(state, token)`` after it; a write gets a new token. The
  default is a compare-and-set loop (read, change, write unless another write came first, else
  again on the newer state); a backend may run the change on its side instead (the TCP store
  does so for rendezvous steps: one round trip, however many nodes write at once).
- What ``update`` of a rendezvous step, ``watch_decisions`` and ``watch_members`` return may
  be, instead of the state, the node's view of it (:mod:`~clusterbook.rendezvous.view`: its
  rank, the counts, the round, where rank 0 is; a step's node, or the node the client is of),
  whose size does not grow with the cluster (the TCP store does so), or the state without the
  nodes' reports (``node_info``), which only the head reads; ``get_state`` and ``watch``
  return the state whole. A compare-and-set starts from ``get_state``, never from such an
  answer.

Errors are :class:`RendezvousError` subclasses: a store that cannot be reached raises
:class:`RendezvousConnectionError` within its timeout; a state that does not decode raises
:class:`RendezvousStateError`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.spec import validate_seconds

__all__ = [
    "RendezvousBackend",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousSettings",
    "RendezvousStateError",
    "RendezvousTimeout",
    "RendezvousTimeoutError",
    "StateChange",
    "Token",
]

Token = int

_UPDATE_ATTEMPTS = 1000

StateChange = Callable[[bytes | None], bytes | None]
"""A change of the stored state: the stored state (None if none) -> the state to store instead,
or None to leave it as it is. Pure: a backend may run it more than once, or on its own side."""


class RendezvousError(ClusterError):
    """Base class of rendezvous errors."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous is closed: no node may join it any more."""


class RendezvousTimeoutError(RendezvousError, TimeoutError):
    """The rendezvous did not complete in time."""


class RendezvousConnectionError(RendezvousError):
    """The store cannot be reached."""


class RendezvousStateError(RendezvousError):
    """The stored state is corrupt (does not decode)."""


class RendezvousBackend(ABC):
    """A compare-and-set store for the rendezvous state (semantics in the module docstring)."""

    name: str = "backend"

    @abstractmethod
    def get_state(self) -> tuple[bytes, Token] | None:
        """The stored state and its token, or None if no state was ever set."""

    @abstractmethod
    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool]:
        """Write ``state`` if ``token`` matches the stored one; return (state, token, won)."""

    def watch(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        """Wait until the stored token differs from ``token`` (or ``timeout`` seconds pass)
        and return the current state. This default polls; real backends push."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            current = self.get_state()
            current_token = None if current is None else current[1]
            left = deadline - time.monotonic()
            if current_token != token or left <= 0:
                return current
            time.sleep(min(0.02, left))

    def read_state(
        self, token: Token | None, timeout: float, *, since: Token | None = None
    ) -> tuple[bytes, Token] | None:
        """Like :meth:`watch`, whatever the size of the state: a backend whose messages are
        bounded reads it in parts, all of one state. ``since``: the reports may be only those
        written after the state of that token. This default is :meth:`watch` (all reports)."""
        return self.watch(token, timeout)

    def watch_decisions(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        """Like :meth:`watch`, but may sleep through writes that change no rendezvous decision.
        This default wakes on every change."""
        return self.watch(token, timeout)

    def watch_members(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        """Like :meth:`watch`, but may sleep through writes that change only heartbeats and
        reports. This default wakes on every change."""
        return self.watch(token, timeout)

    def update(self, change: StateChange) -> tuple[bytes, Token] | None:
        """Apply ``change`` atomically and return the stored state after it (by a
        compare-and-set loop here: each lost attempt means another write won)."""
        current = self.get_state()
        for _ in range(_UPDATE_ATTEMPTS):
            blob, token = (None, None) if current is None else current
            new = change(blob)
            if new is None:
                return current
            state, new_token, won = self.set_state(new, token)
            if won:
                return state, new_token
            current = state, new_token  # what came first: no need to read it again
        raise RendezvousTimeoutError(
            f"The rendezvous state in the {self.name} store changed under {_UPDATE_ATTEMPTS} "
            "attempts in a row to update it: too many nodes write it at once for this store. "
            "Use the TCP store, whose server applies each node's step itself."
        )

    def close(self) -> None:  # noqa: B027 - optional for backends without resources
        """Release connections or files. Safe to call more than once."""


def _positive(value: object, name: str) -> float:
    seconds = validate_seconds(value, name)
    assert seconds is not None
    return seconds


@dataclass(frozen=True, slots=True)
class RendezvousTimeout:
    """Timeouts of a rendezvous, in seconds (torch elastic's names and meanings).

    join: how long a node may wait for a round to complete.
    last_call: once ``min_nodes`` have joined, how long to wait for more before completing.
    close: how long to wait for the others when closing.
    heartbeat: how long one heartbeat write may take (how often heartbeats are sent is
    ``RendezvousSettings.keep_alive_interval``).
    """

    join: float = 600.0
    last_call: float = 1.0
    close: float = 30.0
    heartbeat: float = 1.0

    def __post_init__(self) -> None:
        for name in ("join", "last_call", "close", "heartbeat"):
            # Kept as seconds, whatever form of duration was given ("30s", a timedelta).
            object.__setattr__(self, name, _positive(getattr(self, name), f"{name} timeout"))


@dataclass(frozen=True, slots=True)
class RendezvousSettings:
    """What a rendezvous is: its id, how many nodes, its timeouts, its keep-alive.

    A node is removed once it missed ``keep_alive_max_attempt`` heartbeats of
    ``keep_alive_interval`` seconds (defaults 1 s x 3 for interactive use).
    """

    run_id: str
    min_nodes: int
    max_nodes: int
    timeout: RendezvousTimeout = field(default_factory=RendezvousTimeout)
    keep_alive_interval: float = 1.0
    keep_alive_max_attempt: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not self.run_id:
            raise ConfigError(f"The run id must be a non-empty string, got {self.run_id!r}.")
        for name in ("min_nodes", "max_nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(
                    f"The {name.replace('_', ' ')} must be a whole number, got {value!r}."
                )
        if self.min_nodes < 1:
            raise ConfigError(
                f"The minimum number of nodes ({self.min_nodes}) must be greater than zero."
            )
        if self.max_nodes < self.min_nodes:
            raise ConfigError(
                f"The maximum number of nodes ({self.max_nodes}) must be greater than or equal "
                f"to the minimum number of nodes ({self.min_nodes})."
            )
        interval = _positive(self.keep_alive_interval, "keep-alive interval")
        object.__setattr__(self, "keep_alive_interval", interval)
        attempts = self.keep_alive_max_attempt
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ConfigError(
                f"The keep-alive max attempt must be a whole number >= 1, got {attempts!r}."
            )

    @property
    def dead_after(self) -> float:
        """Seconds without a heartbeat after which a node counts as dead."""
        return self.keep_alive_interval * self.keep_alive_max_attempt
