"""Files and commands on a running cluster's nodes, as a head in this process does them with
its provider's reach (:class:`NodeCalls`, which :class:`~clusterbook.cluster.local_head.LocalHead`
takes them from): ``put`` (to the paths given, or under ``dest``), ``write``, ``gather`` and
``run_on_nodes`` (on every node, or on those named)."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from clusterbook.durations import Duration, duration
from clusterbook.nodes.commands import NodeRun, chosen_nodes, runs_frame
from clusterbook.nodes.destination import own_files
from clusterbook.nodes.outgoing import Outgoing
from clusterbook.nodes.transfer import gather_into, put_paths, write_data
from clusterbook.providers.base import Provider
from clusterbook.spec import NodeSpec

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NodeCalls", "Nodes"]

#: ``nodes=``: a node's name, or a list of them (as ``cluster.nodes`` names them); None: all.
Nodes = str | Collection[str] | None


class _Head(Protocol):
    """What :class:`NodeCalls` needs of the head it is part of."""

    @property
    def provider(self) -> Provider: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def nodes(self) -> tuple[NodeSpec, ...]: ...
    def _require_running(self, what: str) -> None: ...
    def node_runs(
        self, argv: Sequence[str], timeout: Duration = 60.0, nodes: Nodes = None
    ) -> list[NodeRun]: ...


class NodeCalls:
    """``put``, ``write``, ``gather`` and ``run_on_nodes`` of a head in this process. A
    relative ``dest`` or ``path`` is taken from this process's working directory, where the
    cluster's jobs run by default."""

    def put(
        self: _Head,
        *paths: str | os.PathLike[str],
        progress: bool | None = None,
        dest: str | os.PathLike[str] | None = None,
    ) -> None:
        self._require_running("put")
        own = own_files(self.run_dir)
        put_paths(self.provider.reach.put, paths, progress, dest, base=os.getcwd(), own=own)

    def write(
        self: _Head,
        path: str | os.PathLike[str],
        data: bytes | str,
        nodes: Nodes = None,
        *,
        mode: int = 0o644,
    ) -> None:
        self._require_running("write")
        names = chosen_nodes(self.nodes, nodes, "write")
        reach = self.provider.reach

        def send(sent: Outgoing, sending: Callable[[int], None]) -> dict[str, Exception]:
            if names is None:  # as a provider written before nodes= was there is asked
                return reach.put(sent, sending)
            return reach.put(sent, sending, nodes=names)

        own = own_files(self.run_dir)
        write_data(send, path, data, mode, base=os.getcwd(), own=own)

    def gather(
        self: _Head, directory: str | os.PathLike[str], *, progress: bool | None = None
    ) -> list[Path]:
        self._require_running("gather")
        return gather_into(self.provider.reach.gather, Path(directory), progress)

    def node_runs(
        self: _Head, argv: Sequence[str], timeout: Duration = 60.0, nodes: Nodes = None
    ) -> list[NodeRun]:
        """What :meth:`run_on_nodes` shows, one :class:`NodeRun` per node."""
        self._require_running("run_on_nodes")
        names = chosen_nodes(self.nodes, nodes, "run_on_nodes")
        timeout = duration(timeout, "timeout")
        if names is None:  # as a provider written before nodes= was there is asked
            return self.provider.reach.run_on_nodes(argv, timeout)
        return self.provider.reach.run_on_nodes(argv, timeout, nodes=names)

    def run_on_nodes(
        self: _Head, argv: Sequence[str], timeout: Duration = 60.0, nodes: Nodes = None
    ) -> pd.DataFrame:
        return runs_frame(self.node_runs(argv, timeout, nodes))
