"""The SSH provider's start, its hosts faked by this machine (their shells are local, their
connections made by an injected dial): the order in which hosts are connected and probed."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.launch.flavour import find_launcher
from clusterbook.providers.base import StartContext
from clusterbook.providers.ssh import SSHProvider
from clusterbook.ssh.bootstrap import NodeSession
from clusterbook.ssh.hostkeys import HostKey
from clusterbook.ssh.local_shell import LocalShell

WAIT = 20.0  # far more than a local probe takes, even on a loaded machine


class FakeConnection(LocalShell):
    """What the provider keeps of a connection: its commands run here."""

    active = True
    local_addr = "127.0.0.1"

    def __init__(self, host: str, started: threading.Event) -> None:
        super().__init__(host)
        self._started = started

    def server_key(self) -> HostKey:
        return HostKey(
            "ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
        )

    def start(self, argv, *, env=None):  # type: ignore[no-untyped-def]
        self._started.set()
        return super().start(argv, env=env)

    def close(self) -> None:
        self.active = False


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[SSHProvider]:
    known = tmp_path / "known_hosts"
    known.write_text("")
    p = SSHProvider(["fast", "slow"], host_keys="accept-new", known_hosts=known)
    p._ctx = StartContext("cb-test-start", sys.executable, find_launcher(sys.executable), {})
    yield p
    p._ctx = None  # nothing was installed: no node to clean


def test_a_host_is_probed_while_another_is_still_connecting(provider, monkeypatch) -> None:
    fast_probing = threading.Event()
    seen: dict[str, bool] = {}

    def dial(host: str, timeout: float) -> FakeConnection:
        if host == "slow":  # its handshake ends only once the other host's probe has begun
            seen["fast probed first"] = fast_probing.wait(WAIT)
        return FakeConnection(host, fast_probing if host == "fast" else threading.Event())

    monkeypatch.setattr(provider, "_dial", dial)
    sessions: dict[str, NodeSession] = {}
    try:
        provider._connect_and_probe(provider._ctx, sessions, time.monotonic())
    finally:
        for session in sessions.values():
            session.close()
    assert seen == {"fast probed first": True}
    assert sorted(provider._facts) == ["fast", "slow"]
    assert list(provider._conns) == ["fast", "slow"]  # in the order the hosts were given


def test_a_host_that_cannot_be_reached_fails_the_start_and_closes_the_others(
    provider, monkeypatch
) -> None:
    opened: list[FakeConnection] = []

    def dial(host: str, timeout: float) -> FakeConnection:
        if host == "slow":
            raise cb.SSHConnectError(f"{host}: connection refused", host=host)
        opened.append(FakeConnection(host, threading.Event()))
        return opened[-1]

    monkeypatch.setattr(provider, "_dial", dial)
    monkeypatch.setattr(provider, "connect_timeout", 0.3)
    sessions: dict[str, NodeSession] = {}
    with pytest.raises(cb.BootstrapError) as info:
        provider._connect_and_probe(provider._ctx, sessions, time.monotonic())
    assert list(info.value.problems) == ["slow"]
    assert "connection refused" in str(info.value)
    assert sessions == {}  # every session that was opened is closed
    assert [c.active for c in opened] == [False]
    assert provider._conns == {}  # nothing for stop() to clean
