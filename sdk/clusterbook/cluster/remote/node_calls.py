"""What an attached handle asks the head to do on the nodes (:class:`AttachedNodeCalls`, which
:class:`~clusterbook.cluster.remote.attached.AttachedCluster` takes them from): ``put``,
``write``, ``gather`` and ``run_on_nodes``, as requests of the control channel. The head
resolves a relative ``dest`` or ``path`` from its working directory, where the cluster's jobs
run by default, as a ``Cluster`` does."""

from __future__ import annotations

import base64
import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from clusterbook.cluster.remote.rundir import ClusterDir
from clusterbook.durations import Duration, duration
from clusterbook.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from clusterbook.nodes.commands import NodeRun

__all__ = ["WRITE_MAX", "AttachedNodeCalls"]

#: The most bytes ``write`` sends through the control channel (its frames hold 16 MiB, and
#: the data goes as base64); more goes as a file, with ``put``.
WRITE_MAX = 8 << 20

Nodes = str | Collection[str] | None


class _Handle(Protocol):
    """What :class:`AttachedNodeCalls` needs of the handle it is part of."""

    @property
    def id(self) -> str: ...
    @property
    def _dir(self) -> ClusterDir: ...
    def _call(
        self, op: str, *, reply_within: float | None = None, **args: Any
    ) -> dict[str, Any]: ...
    def node_runs(
        self, argv: Sequence[str], timeout: Duration = 60.0, nodes: Nodes = None
    ) -> list[NodeRun]: ...


class AttachedNodeCalls:
    """``put``, ``write``, ``gather`` and ``run_on_nodes`` through the head's control channel."""

    def put(
        self: _Handle,
        *paths: str | os.PathLike[str],
        progress: bool | None = None,
        dest: str | os.PathLike[str] | None = None,
    ) -> None:
        """Copy files to every node, as ``Cluster.put`` (the head reads them: on its machine;
        attached over ssh, give their absolute paths there)."""
        there = None if dest is None else _text(dest, "put", "dest")
        self._call(
            "put", paths=[_head_path(p, "put", self._dir.where, self.id) for p in paths], dest=there
        )

    def write(
        self: _Handle,
        path: str | os.PathLike[str],
        data: bytes | str,
        nodes: Nodes = None,
        *,
        mode: int = 0o644,
    ) -> None:
        """Write ``data`` to ``path`` on the nodes, as ``Cluster.write`` (at most
        :data:`WRITE_MAX` bytes through the head's control channel)."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ConfigError(
                f"write(data=...) takes bytes, or str (written as UTF-8), not "
                f"{type(data).__name__}."
            )
        if len(data) > WRITE_MAX:
            raise ConfigError(
                f"write() through an attached handle takes at most {WRITE_MAX} bytes, and this "
                f"is {len(data)}; write a file and put() it instead."
            )
        names = [nodes] if isinstance(nodes, str) else nodes
        self._call(
            "write",
            path=_text(path, "write", "path"),
            data=base64.b64encode(bytes(data)).decode(),
            nodes=None if names is None else list(names),
            mode=mode,
        )

    def gather(
        self: _Handle, directory: str | os.PathLike[str], *, progress: bool | None = None
    ) -> list[Path]:
        """Move the files ranks wrote in ``directory`` to the head's machine, as
        ``Cluster.gather`` (attached over ssh: an absolute path there)."""
        answer = self._call(
            "gather", directory=_head_path(directory, "gather", self._dir.where, self.id)
        )
        return [Path(p) for p in answer["paths"]]

    def run_on_nodes(
        self: _Handle, argv: Sequence[str], timeout: Duration = 60.0, nodes: Nodes = None
    ) -> pd.DataFrame:
        """Run ``argv`` on every node (or those ``nodes`` names), as ``Cluster.run_on_nodes``."""
        from clusterbook.nodes.commands import runs_frame

        return runs_frame(self.node_runs(argv, timeout, nodes))

    def node_runs(
        self: _Handle, argv: Sequence[str], timeout: Duration = 60.0, nodes: Nodes = None
    ) -> list[NodeRun]:
        """What :meth:`run_on_nodes` shows, one :class:`NodeRun` per node."""
        from clusterbook.nodes.commands import NodeRun

        if isinstance(argv, str):
            argv = [argv]  # the head refuses it with the message Cluster.run_on_nodes gives
        names = [nodes] if isinstance(nodes, str) else nodes
        asked = None if names is None else list(names)
        answer = self._call(
            "run_on_nodes", argv=list(argv), timeout=duration(timeout, "timeout"), nodes=asked
        )
        return [NodeRun(**row) for row in answer["rows"]]


def _head_path(path: str | os.PathLike[str], op: str, where: str, cluster_id: str) -> str:
    """``path`` as the head reads it: on this machine (``where`` ""), its absolute path; on
    another, the path as given, which must be absolute there (this machine's directory means
    nothing there)."""
    text = os.fspath(path)
    if not where:
        return os.path.abspath(text)
    if not os.path.isabs(text):
        raise ConfigError(
            f"{op}({text!r}): cluster {cluster_id}'s head runs on {where}, and reads "
            "the paths there; give an absolute path on that machine (copy files there "
            "first, with scp or sftp)."
        )
    return text


def _text(path: object, op: str, name: str) -> str:
    """A path on the nodes as the head is sent it (it checks it, and resolves it)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"{op}({name}={path!r}): give a path on the nodes, like 'data/'.")
    return os.fspath(path)
