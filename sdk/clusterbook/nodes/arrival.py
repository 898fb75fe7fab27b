"""How a file that arrives from a node is stored here (``gather()``): under its name, never
over a file that is there, and never in part."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.nodes.tasks.files import MAX_DEPTH

__all__ = ["Arrival"]

_WRITE_AT = 8 << 20  # an arriving file is written in pieces of this size


class Arrival:
    """A file coming from ``host`` into ``directory`` (``name`` may go down into directories
    there: ``sub/file``): written to a private temp file, then given its name, never over a
    file that is there (a name another node sent first gets ``.from-HOST`` appended). A file
    that cannot be written whole (a full disk) leaves nothing here: its temp file is removed,
    and the error names it."""

    def __init__(self, directory: Path, name: str, host: str) -> None:
        parts = name.split("/")
        if len(parts) > MAX_DEPTH or any(not p or p.startswith(".") for p in parts):
            raise ConfigError(f"{host} sent a file named {name!r}; it was not stored.")
        self.directory, self.name, self.host = directory, name, host
        self._dir = directory.joinpath(*parts[:-1])
        self._base = parts[-1]
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._tmp = self._dir / f".{self._base}.cb-from-{host}"
        self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._pending: list[bytes] = []
        self._size = 0

    def write(self, data: bytes) -> None:
        self._pending.append(data)
        self._size += len(data)
        if self._size >= _WRITE_AT:
            self._flush()

    def _flush(self) -> None:
        # Few large writes: each one may wait for the GIL behind paramiko's thread after.
        pending, self._pending, self._size = self._pending, [], 0
        try:
            while pending:
                done = os.writev(self._fd, pending)
                while pending and done >= len(pending[0]):
                    done -= len(pending.pop(0))
                if done:
                    pending[0] = pending[0][done:]
        except OSError as exc:
            self.abandon()
            raise self._not_stored(exc) from exc

    def _not_stored(self, exc: OSError) -> ClusterError:
        reason = (exc.strerror or str(exc)).lower()
        fix = "free space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "make it writable"
        return ClusterError(
            f"{self.name} from {self.host} could not be stored in {self._dir}: {reason}; "
            f"nothing of it was kept here, and {self.host} still has it ({fix} there, then "
            "gather again)."
        )

    def finish(self) -> Path:
        """The file under its name; raise if it cannot be written whole (nothing of it is
        kept), or if both names are taken (the temp file is kept)."""
        self._flush()
        os.close(self._fd)
        self._fd = -1
        for candidate in (self._base, f"{self._base}.from-{self.host}"):
            try:
                os.link(self._tmp, self._dir / candidate)  # fails if the name is taken
            except FileExistsError:
                continue
            self._tmp.unlink()
            return self._dir / candidate
        raise ConfigError(
            f"{self.host} sent {self.name!r}, but {self.directory} already has both "
            f"{self.name!r} and {self.name + '.from-' + self.host!r}; it is in {self._tmp}."
        )

    def abandon(self) -> None:
        """Drop what arrived so far (the node still has the file). Safe to call again."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._tmp.unlink(missing_ok=True)
