"""Where a job's files are read: :class:`Files`, and :data:`LOCAL` (this machine's).

A :class:`~clusterbook.launch.saved.SavedJob` reads its directory through one of these: this
machine's file system, or (for a cluster attached over ssh) the machine its head runs on, through
:mod:`clusterbook.cluster.remote.sshdir`. Reads ask for everything after an offset, in batches, so
that following a job's logs over a network costs a round trip per look, not one per file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

__all__ = ["LOCAL", "Files", "LocalFiles", "read_from"]


class Files(Protocol):
    """Reads of a job's files, wherever they are."""

    @property
    def where(self) -> str:
        """The machine the files are on, for messages: ``""`` for this one, else like
        ``"me@login1"``."""
        ...

    def read_many(self, wanted: Sequence[tuple[Path, int]]) -> list[bytes | None]:
        """For each ``(path, offset)``, the file's bytes from ``offset`` to its end as they
        are now; None for a file that does not exist."""
        ...

    def listdir(self, path: Path) -> list[tuple[str, bool]]:
        """``(name, is a directory)`` of each entry of ``path``; empty when it is missing."""
        ...

    def size(self, path: Path) -> int | None:
        """The size of ``path`` in bytes, None when it does not exist."""
        ...


class LocalFiles:
    """:class:`Files` on this machine's file system."""

    where = ""

    def read_many(self, wanted: Sequence[tuple[Path, int]]) -> list[bytes | None]:
        return [read_from(path, offset) for path, offset in wanted]

    def listdir(self, path: Path) -> list[tuple[str, bool]]:
        try:
            with os.scandir(path) as entries:
                return [(e.name, e.is_dir()) for e in entries]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def size(self, path: Path) -> int | None:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return None


def read_from(path: Path, offset: int, limit: int = -1) -> bytes | None:
    """The bytes of ``path`` from ``offset`` (at most ``limit``; -1: to its end), None when
    it does not exist."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit)
    except FileNotFoundError:
        return None


LOCAL = LocalFiles()
"""This machine's files (what a job loaded from a directory reads)."""
