"""The in-memory backend passes the backend contract."""

from __future__ import annotations

import pytest

from clusterbook.rendezvous.backends.memory import MemoryBackend
from tests.sdk.rendezvous.contract import BackendContract


class TestMemoryBackend(BackendContract):
    @pytest.fixture
    def backend(self):
        return MemoryBackend()

    @pytest.fixture
    def backend_pair(self):
        shared = MemoryBackend()
        return shared, shared
