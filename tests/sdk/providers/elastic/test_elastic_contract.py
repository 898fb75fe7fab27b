"""The elastic provider passes the provider contract, with real agents joining it from this
machine (``clusterbook worker join``, as its join command says)."""

from __future__ import annotations

import contextlib
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterbook.providers.base import StartContext
from clusterbook.providers.elastic.provider import ElasticProvider
from tests.sdk.providers.contract import ProviderCase, ProviderContract, lost


class ElasticCase(ProviderCase):
    kind = "elastic"

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.provider: ElasticProvider | None = None

    def make(self) -> ElasticProvider:
        return ElasticProvider(2, 2, last_call=0.1, announce=False)

    def failing(self) -> ElasticProvider:
        # Nowhere to serve the rendezvous: an address this machine does not have.
        return ElasticProvider(1, 1, listen="10.255.255.1", announce=False)

    def bring_up(self, provider: ElasticProvider, ctx: StartContext) -> None:  # type: ignore[override]
        """Two agents join, as a user starts them with the join command."""
        assert provider.join_command is not None
        self.provider = provider
        argv = shlex.split(provider.join_command)[1:]  # run it with this Python
        for node in ("node-a", "node-b"):
            self.agents[node] = subprocess.Popen(
                [sys.executable, "-m", "clusterbook", *argv, "--node-id", node, "--slots", "1"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def miss(self, provider: ElasticProvider) -> str:  # type: ignore[override]
        """Stop (SIGSTOP) node-b's agent: it stops heartbeating, and is lost."""
        self.agents["node-b"].send_signal(signal.SIGSTOP)
        lost(provider, "node-b")
        return "1 of at least 2 nodes joined (node-a)"

    def mend(self) -> None:
        """Resume node-b's agent and wait until the head hears from it again: stopped before
        that, the cluster would close while the agent is still cut off, and the agent would
        outlive it by its lease (~20 s), waiting for a head that is gone."""
        agent = self.agents.get("node-b")
        if agent is None or agent.poll() is not None:
            return
        agent.send_signal(signal.SIGCONT)
        assert self.provider is not None
        deadline = time.monotonic() + 20
        while self.provider.watch.unreachable(["node-b"]) and agent.poll() is None:
            assert time.monotonic() < deadline, "node-b's agent was not heard from within 20 s"
            time.sleep(0.05)

    def close(self) -> None:
        """The agents are the test's: none outlives it (they leave when the cluster stops)."""
        for proc in self.agents.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=10)


class TestElasticProvider(ProviderContract):
    @pytest.fixture
    def case(self, tmp_path: Path) -> Iterator[ElasticCase]:
        case = ElasticCase(tmp_path)
        try:
            yield case
        finally:
            case.close()
