"""An in-process store: for tests and simulations of many nodes in one process."""

from __future__ import annotations

import threading

from clusterbook.rendezvous.api import RendezvousBackend, Token

__all__ = ["MemoryBackend"]


class MemoryBackend(RendezvousBackend):
    """Compare-and-set over a blob in memory; ``watch`` wakes on change."""

    name = "memory"

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._state: bytes | None = None
        self._token: Token = 0

    def get_state(self) -> tuple[bytes, Token] | None:
        with self._cond:
            return None if self._state is None else (self._state, self._token)

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool]:
        if not isinstance(state, bytes):
            raise TypeError(f"state must be bytes, got {type(state).__name__}")
        with self._cond:
            current = None if self._state is None else self._token
            valid = token is None or (isinstance(token, int) and not isinstance(token, bool))
            if valid and token == current:
                self._state, self._token = state, self._token + 1
                self._cond.notify_all()
                return state, self._token, True
            assert self._state is not None or current is None
            return (self._state or b""), self._token, False

    def watch(self, token: Token | None, timeout: float) -> tuple[bytes, Token] | None:
        with self._cond:
            self._cond.wait_for(
                lambda: (None if self._state is None else self._token) != token, max(0.0, timeout)
            )
            return None if self._state is None else (self._state, self._token)
