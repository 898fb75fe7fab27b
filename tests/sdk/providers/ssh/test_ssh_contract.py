"""The SSH provider passes the provider contract on fake hosts (real sshd in network
namespaces, tests/testbed.py), each host with a directory of its own where files are put and
gathered."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from clusterbook.providers.ssh.provider import SSHProvider
from tests.sdk.providers.contract import ProviderCase, ProviderContract, lost
from tests.testbed import FakeHost, Testbed, is_agent, unshared
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd]
testbed = fake_hosts


class SSHCase(ProviderCase):
    kind = "ssh"

    def __init__(self, bed: Testbed, scratch: Path) -> None:
        self.bed = bed
        self.hosts = bed.hosts[:2]
        self.scratch = scratch
        self._stopped: list[int] = []

    def make(self) -> SSHProvider:
        return self._provider([f"{h.addr}:1" for h in self.hosts])

    def failing(self) -> SSHProvider:
        # Nothing answers on port 1: the host cannot be reached within connect_timeout.
        return self._provider([f"{self.hosts[0].addr}:1"], port=1, connect_timeout=1.0)

    def _provider(self, hosts: list[str], **kw: object) -> SSHProvider:
        kw.setdefault("connect_timeout", 10.0)
        known = self.bed.write_known_hosts()
        return SSHProvider(hosts, identity=self.bed.identity, known_hosts=known, **kw)  # type: ignore[arg-type]

    def miss(self, provider: SSHProvider) -> str:  # type: ignore[override]
        """Stop (SIGSTOP) the agent on the second host: it stops heartbeating, and is lost."""
        host = self.hosts[1]
        tag = f"{provider.head.settings.run_id}:agents"
        for pid in host.processes():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if is_agent(proc) and proc.environ().get("CLUSTERBOOK_JOB") == tag:
                    os.kill(pid, signal.SIGSTOP)
                    self._stopped.append(pid)
        assert self._stopped, f"no agent found on {host.name}"
        lost(provider, host.addr)
        return host.addr

    def mend(self) -> None:
        for pid in self._stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def leftovers(self, cluster_id: str) -> list[str]:
        return [found for host in self.hosts for found in _left_on(host, cluster_id)]


def _left_on(host: FakeHost, cluster_id: str) -> list[str]:
    """The cluster's directory and key line on ``host``, where they are still there."""
    found = []
    directory = host.home / ".clusterbook" / "clusters" / cluster_id
    if directory.exists():
        found.append(f"{host.name}: {directory}")
    if f"clusterbook:{cluster_id}" in host.authorized_keys.read_text():
        found.append(f"{host.name}: the cluster's key in authorized_keys")
    return found


class TestSSHProvider(ProviderContract):
    @pytest.fixture
    def case(self, testbed: Testbed, tmp_path: Path) -> Iterator[SSHCase]:
        work = tmp_path / "work"
        with unshared(testbed.hosts[:2], work, tmp_path):
            yield SSHCase(testbed, work)
