"""A provider that writes only what the contract requires (``nodes``, ``start``, ``stop``), as
a package adding a kind would, passes the contract through the defaults: a fixed set of nodes
sharing this machine's files (FixedWatch, LocalReach)."""

from __future__ import annotations

from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.providers.base import Provider, StartContext
from clusterbook.spec import HERE, NodeSpec
from tests.sdk.providers.contract import ProviderCase, ProviderContract


class Minimal(Provider):
    """Two nodes on this machine, up from the start; ``refuse``: a start that fails."""

    kind = "minimal"

    def __init__(self, refuse: bool = False) -> None:
        self._refuse = refuse

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return (NodeSpec("m-0", HERE, 1), NodeSpec("m-1", HERE, 1))

    def start(self, ctx: StartContext) -> None:
        if self._refuse:
            raise cb.ConfigError("The minimal provider refuses to start, as told.")
        self.started = True

    def stop(self) -> None:
        self.started = False


class MinimalCase(ProviderCase):
    kind = "minimal"

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch

    def make(self) -> Minimal:
        return Minimal()

    def failing(self) -> Minimal:
        return Minimal(refuse=True)


class TestMinimalProvider(ProviderContract):
    @pytest.fixture
    def case(self, tmp_path: Path) -> MinimalCase:
        return MinimalCase(tmp_path)
