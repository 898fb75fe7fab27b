"""clusterbook.testing.FakeProvider passes the provider contract: what users' tests inject
behaves as a provider does."""

from __future__ import annotations

from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.testing import FakeProvider
from tests.sdk.providers.contract import ProviderCase, ProviderContract


class FakeCase(ProviderCase):
    kind = "fake"

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch

    def make(self) -> FakeProvider:
        return FakeProvider(nodes=2, slots=2)

    def failing(self) -> FakeProvider:
        return FakeProvider(nodes=2, fail_start=cb.BootstrapError({"fake-1": ["no node today"]}))


class TestFakeProvider(ProviderContract):
    @pytest.fixture
    def case(self, tmp_path: Path) -> FakeCase:
        return FakeCase(tmp_path)
