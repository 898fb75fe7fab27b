"""The SSH provider's start, its hosts faked by this machine (their shells are local, their
connections made by an injected dial): the order in which hosts are connected and probed."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.launch.flavour import find_launcher
from clusterbook.providers.base import StartContext
from clusterbook.providers.ssh.provider import SSHProvider
from clusterbook.ssh.hostkeys import HostKey
from clusterbook.ssh.local_shell import LocalShell
from clusterbook.ssh.node_session import NodeSession

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


class DialedProvider(SSHProvider):
    """An SSH provider of hosts ``fast`` and ``slow`` whose connections ``dial`` makes."""

    def __init__(
        self, dial: Callable[[str, float], FakeConnection], known_hosts: Path, **options: float
    ) -> None:
        known_hosts.write_text("")
        super().__init__(
            ["fast", "slow"], host_keys="accept-new", known_hosts=known_hosts, **options
        )
        self._fake_dial = dial
        self._ctx = StartContext("cb-test-start", sys.executable, find_launcher(sys.executable), {})

    def _dial(self, host: str, timeout: float) -> FakeConnection:  # type: ignore[override]
        return self._fake_dial(host, timeout)

    def probe_all(self) -> None:
        """Connect to and probe every host, then close the sessions that left open."""
        sessions: dict[str, NodeSession] = {}
        try:
            assert self._ctx is not None
            self._connect_and_probe(self._ctx, sessions, time.monotonic())
        finally:
            for session in sessions.values():
                session.close()


def test_a_host_is_probed_while_another_is_still_connecting(tmp_path) -> None:
    fast_probing = threading.Event()
    seen: dict[str, bool] = {}

    def dial(host: str, timeout: float) -> FakeConnection:
        if host == "slow":  # its handshake ends only once the other host's probe has begun
            seen["fast probed first"] = fast_probing.wait(WAIT)
        return FakeConnection(host, fast_probing if host == "fast" else threading.Event())

    provider = DialedProvider(dial, tmp_path / "known_hosts")
    provider.probe_all()
    assert seen == {"fast probed first": True}
    assert sorted(provider._facts) == ["fast", "slow"]
    assert list(provider._conns) == ["fast", "slow"]  # in the order the hosts were given


def test_a_host_that_cannot_be_reached_fails_the_start_and_closes_the_others(tmp_path) -> None:
    opened: list[FakeConnection] = []

    def dial(host: str, timeout: float) -> FakeConnection:
        if host == "slow":
            raise cb.SSHConnectError(f"{host}: connection refused", host=host)
        opened.append(FakeConnection(host, threading.Event()))
        return opened[-1]

    provider = DialedProvider(dial, tmp_path / "known_hosts", connect_timeout=0.3)
    sessions: dict[str, NodeSession] = {}
    assert provider._ctx is not None
    with pytest.raises(cb.BootstrapError) as info:
        provider._connect_and_probe(provider._ctx, sessions, time.monotonic())
    assert list(info.value.problems) == ["slow"]
    assert "connection refused" in str(info.value)
    assert sessions == {}  # every session that was opened is closed
    assert [c.active for c in opened] == [False]
    assert provider._conns == {}  # nothing for stop() to clean
