"""What the rendezvous decisions read of a state: a whole state, a draft being changed, or a
node's own view of a state (:mod:`.state`, :mod:`.view`)."""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Protocol

__all__ = ["Observed", "StateView"]


class StateView(Protocol):
    """What decisions read of a state: a :class:`~.state.RendezvousState` or a
    :class:`~.state.Draft`."""

    @property
    def round(self) -> int: ...

    @property
    def complete(self) -> bool: ...

    @property
    def deadline(self) -> float | None: ...

    @property
    def closed(self) -> bool: ...

    @property
    def participants(self) -> Mapping[str, int]: ...

    @property
    def wait_list(self) -> Set[str]: ...

    @property
    def last_heartbeats(self) -> Mapping[str, float]: ...

    @property
    def joined(self) -> int:
        """How many nodes are participants (``participants`` may name only some of them)."""
        ...

    @property
    def waiting(self) -> int:
        """How many nodes are in the wait list (``wait_list`` may name only some of them)."""
        ...


class Observed(StateView, Protocol):
    """What a node observes of a state and decides on: a :class:`~.state.RendezvousState`,
    or the node's own view of it (:class:`~.view.NodeView`)."""

    @property
    def stop_jobs(self) -> tuple[str, ...]: ...

    def oldest(self) -> tuple[tuple[float, str], ...]: ...
