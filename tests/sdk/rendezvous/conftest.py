"""Fixtures of the rendezvous tests: TCP store servers and clients, closed after each test."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import pytest

from clusterbook.rendezvous.backends.tcp import TcpBackend
from clusterbook.rendezvous.backends.tcp_server import StoreServer


@pytest.fixture
def secret() -> bytes:
    return secrets.token_bytes(32)


@pytest.fixture
def make_server(secret: bytes) -> Iterator[Callable[..., StoreServer]]:
    servers: list[StoreServer] = []

    def make(**kw: object) -> StoreServer:
        kw.setdefault("secret", secret)
        server = StoreServer("127.0.0.1", 0, **kw)  # type: ignore[arg-type]
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def make_client(secret: bytes) -> Iterator[Callable[..., TcpBackend]]:
    clients: list[TcpBackend] = []

    def make(url: str, **kw: object) -> TcpBackend:
        kw.setdefault("secret", secret)
        client = TcpBackend(url, **kw)  # type: ignore[arg-type]
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
