"""The SSH provider's start, its hosts faked by this machine (their shells are local, their
connections made by a dial given to the bootstrap): the order in which hosts are connected
and probed."""

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
from clusterbook.providers.ssh.hosts import parse_hosts, targets
from clusterbook.providers.ssh.sessions import Sessions
from clusterbook.providers.ssh.start import Bootstrap
from clusterbook.ssh.hostkeys import HostKey, make_policy
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


def bootstrap(known_hosts: Path, connect_timeout: float = 30.0) -> Bootstrap:
    """The start of an SSH cluster of hosts ``fast`` and ``slow``."""
    known_hosts.write_text("")
    hosts = ["fast", "slow"]
    found = targets(hosts, ssh_config="none", user=None, port=None, identity=None)
    policy = make_policy("accept-new", known_hosts)
    sessions = Sessions(found, policy, connect_timeout, lambda host: sys.executable)
    ctx = StartContext("cb-test-start", sys.executable, find_launcher(sys.executable), {})
    return Bootstrap(ctx, sessions, parse_hosts(hosts), dict.fromkeys(hosts, 1), {}, {})


def probe_all(boot: Bootstrap, dial: Callable[[str, float], FakeConnection]) -> None:
    """Connect to and probe every host (connections made by ``dial``), then close the
    sessions that were left open."""
    sessions: dict[str, NodeSession] = {}
    try:
        boot.connect_and_probe(sessions, time.monotonic(), dial)
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

    boot = bootstrap(tmp_path / "known_hosts")
    probe_all(boot, dial)
    assert seen == {"fast probed first": True}
    assert sorted(boot.facts) == ["fast", "slow"]
    assert list(boot.sessions.conns) == ["fast", "slow"]  # in the order the hosts were given


def test_a_host_that_cannot_be_reached_fails_the_start_and_closes_the_others(tmp_path) -> None:
    opened: list[FakeConnection] = []

    def dial(host: str, timeout: float) -> FakeConnection:
        if host == "slow":
            raise cb.SSHConnectError(f"{host}: connection refused", host=host)
        opened.append(FakeConnection(host, threading.Event()))
        return opened[-1]

    boot = bootstrap(tmp_path / "known_hosts", connect_timeout=0.3)
    sessions: dict[str, NodeSession] = {}
    with pytest.raises(cb.BootstrapError) as info:
        boot.connect_and_probe(sessions, time.monotonic(), dial)
    assert list(info.value.problems) == ["slow"]
    assert "connection refused" in str(info.value)
    assert sessions == {}  # every session that was opened is closed
    assert [c.active for c in opened] == [False]
    assert boot.sessions.conns == {}  # nothing for stop() to clean
