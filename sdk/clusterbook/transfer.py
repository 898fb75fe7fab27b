"""Files between the head and nodes that share no filesystem: what to send, where results land.

``Cluster.put(paths)`` sends files and directories to the same absolute paths on every node
(the paths a job's command line names are the head's); ``Cluster.gather(directory)`` moves
the files ranks wrote in a directory on the nodes to that directory on the head. The node side
is the ``put`` and ``gather`` node tasks; this module is the head's side.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from clusterbook.errors import ConfigError

__all__ = ["Outgoing", "outgoing", "store_gathered"]


@dataclass(frozen=True, slots=True)
class Outgoing:
    """What ``put`` sends: directories to make and files (path -> (octal mode, bytes))."""

    dirs: tuple[str, ...]
    files: Mapping[str, tuple[str, bytes]]


def outgoing(paths: Iterable[str | os.PathLike[str]]) -> Outgoing:
    """Files and directories to send, by absolute path; directories with all they hold
    (symbolic links to directories are not followed)."""
    dirs: list[str] = []
    files: dict[str, tuple[str, bytes]] = {}

    def add_file(path: Path) -> None:
        files[str(path)] = (format(path.stat().st_mode & 0o777, "o"), path.read_bytes())

    for given in paths:
        if not isinstance(given, (str, os.PathLike)):
            raise ConfigError(f"put() takes paths of files or directories, not {given!r}.")
        path = Path(given).expanduser().absolute()
        if path.is_file():
            add_file(path)
        elif path.is_dir():
            for top, subdirs, names in os.walk(path):
                dirs.append(top)
                subdirs.sort()
                for name in sorted(names):
                    if (Path(top) / name).is_file():
                        add_file(Path(top) / name)
        else:
            raise ConfigError(
                f"put(): {str(given)!r} is not a file or directory on this machine ({path}); "
                "give the path of something that exists here."
            )
    return Outgoing(tuple(dirs), files)


def store_gathered(directory: Path, by_node: Mapping[str, Mapping[str, bytes]]) -> list[Path]:
    """Write the files the nodes handed over into ``directory`` (0600, never over a file that
    is there: a name two nodes sent gets the second one's host appended). Returns the paths."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    stored = []
    for host, files in by_node.items():
        for name, data in files.items():
            if "/" in name or name in ("", ".", ".."):
                raise ConfigError(f"{host} sent a file named {name!r}; it was not stored.")
            for candidate in (name, f"{name}.from-{host}"):
                try:
                    fd = os.open(directory / candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    continue
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                stored.append(directory / candidate)
                break
            else:
                raise ConfigError(
                    f"{host} sent {name!r}, but {directory} already has both {name!r} and "
                    f"{name + '.from-' + host!r}; move them away and gather again."
                )
    return stored
