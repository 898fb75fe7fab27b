"""What ``put()`` sends: the files and directories under the paths given, by absolute path
(the same on the nodes), each file's mode, size and sha256 (computed once, and only when a
node has a file of that size there), and the pieces a file goes in."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from clusterbook.errors import ConfigError
from clusterbook.nodes.tasks.files import FRAME_DATA

__all__ = ["CHUNK", "Digests", "OutFile", "Outgoing", "outgoing", "pieces", "sha256_of"]

#: Bytes per piece of a file on the wire (the payload of one data frame).
CHUNK = FRAME_DATA


@dataclass(frozen=True, slots=True)
class OutFile:
    """A file to send: its absolute path on the nodes, mode, size and sha256 (""
    until a node has a file of that size there: see :func:`outgoing`), and where it is read
    here when that is another path (``put(dest=)``, ``write()``; "": at ``path``)."""

    path: str
    mode: str
    size: int
    digest: str
    source: str = ""

    @property
    def here(self) -> str:
        """Where the file is read on this machine."""
        return self.source or self.path


@dataclass(frozen=True, slots=True)
class Outgoing:
    """What ``put`` sends: directories to make, and files."""

    dirs: tuple[str, ...]
    files: tuple[OutFile, ...]

    @property
    def relocated(self) -> bool:
        """Whether a file goes to another path than its own (then nodes that share this
        machine's files need it too)."""
        return any(f.source for f in self.files)


def outgoing(
    paths: Iterable[str | os.PathLike[str]],
    *,
    digests: bool = True,
    place: Callable[[Path], str] | None = None,
) -> Outgoing:
    """Files and directories to send, by absolute path; directories with all they hold
    (symbolic links to directories are not followed). Without ``digests``, the sha256 of a
    file is left for :func:`send` to compute if a node has a file of its size. ``place``:
    the path on the nodes of each path given (default: its own)."""
    dirs: list[str] = []
    files: dict[str, OutFile] = {}

    def add_file(path: Path, there: str) -> None:
        info = path.stat()
        digest = sha256_of(str(path)) if digests else ""
        mode = format(info.st_mode & 0o777, "o")
        source = str(path) if there != str(path) else ""
        files[there] = OutFile(there, mode, info.st_size, digest, source)

    for given in paths:
        if not isinstance(given, (str, os.PathLike)):
            raise ConfigError(f"put() takes paths of files or directories, not {given!r}.")
        path = Path(given).expanduser().absolute()
        there = str(path) if place is None else place(path)

        def at(p: str, top: str = str(path), there: str = there) -> str:
            return there + p[len(top) :]

        if path.is_file():
            add_file(path, there)
        elif path.is_dir():
            for top, subdirs, names in os.walk(path):
                dirs.append(at(top))
                subdirs.sort()
                for name in sorted(names):
                    if (Path(top) / name).is_file():
                        add_file(Path(top) / name, at(os.path.join(top, name)))
        else:
            raise ConfigError(
                f"put(): {str(given)!r} is not a file or directory on this machine ({path}); "
                "give the path of something that exists here."
            )
    return Outgoing(tuple(dirs), tuple(files.values()))


def sha256_of(path: str) -> str:
    """The sha256 of the file at ``path``, in hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class Digests:
    """The sha256 of files to send, each computed once, when a node first asks (by the
    threads that send to each node)."""

    def __init__(self) -> None:
        self._known: dict[str, str] = {}
        self._lock = threading.Lock()

    def of(self, file: OutFile) -> str:
        if file.digest:
            return file.digest
        with self._lock:  # the others wait for it rather than read the file too
            if file.path not in self._known:
                self._known[file.path] = sha256_of(file.here)
            return self._known[file.path]


def pieces(file: OutFile, size: int = CHUNK) -> Iterator[tuple[int, bytes, bool]]:
    """``(offset, data, last)`` for each piece of ``file`` (one empty piece for an empty
    file). The file must still have the size it had in :func:`outgoing`."""
    with open(file.here, "rb") as f:
        offset = 0
        while True:
            data = f.read(size)
            last = offset + len(data) >= file.size
            if len(data) < size and not last:
                raise ConfigError(f"put(): {file.here} shrank while it was being sent.")
            yield offset, data, last
            offset += len(data)
            if last:
                return
