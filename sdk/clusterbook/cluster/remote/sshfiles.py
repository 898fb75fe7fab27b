"""A cluster's files on another machine, read through the clusterbook that answers there:
:class:`RemoteFiles` (:mod:`clusterbook.cluster.remote.sshdir` asks; the service of
:mod:`clusterbook.cluster.remote.dirservice` answers)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Asker", "RemoteFiles"]


class Asker(Protocol):
    """What :class:`RemoteFiles` (and a function job's call folder there) goes through: an
    :class:`SSHDir`."""

    @property
    def where(self) -> str: ...

    def ask(
        self, op: str, *, wait: float = ..., data: bytes = ..., **args: Any
    ) -> tuple[dict[str, Any], bytes]:
        """The answer to request ``op`` (with ``data``; see
        :mod:`clusterbook.cluster.remote.dirwire`) and its bytes."""
        ...


class RemoteFiles:
    """:class:`~clusterbook.launch.files.Files` read through the service of ``there``, a
    file's bytes in as many answers as it takes."""

    def __init__(self, there: Asker) -> None:
        self._there = there

    @property
    def where(self) -> str:
        return self._there.where

    def read_many(self, wanted: Sequence[tuple[Path, int]]) -> list[bytes | None]:
        got: list[bytearray | None] = [bytearray() for _ in wanted]
        todo = [(i, str(path), int(offset)) for i, (path, offset) in enumerate(wanted)]
        while todo:
            message, data = self._there.ask("read", files=[[p, o] for _, p, o in todo])
            rest, at = [], 0
            for (i, path, offset), size, complete in zip(
                todo, message["sizes"], message["complete"], strict=True
            ):
                if size is None:
                    got[i] = None
                    continue
                part = got[i]
                assert part is not None
                part += data[at : at + size]
                at += size
                if not complete:
                    rest.append((i, path, offset + size))
            todo = rest
        return [None if g is None else bytes(g) for g in got]

    def listdir(self, path: Path) -> list[tuple[str, bool]]:
        message, _ = self._there.ask("listdir", path=str(path))
        return [(str(name), bool(is_dir)) for name, is_dir in message["entries"]]

    def size(self, path: Path) -> int | None:
        message, _ = self._there.ask("size", path=str(path))
        size = message.get("size")
        return None if size is None else int(size)
