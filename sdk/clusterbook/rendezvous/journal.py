"""A journal of changes made in place to dicts and sets, which it can undo back to a mark.

A :class:`~.state.Draft` makes every change of its containers through one, so that an owner
that changes a state's own containers (the TCP store, which keeps one state of a whole
cluster and must not copy it for every batch of steps) can still take back a step that
failed, or a batch whose state would be over its limit.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["Journal"]

K = TypeVar("K")
V = TypeVar("V")

_MISSING: Any = object()


class Journal:
    """The changes made through it, oldest first; :meth:`undo` takes them back."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        # (container, key, before): a dict's value before (_MISSING: none), or whether the
        # key was in a set.
        self._entries: list[tuple[Any, Any, Any]] = []

    def mark(self) -> int:
        """The point :meth:`undo` goes back to: now."""
        return len(self._entries)

    def set_item(self, mapping: dict[K, V], key: K, value: V) -> None:
        """``mapping[key] = value``."""
        self._entries.append((mapping, key, mapping.get(key, _MISSING)))
        mapping[key] = value

    def pop_item(self, mapping: dict[K, Any], key: K) -> bool:
        """Remove ``key`` from ``mapping``; whether it was there."""
        before = mapping.pop(key, _MISSING)
        if before is _MISSING:
            return False
        self._entries.append((mapping, key, before))
        return True

    def add(self, members: set[K], key: K) -> bool:
        """Add ``key`` to ``members``; whether it was not there yet."""
        if key in members:
            return False
        members.add(key)
        self._entries.append((members, key, False))
        return True

    def discard(self, members: set[K], key: K) -> bool:
        """Remove ``key`` from ``members``; whether it was there."""
        if key not in members:
            return False
        members.discard(key)
        self._entries.append((members, key, True))
        return True

    def undo(self, mark: int) -> None:
        """Take back every change made since ``mark``, newest first."""
        entries = self._entries
        while len(entries) > mark:
            container, key, before = entries.pop()
            if isinstance(container, dict):
                if before is _MISSING:
                    container.pop(key, None)
                else:
                    container[key] = before
            elif before:
                container.add(key)
            else:
                container.discard(key)
