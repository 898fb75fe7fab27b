"""The local provider passes the provider contract, with its real agents on this machine."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import psutil
import pytest

from clusterbook.providers.local import LocalAgentsProvider, local_nodes
from tests.sdk.providers.contract import ProviderCase, ProviderContract, lost


class LocalCase(ProviderCase):
    kind = "local"

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self._stopped: list[int] = []

    def make(self) -> LocalAgentsProvider:
        return LocalAgentsProvider(local_nodes(2, 1))

    def failing(self) -> LocalAgentsProvider:
        # Agents that cannot run: each exits at once, and the start says so.
        return LocalAgentsProvider(local_nodes(2, 1), python="/bin/false")

    def miss(self, provider: LocalAgentsProvider) -> str:  # type: ignore[override]
        """Stop (SIGSTOP) the agent of local-1: it stops heartbeating, and is lost."""
        tag = f"{provider.head.settings.run_id}:agents"
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if "local-1" in (proc.info["cmdline"] or ()) and (
                    proc.environ().get("CLUSTERBOOK_JOB") == tag
                ):
                    os.kill(proc.pid, signal.SIGSTOP)
                    self._stopped.append(proc.pid)
        assert self._stopped, "no agent of local-1 found"
        lost(provider, "local-1")
        return "local-1"

    def mend(self) -> None:
        for pid in self._stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


class TestLocalProvider(ProviderContract):
    @pytest.fixture
    def case(self, tmp_path: Path) -> LocalCase:
        return LocalCase(tmp_path)
