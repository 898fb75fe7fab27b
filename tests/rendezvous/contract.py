"""The contract every rendezvous backend passes (compare-and-set, fencing, watch, errors).

A backend's test module subclasses :class:`BackendContract` (or :class:`RemoteBackendContract`
for stores that can be unreachable) and provides the ``backend`` fixture (a fresh, empty store
per test) and ``backend_pair`` (two clients of the same store, as two nodes would have).
"""

from __future__ import annotations

import threading
import time

import pytest

from clusterbook.rendezvous.api import RendezvousBackend, RendezvousConnectionError
from clusterbook.rendezvous.state import RendezvousState, decode, encode


class BackendContract:
    """Mix into a test class that defines the fixtures ``backend`` and ``backend_pair``."""

    def test_empty_store_has_no_state(self, backend: RendezvousBackend) -> None:
        assert backend.get_state() is None

    def test_first_write_needs_no_token(self, backend: RendezvousBackend) -> None:
        state, token, won = backend.set_state(b"one")
        assert (state, won) == (b"one", True)
        assert backend.get_state() == (b"one", token)

    def test_none_token_loses_once_a_state_exists(self, backend: RendezvousBackend) -> None:
        _, token, _ = backend.set_state(b"one")
        state, now, won = backend.set_state(b"two", None)
        assert (state, now, won) == (b"one", token, False)

    def test_current_token_wins_and_tokens_grow(self, backend: RendezvousBackend) -> None:
        _, t1, _ = backend.set_state(b"one")
        state, t2, won = backend.set_state(b"two", t1)
        assert (state, won) == (b"two", True)
        assert t2 > t1
        assert backend.get_state() == (b"two", t2)

    def test_stale_token_never_wins(self, backend: RendezvousBackend) -> None:
        _, t1, _ = backend.set_state(b"one")
        _, t2, _ = backend.set_state(b"two", t1)
        state, token, won = backend.set_state(b"stale", t1)
        assert (state, token, won) == (b"two", t2, False)

    @pytest.mark.parametrize("bad", [-1, 10**9, "1", 1.0, True])
    def test_invalid_token_never_wins(self, backend: RendezvousBackend, bad: object) -> None:
        _, token, _ = backend.set_state(b"one")
        state, now, won = backend.set_state(b"evil", bad)  # type: ignore[arg-type]
        assert (state, now, won) == (b"one", token, False)

    def test_token_wins_only_once(self, backend_pair) -> None:
        a, b = backend_pair
        _, token, _ = a.set_state(b"base")
        results = {}

        def write(client: RendezvousBackend, value: bytes) -> None:
            results[value] = client.set_state(value, token)[2]

        threads = [threading.Thread(target=write, args=(c, v)) for c, v in ((a, b"A"), (b, b"B"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results.values()) == [False, True]
        winner = next(v for v, won in results.items() if won)
        assert a.get_state()[0] == winner
        assert b.get_state()[0] == winner

    def test_states_are_bytes_round_tripped(self, backend: RendezvousBackend) -> None:
        blob = encode(RendezvousState(round=3, participants={"n1": 0}, last_heartbeats={"n1": 1.5}))
        backend.set_state(blob)
        state, _ = backend.get_state()
        assert decode(state).participants == {"n1": 0}
        raw = bytes(range(256)) * 4
        backend.set_state(raw, backend.get_state()[1])
        assert backend.get_state()[0] == raw

    def test_watch_returns_at_once_when_token_differs(self, backend: RendezvousBackend) -> None:
        _, token, _ = backend.set_state(b"one")
        assert backend.watch(None, 5.0) == (b"one", token)
        assert backend.watch(token - 1, 5.0) == (b"one", token)

    def test_watch_times_out_without_change(self, backend: RendezvousBackend) -> None:
        _, token, _ = backend.set_state(b"one")
        t0 = time.monotonic()
        assert backend.watch(token, 0.2) == (b"one", token)
        assert time.monotonic() - t0 >= 0.19

    def test_watch_wakes_on_change_from_another_client(self, backend_pair) -> None:
        a, b = backend_pair
        _, token, _ = a.set_state(b"one")
        got = []
        waiter = threading.Thread(target=lambda: got.append(b.watch(token, 10.0)))
        waiter.start()
        time.sleep(0.1)
        _, t2, _ = a.set_state(b"two", token)
        waiter.join(timeout=10)
        assert got == [(b"two", t2)]

    def test_close_is_idempotent(self, backend: RendezvousBackend) -> None:
        backend.close()
        backend.close()


class RemoteBackendContract(BackendContract):
    """For backends with a store to lose: also needs the ``unreachable`` fixture (a factory
    of clients whose store cannot be reached)."""

    def test_unreachable_store_raises_connection_error(self, unreachable) -> None:
        client = unreachable()
        with pytest.raises(RendezvousConnectionError):
            client.get_state()
        with pytest.raises(RendezvousConnectionError):
            client.set_state(b"x")
